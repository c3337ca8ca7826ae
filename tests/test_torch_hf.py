"""PyTorch import of Hugging Face transformers' norms and of look-alikes (issue 54), without
torch: NumPy stand-ins with the classes' names, packages and constructor attributes, whose
``forward`` is each class's formula. tests/fixtures/hf_norms.npz holds transformers' own
outputs (tools/hf_norms_check.py --fixtures; torch 2.13, transformers 5.24): each stand-in
is first checked to reproduce them, then the conversion is checked against both. The
inputs' second sample has a variance about ε, so a wrong ε, centring, scale or axis
differs by 0.1 or more, far above the tolerances."""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import convert
from tests import reference as ref
from tests.test_torch_models import BatchNorm2d, Module, Sequential

HF = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "hf_norms.npz"))
RNG = np.random.default_rng(3)


class Runnable(Module):
  """A stand-in that runs: ``module(x)`` calls ``forward`` (an instance's own, if set)."""

  def __call__(self, x, *args):
    return self.forward(x, *args)


def _rms(x, eps):
  x = x.astype(np.float64)
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _centred(x, eps, axis=-1):
  x = x.astype(np.float64)
  d = x - x.mean(axis, keepdims=True)
  return d / np.sqrt((d * d).mean(axis, keepdims=True) + eps)


class LlamaRMSNorm(Runnable):  # x·w; ε in variance_epsilon
  __module__ = "transformers.models.llama.modeling_llama"

  def forward(self, x):
    return self.entries["weight"] * _rms(x, self.variance_epsilon)


class T5LayerNorm(LlamaRMSNorm):  # an RMSNorm by its maths, a LayerNorm by its name
  __module__ = "transformers.models.t5.modeling_t5"


class GemmaRMSNorm(Runnable):  # x·(1 + w); ε in eps
  __module__ = "transformers.models.gemma.modeling_gemma"

  def forward(self, x):
    return (1 + self.entries["weight"]) * _rms(x, self.eps)


class CohereLayerNorm(Runnable):  # centred, over head_dim, a weight per head
  __module__ = "transformers.models.cohere.modeling_cohere"

  def forward(self, x):
    return self.entries["weight"] * _centred(x, self.variance_epsilon)


class OlmoLayerNorm(Runnable):  # no parameters; ε = 1e-5 inside its forward
  __module__ = "transformers.models.olmo.modeling_olmo"

  def forward(self, x):
    return _centred(x, 1e-5)


class MambaRMSNormGated(Runnable):  # silu(gate) first, then RMS in groups
  __module__ = "transformers.models.mamba2.modeling_mamba2"

  def forward(self, hidden_states, gate=None):
    return self.entries["weight"] * _rms(hidden_states, self.variance_epsilon)


def _hf(name, **attributes):
  prefix = f"{name}/state/"
  entries = {k[len(prefix) :]: HF[k] for k in HF.files if k.startswith(prefix)}
  cls = {c.__name__: c for c in (LlamaRMSNorm, T5LayerNorm, GemmaRMSNorm, CohereLayerNorm,
                                 OlmoLayerNorm)}[name]  # fmt: skip
  return cls(entries, **attributes)


CASES = {  # class: (stand-in attributes, the form it is identified as)
  "LlamaRMSNorm": (dict(variance_epsilon=1e-6), "RMSNorm over the last axis, x·w, ε = 1e-06"),
  "T5LayerNorm": (dict(variance_epsilon=1e-6), "RMSNorm over the last axis, x·w, ε = 1e-06"),
  "GemmaRMSNorm": (dict(eps=1e-6), "RMSNorm over the last axis, x·(1 + w), ε = 1e-06"),
  "CohereLayerNorm": (
    dict(variance_epsilon=1e-5),
    "LayerNorm over the last axis, a weight per (4,), ε = 1e-05",
  ),
  "OlmoLayerNorm": (dict(normalized_shape=(16,)), "LayerNorm over the last axis, ε = 1e-05"),
}


def _apply(layer, x):
  return np.asarray(layer.linen().apply(layer.variables, jnp.asarray(x)), np.float64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_transformers_norms_convert_as_what_they_compute(name):
  """transformers' classes were refused ('no norm jaxnorm converts'); each is now run beside
  the forms it may compute and converted as the one that reproduces it."""
  attributes, form = CASES[name]
  module = _hf(name, **attributes)
  x, y = HF[f"{name}/x"], HF[f"{name}/y"].astype(np.float64)
  np.testing.assert_allclose(module(x), y, rtol=1e-5, atol=1e-5)  # the stand-in is faithful
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # (no look-alike warning: nothing is named like torch's)
    layer = convert.from_torch(module)
  assert layer.identified == form
  np.testing.assert_allclose(_apply(layer, x), y, rtol=1e-5, atol=1e-5)
  nnx_layer = layer.nnx(nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(nnx_layer(jnp.asarray(x))), y, rtol=1e-5, atol=1e-5)


def test_the_wrong_forms_differ_far_above_the_tolerance():
  """What the probe must tell apart, on the fixtures: Gemma's x·w instead of x·(1 + w) (the
  issue's D22, 0.57-0.96), Cohere's statistics over (heads, head_dim) instead of head_dim
  (D23, 0.25-0.58), a wrong ε."""
  gemma = _hf("GemmaRMSNorm", eps=1e-6)
  x, y = HF["GemmaRMSNorm/x"], HF["GemmaRMSNorm/y"]
  plain = convert.from_torch("RMSNorm", gemma.state_dict(), eps=1e-6)
  assert np.abs(_apply(plain, x) - y).max() > 0.3
  right = convert.from_torch("RMSNorm", gemma.state_dict(), eps=1e-6, zero_centered_scale=True)
  np.testing.assert_allclose(_apply(right, x), y, rtol=1e-5, atol=1e-5)
  wrong_eps = convert.from_torch("RMSNorm", gemma.state_dict(), eps=1e-5, zero_centered_scale=True)
  assert np.abs(_apply(wrong_eps, x) - y).max() > 0.1
  cohere = _hf("CohereLayerNorm", variance_epsilon=1e-5)
  x, y = HF["CohereLayerNorm/x"], HF["CohereLayerNorm/y"]
  whole = convert.from_torch("LayerNorm", cohere.state_dict(), eps=1e-5)
  assert np.abs(_apply(whole, x) - y).max() > 0.1
  per_head = convert.from_torch("LayerNorm", cohere.state_dict(), eps=1e-5, normalized_shape=(8,))
  np.testing.assert_allclose(_apply(per_head, x), y, rtol=1e-5, atol=1e-5)
  assert per_head.kwargs["reduction_axes"] == (-1,) and per_head.kwargs["feature_axes"] == (-2, -1)


def test_state_dict_form_options_are_checked():
  w = np.zeros((4, 8), np.float32)
  with pytest.raises(ValueError, match=r"zero_centered_scale=True .* RMSNorm option; got it for"):
    convert.from_torch("LayerNorm", {"weight": w}, zero_centered_scale=True)
  with pytest.raises(
    ValueError, match=r"weight has shape \(4, 8\), but normalized_shape is \(4,\)"
  ):
    convert.from_torch("LayerNorm", {"weight": w}, normalized_shape=(4,))


def _llm():
  """A decoder in miniature with one norm of each kind, named as transformers names them."""
  layer = Sequential(children={
    "input_layernorm": _hf("LlamaRMSNorm", variance_epsilon=1e-6),
    "self_attn": Sequential(children={
      "q_proj": Module({"weight": np.ones((32, 16), np.float32)}),
      "q_norm": _hf("CohereLayerNorm", variance_epsilon=1e-5),
    }),
    "post_attention_layernorm": _hf("GemmaRMSNorm", eps=1e-6),
    "post_feedforward_layernorm": _hf("OlmoLayerNorm", normalized_shape=(16,)),
  })  # fmt: skip
  return Sequential(children={"model": Sequential(children={"layers": Sequential(children={
    "0": layer})})})  # fmt: skip


def test_a_transformers_model_converts_every_norm_in_one_call():
  """On LlamaForCausalLM, Gemma2 and Qwen3 the model form raised on the first norm; the
  parameterless OlmoLayerNorm was skipped without being listed."""
  model = _llm()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    variables, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  pre = "model.layers.0."
  assert sorted(layers) == sorted(pre + n for n in ("input_layernorm", "self_attn.q_norm",
    "post_attention_layernorm", "post_feedforward_layernorm"))  # fmt: skip
  assert rest == [pre + "self_attn.q_proj.weight"]
  assert layers[pre + "post_attention_layernorm"].kwargs["zero_centered_scale"] is True
  assert variables["params"][pre + "self_attn.q_norm"]["scale"].shape == (4, 8)
  x = HF["GemmaRMSNorm/x"]
  np.testing.assert_allclose(_apply(layers[pre + "post_attention_layernorm"], x),
                             HF["GemmaRMSNorm/y"], rtol=1e-5, atol=1e-5)  # fmt: skip


def test_mambas_gated_norm_is_refused_naming_the_gate():
  w = RNG.normal(1, 0.3, 16).astype(np.float32)
  module = MambaRMSNormGated({"weight": w}, variance_epsilon=1e-6, group_size=4)
  with pytest.raises(ValueError, match=r"MambaRMSNormGated .*takes \['gate'\] besides the input"):
    convert.from_torch(module)
  model = Sequential(children={"mixer": Sequential(children={"norm": module})})
  with pytest.raises(ValueError, match=r"'mixer.norm' .*gate.*skip=\['mixer.norm'\]"):
    convert.norms_from_state_dict(model, {r"(.*)": r"\1"})


# Look-alikes: classes named like PyTorch's, from other code bases (the D21).

SQUARE = RNG.normal(1.0, 2e-3, (2, 6, 3, 6)).astype(np.float32)  # NCHW, W == C, variance ~ ε


class ConvNextLayerNorm(Runnable):  # the ConvNeXt repository's, data_format="channels_first"
  __module__ = "models.convnext"

  def forward(self, x):
    w, b = (self.entries[k].reshape(-1, 1, 1) for k in ("weight", "bias"))
    return w * _centred(x, self.eps, axis=1) + b


ConvNextLayerNorm.__name__ = "LayerNorm"


class GemmaPytorchRMSNorm(Runnable):  # google/gemma_pytorch's: x·(1 + w), w = 0 at init
  __module__ = "gemma.model"

  def forward(self, x):
    return (1 + self.entries["weight"]) * _rms(x, self.eps)


GemmaPytorchRMSNorm.__name__ = "RMSNorm"


def test_a_lookalike_converts_as_what_it_computes_with_a_warning():
  """The ConvNeXt repository's LayerNorm on NCHW with W == C converted as torch's
  LayerNorm, 0.78 off; gemma_pytorch's RMSNorm at initialization gave all zeros."""
  w, b = RNG.normal(1, 0.3, 6).astype(np.float32), RNG.normal(0, 0.3, 6).astype(np.float32)
  convnext = ConvNextLayerNorm({"weight": w, "bias": b}, eps=1e-6, normalized_shape=(6,))
  with pytest.warns(UserWarning, match=r"LayerNorm from 'models.convnext'.*over the channels"):
    layer = convert.from_torch(convnext)
  expected = ref.layer_norm(SQUARE, w, b, 1, 1, eps=1e-6)
  np.testing.assert_allclose(_apply(layer, SQUARE), expected, atol=1e-4)
  trailing = ref.layer_norm(SQUARE, w, b, -1, -1, eps=1e-6)
  assert np.abs(trailing - expected).max() > 0.5  # (the conversion by name)
  gemma = GemmaPytorchRMSNorm({"weight": np.zeros(6, np.float32)}, eps=1e-6)
  x = RNG.normal(0.5, 1.0, (2, 3, 6)).astype(np.float32)
  with pytest.warns(UserWarning, match=r"RMSNorm from 'gemma.model'.*x·\(1 \+ w\)"):
    layer = convert.from_torch(gemma)
  np.testing.assert_allclose(_apply(layer, x), ref.rms_norm(x, eps=1e-6), atol=1e-5)
  model = Sequential(children={"a": convnext, "b": gemma})
  with pytest.warns(UserWarning, match=r"2 module\(s\) named like a norm") as seen:
    _, layers, _ = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  assert len(seen) == 1 and sorted(layers) == ["a", "b"]


def test_a_lookalike_that_cannot_be_run_is_refused():
  class LayerNorm(Module):  # a user's class, not PyTorch's; no forward to run
    __module__ = "mylib.layers"

  with pytest.raises(ValueError, match=r"LayerNorm from 'mylib.layers', not PyTorch's.*only by"):
    convert.from_torch(LayerNorm({"weight": np.ones(4)}, eps=1e-6))


def _bn():
  e = {"weight": RNG.normal(1, 0.3, 6), "bias": RNG.normal(0, 0.3, 6),
       "running_mean": RNG.normal(1, 0.01, 6),
       "running_var": RNG.uniform(1e-6, 4e-6, 6)}  # fmt: skip
  bn = BatchNorm2d({k: v.astype(np.float32) for k, v in e.items()}, eps=1e-5, momentum=0.1)
  bn.__class__ = type(
    "BatchNorm2d", (BatchNorm2d, Runnable), {"__module__": BatchNorm2d.__module__}
  )
  return bn, e


def test_a_forward_replaced_on_the_instance_is_run_not_trusted():
  """``bn.forward = lambda x: 2 * f(x)`` converted as the class (0.50 off); a forward that
  wraps the original (accelerate's device_map hooks do) computes the class's maths."""
  bn, e = _bn()
  eval_bn = lambda x: ref.batch_norm_eval(x, e["running_mean"], e["running_var"], e["weight"],  # noqa: E731
                                          e["bias"], axis=1, eps=1e-5)  # fmt: skip
  bn.forward = lambda x: 2 * eval_bn(x)
  with pytest.raises(ValueError, match=r"forward is replaced on the instance.*BatchNorm2d, as its"):
    convert.from_torch(bn)
  bn.forward = eval_bn
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # (it computes what its name says: no warning)
    layer = convert.from_torch(bn)
  assert layer.module == "BatchNorm" and layer.identified == "BatchNorm2d, as its class name says"
  x = RNG.normal(1, 2e-3, (2, 6, 3, 5)).astype(np.float32)
  y = layer.linen().apply(layer.variables, jnp.asarray(x), use_running_average=True)
  np.testing.assert_allclose(np.asarray(y, np.float64), eval_bn(x), atol=1e-3)


# Rough edges (R10-R12).


def test_bfloat16_weights_on_float32_activations_give_float32():
  """R10: the output was bfloat16 (1.8e-3-3.5e-3 off), where PyTorch's and transformers'
  are float32: the layer's dtype is left to promotion, as theirs."""
  w = jnp.asarray(RNG.normal(1, 0.3, 16), jnp.bfloat16)
  layer = convert.from_torch("RMSNorm", {"weight": w}, eps=1e-6)
  assert "dtype" not in layer.kwargs
  x = RNG.normal(0.5, 1, (2, 16)).astype(np.float32)
  y = layer.linen().apply(layer.variables, jnp.asarray(x))
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y), ref.rms_norm(x, np.asarray(w, np.float32), eps=1e-6),
                             rtol=1e-6)  # fmt: skip
  assert layer.linen().apply(layer.variables, jnp.asarray(x, jnp.bfloat16)).dtype == jnp.bfloat16


def test_integer_weights_are_refused():
  """R12: an int8 LayerNorm weight gave an int8 output (0.18 off)."""
  with pytest.raises(ValueError, match=r"'weight' has dtype int8; .* floating-point"):
    convert.from_torch("LayerNorm", {"weight": np.ones(4, np.int8)})


class _ShardedTensor:  # a DTensor as jaxnorm reads one: detach, cpu, dtype, shape, numpy
  dtype, shape = "torch.float32", (16,)

  def detach(self):
    return self

  def cpu(self):
    return self

  def numpy(self):
    raise RuntimeError(".numpy() is not supported for tensor subclasses.")


def test_tensors_without_values_are_named_with_the_fix():
  """R11: DTensor (FSDP2) and FakeTensor weights failed with torch's own message, naming
  neither the entry nor the fix."""
  with pytest.raises(ValueError, match=r"RMSNorm's entry 'weight': a _ShardedTensor .*full_tensor"):
    convert.from_torch("RMSNorm", {"weight": _ShardedTensor()})


def test_a_flax_layer_is_no_pytorch_module():
  layer = nnx.LayerNorm(4, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match=r"got a LayerNorm from 'flax.nnx.*already a JAX layer"):
    convert.from_torch(layer)
  with pytest.raises(TypeError, match=r"a PyTorch model .* or its state_dict .*got a LayerNorm"):
    convert.norms_from_state_dict(layer, {r"(.*)": r"\1"})


def test_an_unreadable_entry_in_a_model_is_named_by_its_path():
  model = Sequential(children={"norm": _hf("LlamaRMSNorm", variance_epsilon=1e-6)})
  model.children["norm"].entries["weight"] = _ShardedTensor()
  with pytest.raises(ValueError, match=r"'norm' \(LlamaRMSNorm\)'s entry 'weight'.*full_tensor"):
    convert.norms_from_state_dict(model, {r"(.*)": r"\1"})


def test_the_probe_does_not_change_the_module():
  """Running a module to identify it leaves its parameters and mode as they were."""
  module = _hf("GemmaRMSNorm", eps=1e-6)
  before = {k: v.copy() for k, v in module.state_dict().items()}
  convert.from_torch(module)
  for k, v in module.state_dict().items():
    np.testing.assert_array_equal(v, before[k])
  assert jax.config.read("jax_enable_x64") is False


class OutsideRMSNorm(Runnable):  # x / (rms + ε): a form the probe does not try
  __module__ = "somelib.layers"

  def forward(self, x):
    x64 = x.astype(np.float64)
    return self.entries["weight"] * x64 / (np.sqrt((x64 * x64).mean(-1, keepdims=True)) + self.eps)


def test_a_norm_of_another_form_is_refused_with_what_was_tried():
  """ε outside the root moves the probe's small rows by about 5 %: near every form tried,
  reproduced by none. The refusal lists each form and the state_dict route."""
  module = OutsideRMSNorm({"weight": np.linspace(0.7, 1.3, 16, dtype=np.float32)}, eps=1e-6)
  with pytest.raises(ValueError) as raised:
    convert.from_torch(module)
  message = str(raised.value)
  assert "OutsideRMSNorm (somelib.layers): no norm jaxnorm knows by name" in message
  tried = dict(
    (form, float(diff)) for form, diff in
    __import__("re").findall(r"(RMSNorm over the last axis, x·w, ε = 1e-06): ([\d.e+-]+)", message)
  )  # fmt: skip
  assert 0.02 < tried["RMSNorm over the last axis, x·w, ε = 1e-06"] < 0.5
  assert "from_torch('LayerNorm' or 'RMSNorm', state_dict" in message
