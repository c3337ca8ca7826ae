"""PyTorch import of whole models and of other libraries' norm classes (torchvision's
FrozenBatchNorm2d; timm's BatchNormAct2d, GroupNorm1, LayerNorm2d, RmsNorm, RmsNorm2d),
without torch: stand-ins with the same class names, base classes and what jaxnorm.convert
reads of a module (``named_modules``, ``state_dict``, own parameters, attributes). What
each converts to is checked against the float64 reference, with ε and group counts that
differ from the defaults by far more than the tolerance; what cannot be converted is an
error that names the module, never keys left silently in ``rest``."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
  ...


class GroupNorm1(GroupNorm):  # timm: GroupNorm(1, C)
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
