"""PyTorch import of whole models and of other libraries' norm classes (torchvision's
FrozenBatchNorm2d; timm's BatchNormAct2d, GroupNorm1, LayerNorm2d, RmsNorm, RmsNorm2d),
without torch: stand-ins with the same class names, base classes and what jaxnorm.convert
reads of a module (``named_modules``, ``state_dict``, own parameters, attributes). What
each converts to is checked against the float64 reference, with ε and group counts that
differ from the defaults by far more than the tolerance; what cannot be converted is an
error that names the module, never keys left silently in ``rest``."""

import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import convert
from tests import reference as ref

C = 6
RNG = np.random.default_rng(0)
X = RNG.normal(2.0, 0.05, (3, C, 5, 4)).astype(np.float32)  # NCHW; variance ~ ε-sized


class Module:
  """A stand-in for ``torch.nn.Module``: its own entries (parameters), children, attributes."""

  def __init__(self, entries=None, children=(), **attributes):
    self.entries = dict(entries or {})
    self.children = dict(children)
    for name, value in {**self.children, **attributes}.items():  # (children are attributes)
      setattr(self, name, value)

  def named_modules(self, prefix="", remove_duplicate=True):
    yield prefix, self
    for name, child in self.children.items():
      yield from child.named_modules(f"{prefix}.{name}" if prefix else name, remove_duplicate)

  def state_dict(self):
    out = dict(self.entries)
    for name, child in self.children.items():
      out.update({f"{name}.{k}": v for k, v in child.state_dict().items()})
    return out

  def named_parameters(self, recurse=True):
    return iter(self.entries.items())

  def named_buffers(self, recurse=True):
    return iter(())

  def parameters(self):
    return []

  def buffers(self):
    return []


# PyTorch's classes, and other libraries' by their real names and bases.
class BatchNorm2d(Module): ...


class GroupNorm(Module): ...


class LayerNorm(Module): ...


class Conv2d(Module): ...


class Sequential(Module): ...


class SiLU(Module): ...


class Identity(Module): ...


class BatchNormAct2d(BatchNorm2d):  # timm: BatchNorm2d, then drop and act
  def forward(self, x): ...  # (its own forward: the norm, then drop and act)


class GroupNorm1(GroupNorm):  # timm: GroupNorm(1, C)
  def forward(self, x): ...  # (its own forward: fast_group_norm or F.group_norm)


class GroupNorm1NoBias(GroupNorm1):  # timm's metaformer: GroupNorm1 with bias = None
  ...


class LayerNormExp2d(LayerNorm):  # timm: nn.LayerNorm over the channels of NCHW, own forward
  def forward(self, x): ...


class DynamicTanh(Module):  # the DyT paper's class
  ...


class NormFreeBlock(Module):  # timm's NFNet block: a gain of its own, convolutions inside
  ...


class LayerNorm2d(LayerNorm):  # timm/torchvision: nn.LayerNorm over the channels of NCHW
  ...


class RmsNorm(Module):  # timm's own module, no PyTorch base
  ...


class RmsNorm2d(Module):  # timm: RMS over the channels of NCHW
  ...


class FrozenBatchNorm2d(Module):  # torchvision: buffers weight, bias, running_mean/var
  ...


class LazyBatchNorm2d(Module):  # PyTorch: a BatchNorm before its first forward pass
  ...


class UninitializedParameter:  # PyTorch's placeholder of a lazy module
  ...


class EvoNorm2dB0(Module):  # timm: a norm jaxnorm does not convert
  ...


# The stand-ins are their libraries' classes as jaxnorm.convert tells a class: by its name
# and the package that defines it (a class named like PyTorch's from elsewhere is a
# look-alike, converted only by running it).
for _cls, _package in (
  (BatchNorm2d, "torch.nn.modules.batchnorm"), (GroupNorm, "torch.nn.modules.normalization"),
  (LayerNorm, "torch.nn.modules.normalization"), (Conv2d, "torch.nn.modules.conv"),
  (Sequential, "torch.nn.modules.container"), (SiLU, "torch.nn.modules.activation"),
  (Identity, "torch.nn.modules.linear"), (BatchNormAct2d, "timm.layers.norm_act"),
  (GroupNorm1, "timm.layers.norm"), (GroupNorm1NoBias, "timm.layers.norm"),
  (LayerNormExp2d, "timm.layers.norm"), (NormFreeBlock, "timm.models.nfnet"),
  (LayerNorm2d, "timm.layers.norm"), (RmsNorm, "timm.layers.norm"),
  (RmsNorm2d, "timm.layers.norm"), (FrozenBatchNorm2d, "torchvision.ops.misc"),
  (LazyBatchNorm2d, "torch.nn.modules.batchnorm"), (EvoNorm2dB0, "timm.layers.evo_norm"),
):  # fmt: skip
  _cls.__module__ = _package


def _channels(mean=0.0, scale=1.0):
  return (RNG.normal(mean, scale, C)).astype(np.float32)


def _bn_entries():
  return {
    "weight": _channels(1, 0.3),
    "bias": _channels(0, 0.3),
    "running_mean": _channels(2, 0.02),
    "running_var": np.abs(_channels(0, 0.003)) + 1e-4,  # about ε: a wrong ε shows
    "num_batches_tracked": np.asarray(5),
  }


def _bn_act(act):
  return BatchNormAct2d(_bn_entries(), {"drop": Identity(), "act": act}, eps=1e-3,
                        momentum=0.1, affine=True, track_running_stats=True,
                        num_features=C)  # fmt: skip


def _efficientnet_like():
  """timm's EfficientNet in miniature: every norm a BatchNormAct2d (ε = 1e-3), some with
  SiLU, some with Identity (before a residual add)."""
  blocks = {}
  for i in range(3):
    blocks[str(i)] = Sequential(children={
      "conv_pw": Conv2d({"weight": np.ones((C, C, 1, 1), np.float32)}),
      "bn1": _bn_act(SiLU()),
      "conv_pwl": Conv2d({"weight": np.ones((C, C, 1, 1), np.float32)}),
      "bn2": _bn_act(Identity()),
    })  # fmt: skip
  return Sequential(children={
    "conv_stem": Conv2d({"weight": np.ones((C, 3, 3, 3), np.float32)}),
    "bn1": _bn_act(SiLU()),
    "blocks": Sequential(children=blocks),
  })  # fmt: skip


def _apply(layer, x, **kw):
  y = layer.linen().apply(layer.variables, jnp.asarray(x), **kw)
  return np.asarray(y[0] if isinstance(y, tuple) else y, np.float64)


def test_an_efficientnet_of_batchnormact_converts_every_norm_and_names_the_activations():
  model = _efficientnet_like()
  with pytest.warns(UserWarning, match=r"4 converted norm layer\(s\).*SiLU at 'bn1'") as seen:
    variables, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  assert len(seen) == 1  # one warning for the model, not one per layer
  assert sorted(layers) == ["blocks.0.bn1", "blocks.0.bn2", "blocks.1.bn1", "blocks.1.bn2",
                            "blocks.2.bn1", "blocks.2.bn2", "bn1"]  # fmt: skip
  assert rest == [k for k in model.state_dict() if "conv" in k]  # every converted key consumed
  assert layers["bn1"].activation == "SiLU" and layers["blocks.0.bn2"].activation is None
  bn = model.children["bn1"]
  layer = layers["bn1"]
  assert layer.module == "BatchNorm" and layer.kwargs["epsilon"] == 1e-3  # the module's own
  e = bn.entries
  expected = ref.batch_norm_eval(X, e["running_mean"], e["running_var"], e["weight"],
                                 e["bias"], axis=1, eps=1e-3)  # fmt: skip
  wrong = ref.batch_norm_eval(X, e["running_mean"], e["running_var"], e["weight"], e["bias"],
                              axis=1, eps=1e-5)  # fmt: skip
  assert np.abs(expected - wrong).max() > 0.1  # (ε shows far above the tolerance)
  np.testing.assert_allclose(_apply(layer, X, use_running_average=True), expected, atol=1e-4)


def test_from_torch_of_a_module_with_an_activation_warns():
  with pytest.warns(UserWarning, match="SiLU"):
    layer = convert.from_torch(_bn_act(SiLU()))
  assert layer.activation == "SiLU"
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no warning for Identity
    assert convert.from_torch(_bn_act(Identity())).activation is None


def test_torchvision_frozen_batch_norm():
  e = {k: v for k, v in _bn_entries().items() if k != "num_batches_tracked"}
  resnet = Sequential(children={
    "conv1": Conv2d({"weight": np.ones((C, 3, 7, 7), np.float32)}),
    "bn1": FrozenBatchNorm2d(e, eps=1e-5),
    "layer1": Sequential(children={"bn2": FrozenBatchNorm2d(dict(e), eps=1e-5)}),
  })  # fmt: skip
  variables, layers, rest = convert.norms_from_state_dict(resnet, {r"(.*)": r"\1"})
  assert sorted(layers) == ["bn1", "layer1.bn2"] and rest == ["conv1.weight"]
  layer = layers["bn1"]
  assert layer.module == "FrozenBatchNorm" and sorted(layer.variables) == ["batch_stats", "params"]
  expected = ref.batch_norm_eval(X, e["running_mean"], e["running_var"], e["weight"],
                                 e["bias"], axis=1, eps=1e-5)  # fmt: skip
  np.testing.assert_allclose(_apply(layer, X), expected, atol=1e-4)
  import flax.nnx as nnx

  module = layer.nnx(nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(module(jnp.asarray(X)), np.float64), expected, atol=1e-4)
  with pytest.raises(ValueError, match=r"lacks \['running_var'\]"):
    convert.from_torch("FrozenBatchNorm2d", {k: v for k, v in e.items() if k != "running_var"})


def test_timm_group_layer_and_rms_norms():
  w, b = _channels(1, 0.3), _channels(0, 0.3)
  cases = {
    "gn1": (GroupNorm1({"weight": w, "bias": b}, num_groups=1, num_channels=C, eps=1e-5,
                       affine=True),
            ref.group_norm(X, 1, w, b, channel_axis=1, eps=1e-5)),
    "ln2d": (LayerNorm2d({"weight": w, "bias": b}, normalized_shape=(C,), eps=1e-6,
                         elementwise_affine=True),
             ref.layer_norm(X, w, b, reduction_axes=1, feature_axes=1, eps=1e-6)),
    "rms2d": (RmsNorm2d({"weight": w}, normalized_shape=(C,), eps=1e-6, elementwise_affine=True),
              ref.rms_norm(X, w, axes=1, eps=1e-6)),
    "rms": (RmsNorm({"weight": w[:4]}, normalized_shape=(4,), eps=1e-6, elementwise_affine=True),
            ref.rms_norm(X, w[:4], axes=-1, eps=1e-6)),
  }  # fmt: skip
  model = Sequential(children={name: module for name, (module, _) in cases.items()})
  _, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"norms/\1"})
  assert sorted(layers) == [f"norms/{n}" for n in sorted(cases)] and rest == []
  assert layers["norms/gn1"].kwargs["num_groups"] == 1
  assert layers["norms/rms2d"].module == "RMSNorm" and layers["norms/ln2d"].module == "LayerNorm"
  for name, (_, expected) in cases.items():
    np.testing.assert_allclose(
      _apply(layers[f"norms/{name}"], X), expected, atol=1e-4, err_msg=name
    )


def test_a_norm_that_cannot_be_converted_is_an_error_unless_skipped():
  evo = EvoNorm2dB0({"weight": np.ones(C), "bias": np.zeros(C), "running_var": np.ones(C)})
  model = Sequential(children={"conv": Conv2d({"weight": np.ones((C, C, 1, 1))}), "norm": evo})
  with pytest.raises(ValueError, match=r"'norm' is a EvoNorm2dB0.*skip=\['norm'\]"):
    convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  with pytest.raises(ValueError, match=r"'conv' is a Conv2d, but rule 'conv' says BatchNorm2d"):
    convert.norms_from_state_dict(model, {"conv": ("BatchNorm2d", "bn")})  # (no norm at all)
  with pytest.warns(UserWarning, match=r"rule\(s\) \['\(\.\*\)'\] matched no norm"):
    _, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"}, skip=["norm"])
  assert layers == {} and rest == ["conv.weight", "norm.weight", "norm.bias", "norm.running_var"]
  lazy = LazyBatchNorm2d({"weight": UninitializedParameter(), "bias": UninitializedParameter()})
  with pytest.raises(ValueError, match="'bn' is an uninitialised lazy module.*forward pass"):
    convert.norms_from_state_dict(Sequential(children={"bn": lazy}), {r"(.*)": r"\1"})
  with pytest.raises(ValueError, match="uninitialised lazy module"):
    convert.from_torch(lazy)


def test_names_collisions_templates_and_a_root_norm():
  bn_a, bn_b = BatchNorm2d(_bn_entries(), eps=1e-5), BatchNorm2d(_bn_entries(), eps=1e-5)
  model = Sequential(children={"0": bn_a, "1": bn_b})
  with pytest.raises(ValueError, match="'0' and '1' both map to the Flax path 'bn'"):
    convert.norms_from_state_dict(model, {r"\d": "bn"})
  # The whole name is matched once (re.sub gave 'norms/1norms/': two matches of '.*').
  _, layers, _ = convert.norms_from_state_dict(model, {r"(.*)": r"norms/\1"})
  assert sorted(layers) == ["norms/0", "norms/1"]
  # A norm that is the whole model (name ''): its keys are consumed too.
  _, layers, rest = convert.norms_from_state_dict(bn_a, {r"(.*)": r"bn"})
  assert list(layers) == ["bn"] and rest == []
  sd = {f"{k}": v for k, v in bn_a.state_dict().items()}
  _, layers, rest = convert.norms_from_state_dict(sd, {r"": ("BatchNorm2d", "bn")})
  assert list(layers) == ["bn"] and rest == []


def test_a_class_is_not_a_module():
  with pytest.raises(TypeError, match="an instance.*got the class BatchNorm2d itself"):
    convert.from_torch(BatchNorm2d)


def test_inconsistent_running_statistics_keys_are_refused():
  """``num_batches_tracked`` without the running statistics once made a batch-statistics
  layer (evaluation off by 0.58)."""
  e = _bn_entries()
  partial = {k: e[k] for k in ("weight", "bias", "num_batches_tracked")}
  with pytest.raises(ValueError, match="'num_batches_tracked' but no 'running_mean'"):
    convert.from_torch("BatchNorm2d", partial)
  with pytest.raises(ValueError, match="'num_batches_tracked' but no 'running_mean'"):
    convert.norms_from_state_dict({f"bn.{k}": v for k, v in partial.items()},
                                  {"bn": ("BatchNorm2d", "bn")})  # fmt: skip


def test_instance_norm_with_momentum_none_leaves_its_statistics_alone():
  """PyTorch's InstanceNorm takes ``momentum=None`` as 0 (checked with torch 2.13: the
  running statistics and the counter stay as they were); jaxnorm once averaged them
  (evaluation off by 0.28 after one step)."""
  e = _bn_entries()
  layer = convert.from_torch("InstanceNorm2d", e, momentum=None, eps=1e-5)
  module, variables = layer.linen(), layer.variables
  _, updated = module.apply(variables, jnp.asarray(X), use_running_average=False,
                            mutable=["batch_stats"])  # fmt: skip
  for k in ("mean", "var"):
    np.testing.assert_array_equal(updated["batch_stats"][k], variables["batch_stats"][k])
  y = _apply(layer._replace(variables={**variables, **updated}), X, use_running_average=True)
  expected = ref.batch_norm_eval(X, e["running_mean"], e["running_var"], e["weight"],
                                 e["bias"], axis=1, eps=1e-5)  # fmt: skip
  np.testing.assert_allclose(y, expected, atol=1e-4)


def test_float64_cumulative_average_in_float64():
  """``momentum=None``'s factor ``1 − 1/(n + 1)`` in the statistics' dtype: in float32 it
  was 4e-8 off where float64 gives 4e-16."""
  with jax.enable_x64(True):
    e = {k: np.asarray(v, np.float64) for k, v in _bn_entries().items()}
    e["num_batches_tracked"] = np.asarray(123_456)
    layer = convert.from_torch("BatchNorm2d", e, momentum=None)
    x = X.astype(np.float64)
    _, updated = layer.linen().apply(layer.variables, jnp.asarray(x), use_running_average=False,
                                     mutable=["batch_stats"])  # fmt: skip
    mean = x.mean((0, 2, 3))
    n = 123_456
    expected = e["running_mean"] + (mean - e["running_mean"]) / (n + 1)
    assert updated["batch_stats"]["mean"].dtype == jnp.float64
    np.testing.assert_allclose(updated["batch_stats"]["mean"], expected, rtol=0, atol=1e-14)


# Round 5: modules that converted wrongly in silence, and rough edges (issue 44).

SQUARE = RNG.normal(2.0, 0.05, (2, C, 3, C)).astype(np.float32)  # NCHW with W == C


class MyLayerNorm(LayerNorm):  # a user's subclass that normalizes something else
  def forward(self, x): ...


class ChannelsLastBatchNorm(BatchNorm2d):
  def _forward(self, x): ...


class MyRmsNorm(RmsNorm):
  def forward(self, x): ...


def _ln_entries():
  return {"weight": _channels(1, 0.3), "bias": _channels(0, 0.3)}


def test_timm_layer_norm_exp2d_normalizes_the_channels():
  """timm's LayerNormExp2d subclasses nn.LayerNorm but normalizes the channel axis in its
  own forward: it was converted as a trailing-axis LayerNorm, 0.80 off where W == C."""
  e = _ln_entries()
  layer = convert.from_torch(LayerNormExp2d(e, eps=1e-6, normalized_shape=(C,)))
  expected = ref.layer_norm(SQUARE, e["weight"], e["bias"], 1, 1, eps=1e-6)
  np.testing.assert_allclose(_apply(layer, SQUARE), expected, atol=1e-4)


@pytest.mark.parametrize(
  "module",
  [MyLayerNorm(_ln_entries(), eps=1e-6, normalized_shape=(C,)),
   ChannelsLastBatchNorm(_bn_entries(), eps=1e-5, momentum=0.1),
   MyRmsNorm({"weight": _channels(1, 0.3)}, eps=1e-6)],
  ids=lambda m: type(m).__name__,
)  # fmt: skip
def test_a_subclass_with_its_own_forward_is_refused_by_name(module):
  """The same rule for every base: a subclass whose forward (or _forward) is its own and
  that jaxnorm does not know may compute anything; it converted as its base."""
  cls = type(module).__name__
  own = rf"the module is a {cls} \(tests.test_torch_models\): a subclass of .* defines its own"
  with pytest.raises(ValueError, match=own):
    convert.from_torch(module)
  model = Sequential(children={"block": Sequential(children={"norm": module})})
  with pytest.raises(ValueError, match=rf"'block.norm' is a {cls}.*skip=\['block.norm'\]"):
    convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  with pytest.warns(UserWarning, match="matched no norm"):
    _, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"}, skip=["block.norm"])
  assert layers == {} and len(rest) == len(module.state_dict())


def _double(module, inputs, output):
  return output * 2 + 1


def test_forward_hooks_and_pre_hooks_are_refused_by_name(monkeypatch):
  """A hook changes the module's output (a pre-hook its input): ignored, the conversion
  was 0.53 off (a pre-hook 0.32, a hook on a norm inside a model 1.01)."""
  hooked = BatchNorm2d(_bn_entries(), eps=1e-5, momentum=0.1, _forward_hooks={3: _double})
  with pytest.raises(ValueError, match=r"1 forward hook\(s\), \['_double'\].*output"):
    convert.from_torch(hooked)
  pre = GroupNorm(_ln_entries(), num_groups=2, eps=1e-5, _forward_pre_hooks={0: _double})
  with pytest.raises(ValueError, match=r"forward pre-hook\(s\).*input.*\.remove\(\)"):
    convert.from_torch(pre)
  model = Sequential(children={"conv": Conv2d({"weight": np.ones((C, C, 1, 1))}), "bn": hooked})
  with pytest.raises(ValueError, match=r"'bn' \(BatchNorm2d\) has 1 forward hook"):
    convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  # PyTorch's global hooks (register_module_forward_hook) apply to every module.
  plain = BatchNorm2d(_bn_entries(), eps=1e-5, momentum=0.1)
  convert.from_torch(plain)
  globals_ = types.SimpleNamespace(_global_forward_hooks={}, _global_forward_pre_hooks={7: _double})
  monkeypatch.setitem(sys.modules, "torch.nn.modules.module", globals_)
  with pytest.raises(ValueError, match=r"\['global _double'\]"):
    convert.from_torch(plain)


def test_a_model_without_norms_converts_nothing_and_says_so():
  """timm's NormFreeBlock (a gain of its own, "Norm" in its name, convolutions inside) was
  taken for a norm: dm_nfnet_f0 raised instead of converting nothing."""
  block = NormFreeBlock({"skipinit_gain": np.zeros(())},
                        {"conv1": Conv2d({"weight": np.ones((C, C, 1, 1))})})  # fmt: skip
  model = Sequential(children={"stages": Sequential(children={"0": block})})
  with pytest.warns(UserWarning, match=r"\['\(\.\*\)'\] matched no norm of the model"):
    variables, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  assert variables == {} and layers == {} and len(rest) == 2


def test_a_rule_that_matches_nothing_is_named():
  sd = {f"layer1.bn1.{k}": v for k, v in _bn_entries().items()}
  rules = {r"layer1\.bn1": ("BatchNorm2d", "bn1"), r"layer1\.bn2": ("BatchNorm2d", "bn2")}
  with pytest.warns(UserWarning, match=r"\['layer1\\\\.bn2'\] matched no module name"):
    _, layers, _ = convert.norms_from_state_dict(sd, rules)
  assert list(layers) == ["bn1"]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # (every rule used: no warning)
    convert.norms_from_state_dict(sd, {r"layer1\.bn1": ("BatchNorm2d", "bn1")})


def test_instance_norm_with_running_statistics_does_not_count_batches():
  """PyTorch's InstanceNorm never advances num_batches_tracked; the converted layer did
  (5 against PyTorch's 4). Its running variance is still PyTorch's unbiased one."""
  e = _bn_entries()
  e["num_batches_tracked"] = np.asarray(4)
  layer = convert.from_torch("InstanceNorm2d", e, momentum=0.1, eps=1e-5)
  _, updated = layer.linen().apply(layer.variables, jnp.asarray(X), use_running_average=False,
                                   mutable=["batch_stats"])  # fmt: skip
  assert sorted(updated["batch_stats"]) == ["mean", "var"]
  x = X.astype(np.float64)
  unbiased = x.var((2, 3), ddof=1).mean(0)
  np.testing.assert_allclose(updated["batch_stats"]["var"], 0.9 * e["running_var"] + 0.1 * unbiased,
                             rtol=1e-5)  # fmt: skip
  module = layer.nnx(nnx.Rngs(0))
  module(jnp.asarray(X), use_running_average=False)
  assert not hasattr(module, "num_batches_tracked")
  np.testing.assert_allclose(module.var[...], updated["batch_stats"]["var"], rtol=1e-6)


def test_timm_group_norm1_no_bias_converts_without_bias():
  """timm's GroupNorm1NoBias (24 of poolformerv2's 29 norms) has a weight and no bias;
  it was refused with "PyTorch saves both or neither"."""
  w = _channels(1, 0.3)
  layer = convert.from_torch(GroupNorm1NoBias({"weight": w}, num_groups=1, eps=1e-5,
                                              affine=True, num_channels=C))  # fmt: skip
  assert layer.kwargs["use_bias"] is False
  expected = ref.group_norm(X, 1, w, None, channel_axis=1, eps=1e-5)
  np.testing.assert_allclose(_apply(layer, X), expected, atol=1e-4)
  with pytest.raises(ValueError, match="has 'bias' but no 'weight'"):
    convert.from_torch("GroupNorm", {"bias": w}, num_groups=1)


def test_dyt_with_one_alpha_per_channel():
  """Some DyT ports learn one α per channel: it failed with "cannot reshape array of size
  8 into shape ()"."""
  alpha, w, b = _channels(0.5, 0.2), _channels(1, 0.3), _channels(0, 0.3)
  x = RNG.normal(0, 2, (3, 4, C)).astype(np.float32)
  layer = convert.from_torch(DynamicTanh({"alpha": alpha, "weight": w, "bias": b}))
  assert layer.kwargs["alpha_per_feature"] is True
  np.testing.assert_allclose(_apply(layer, x), ref.dyt(x, alpha, w, b), atol=1e-5)
  module = layer.nnx(nnx.Rngs(0))
  np.testing.assert_allclose(module(jnp.asarray(x)), ref.dyt(x, alpha, w, b), atol=1e-5)
  with pytest.raises(ValueError, match=r"alpha has shape \(3,\): one value, or one per feature"):
    convert.from_torch(DynamicTanh({"alpha": np.ones(3), "weight": w, "bias": b}))


class MetaTensor:  # a tensor on PyTorch's meta device: a shape, no values
  is_meta = True
  shape = (C,)


def test_a_module_on_the_meta_device_names_the_fix():
  """It failed with PyTorch's "Cannot copy out of meta tensor"."""
  bn = BatchNorm2d({**_bn_entries(), "weight": MetaTensor()}, eps=1e-5, momentum=0.1)
  with pytest.raises(ValueError, match=r"\['weight'\] on PyTorch's meta device.*to_empty"):
    convert.from_torch(bn)
  with pytest.raises(ValueError, match="meta device.*load_state_dict"):
    convert.from_torch("BatchNorm2d", {**_bn_entries(), "weight": MetaTensor()})
