"""PyTorch import against real torch and Hugging Face transformers (issue 54): tiny models
built from configs (no downloads), every norm converted in one call and compared with the
torch module on the activations the model feeds it; real look-alikes, a replaced
``forward``, Mamba's gated norm, FakeTensors and mixed dtypes.

torch and transformers are no dependency of jaxnorm or of its test extra: these tests skip
where they are missing, and CI's own step installs them (CPU torch 2.13 from the machine's
wheel, transformers 5.24) and sets JAXNORM_REQUIRE_TORCH=1, which turns the skip into a
failure."""

import os
import pathlib
import re
import warnings

import numpy as np
import pytest

if os.environ.get("JAXNORM_REQUIRE_TORCH") != "1":
  pytest.importorskip("torch", reason="PyTorch import against real torch: pip install torch")
  pytest.importorskip("transformers", reason="pip install transformers (CI's step does)")
import torch  # noqa: E402
import transformers  # noqa: E402

from jaxnorm import convert  # noqa: E402
from jaxnorm._convert_identify import run_jax  # noqa: E402

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)  # fmt: skip
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _model(name):
  t = transformers
  config, cls = {
    "Llama": (lambda: t.LlamaConfig(**COMMON), t.LlamaForCausalLM),
    "Gemma2": (lambda: t.Gemma2Config(**COMMON), t.Gemma2ForCausalLM),
    "Qwen3": (lambda: t.Qwen3Config(**COMMON), t.Qwen3ForCausalLM),
    "Cohere": (lambda: t.CohereConfig(**COMMON, use_qk_norm=True), t.CohereForCausalLM),
    "ViT": (lambda: t.ViTConfig(**SMALL, image_size=16, patch_size=8), t.ViTModel),
    "BERT": (lambda: t.BertConfig(**SMALL, vocab_size=64), t.BertModel),
  }[name]
  torch.manual_seed(0)
  model = cls(config()).eval()
  with torch.no_grad():  # weights a checkpoint would have: far from 1 (or 0 for Gemma)
    for n, p in model.named_parameters():
      if "norm" in n.lower():
        p.add_(torch.randn_like(p) * 0.3)
  return model


def _norm_inputs(model, names, inputs):
  """Each named module's input in one forward pass."""
  seen, modules = {}, dict(model.named_modules())
  by_module = {modules[n]: n for n in names}

  def keep(module, args, output):  # (returns None: the output passes on unchanged)
    seen[by_module[module]] = args[0]

  hooks = [m.register_forward_hook(keep) for m in by_module]
  with torch.no_grad():
    model(**inputs)
  for h in hooks:
    h.remove()
  return seen


@pytest.mark.parametrize("name", ["Llama", "Gemma2", "Qwen3", "Cohere", "ViT", "BERT"])
def test_a_transformers_model_converts_every_norm_in_one_call(name):
  model = _model(name)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  norms = [n for n, m in model.named_modules() if "norm" in type(m).__name__.lower()]
  assert sorted(layers) == sorted(norms) and len(norms) >= 5
  assert not [k for k in rest if "norm" in k.lower()]  # every norm entry consumed
  pixels = name == "ViT"
  inputs = {"pixel_values": torch.randn(2, 3, 16, 16)} if pixels else {
    "input_ids": torch.randint(3, 64, (2, 7))}  # fmt: skip
  xs = _norm_inputs(model, layers, inputs)
  modules = dict(model.named_modules())
  for path, layer in layers.items():
    with torch.no_grad():
      want = modules[path](xs[path]).numpy()
    got = run_jax(layer, xs[path].numpy(), np.float32, False)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), path
  if name == "Gemma2":  # x·(1 + w), w as Gemma stores it
    assert all(layer.kwargs.get("zero_centered_scale") for layer in layers.values())
  if name == "Cohere":  # QK-norm: statistics over head_dim, a weight per head
    q = layers["model.layers.0.self_attn.q_norm"]
    assert q.kwargs["reduction_axes"] == (-1,) and q.kwargs["feature_axes"] == (-2, -1)


class ConvNextRepoLayerNorm(torch.nn.Module):
  """The ConvNeXt repository's LayerNorm with data_format="channels_first" (over axis 1 of
  NCHW), named LayerNorm like PyTorch's."""

  def __init__(self, c, eps=1e-6):
    super().__init__()
    self.weight = torch.nn.Parameter(torch.randn(c) * 0.3 + 1)
    self.bias = torch.nn.Parameter(torch.randn(c) * 0.3)
    self.eps, self.normalized_shape = eps, (c,)

  def forward(self, x):
    d = x - x.mean(1, keepdim=True)
    x = d / torch.sqrt(d.pow(2).mean(1, keepdim=True) + self.eps)
    return self.weight[:, None, None] * x + self.bias[:, None, None]


class GemmaPytorchRMSNorm(torch.nn.Module):
  """google/gemma_pytorch's RMSNorm: x·(1 + w), w = 0 at initialization."""

  def __init__(self, dim, eps=1e-6):
    super().__init__()
    self.eps, self.weight = eps, torch.nn.Parameter(torch.zeros(dim))

  def forward(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


ConvNextRepoLayerNorm.__name__ = "LayerNorm"
GemmaPytorchRMSNorm.__name__ = "RMSNorm"


def test_real_lookalikes_convert_as_what_they_compute():
  """D21: 0.78 off (W == C) and all zeros at Gemma's initialization, converted by name."""
  x = torch.randn(2, 8, 5, 8) * 0.1 + 1  # NCHW with W == C
  convnext = ConvNextRepoLayerNorm(8)
  with pytest.warns(UserWarning, match=r"LayerNorm from .*over the channels"):
    layer = convert.from_torch(convnext)
  with torch.no_grad():
    want = convnext(x).numpy()
  assert np.abs(run_jax(layer, x.numpy(), np.float32, False) - want).max() < 1e-4
  gemma = GemmaPytorchRMSNorm(8)
  with pytest.warns(UserWarning, match=r"x·\(1 \+ w\)"):
    layer = convert.from_torch(gemma)
  x = torch.randn(2, 5, 8)
  got = run_jax(layer, x.numpy(), np.float32, False)
  assert np.abs(got - gemma(x).detach().numpy()).max() < 1e-5 and np.abs(got).max() > 0.5


def test_a_forward_replaced_on_a_real_instance():
  """D24: ``bn.forward = lambda x: 2 * f(x)`` converted as the class, 0.50 off."""
  bn = torch.nn.BatchNorm2d(4)
  with torch.no_grad():
    bn.running_var.uniform_(0.5, 2)
  f = bn.forward
  bn.forward = lambda x: 2 * f(x)
  with pytest.raises(ValueError, match="forward is replaced on the instance"):
    convert.from_torch(bn)
  bn.forward = lambda x: f(x)  # a wrapper that keeps the maths (accelerate's hooks)
  assert convert.from_torch(bn).module == "BatchNorm"
  assert bn.training  # (the probe ran it in evaluation mode and restored its mode)


def test_mamba2_gated_norm_is_refused_naming_the_gate():
  norm = transformers.models.mamba2.modeling_mamba2.MambaRMSNormGated(16, 4, eps=1e-6)
  with pytest.raises(ValueError, match=r"takes \['gate'\] besides the input"):
    convert.from_torch(norm)


def test_bfloat16_weights_on_float32_activations_as_torch():
  """R10: torch's RMSNorm gives float32 there; the converted layer gave bfloat16."""
  rms = torch.nn.RMSNorm(16, eps=1e-6, dtype=torch.bfloat16)
  with torch.no_grad():
    rms.weight.normal_(1, 0.3)
  layer = convert.from_torch(rms)
  x = torch.randn(2, 16)
  want = rms(x)
  got = layer.linen().apply(layer.variables, x.numpy())
  assert want.dtype == torch.float32 and got.dtype == np.float32
  assert np.abs(np.asarray(got) - want.detach().numpy()).max() < 1e-5


def test_fake_tensors_are_named_with_the_fix():
  """R11: torch's own '.numpy() is not supported for tensor subclasses', naming nothing."""
  from torch._subclasses.fake_tensor import FakeTensorMode

  with FakeTensorMode():
    ln = torch.nn.LayerNorm(8)
  with pytest.raises(ValueError, match=r"LayerNorm's entry 'weight': a FakeTensor .*full_tensor"):
    convert.from_torch(ln)


def test_the_pytorch_guides_transformers_recipe_prints_what_it_says(capsys):
  """docs/guides/pytorch.md's transformers recipe (not executed by the docs build, which
  has no torch): run here, its output is the one the page prints."""
  page = (pathlib.Path(__file__).parents[1] / "docs" / "guides" / "pytorch.md").read_text()
  section = page.split("## From Hugging Face transformers")[1]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  exec(compile(code, "pytorch.md", "exec"), {})
  printed = capsys.readouterr().out.splitlines()
  assert printed == [line[2:] for line in code.splitlines() if line.startswith("# ")]
