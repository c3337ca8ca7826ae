"""Converts Hugging Face transformers' norms with jaxnorm.convert and compares each converted
layer with the PyTorch module. Run where torch and transformers are installed (neither is
a dependency of jaxnorm or of its tests):

  python tools/hf_norms_check.py [--classes] [--models] [--lookalikes]
                                 [--fixtures tests/fixtures/hf_norms.npz]

--classes: every class of the installed transformers whose name ends in RMSNorm, LayerNorm
or Norm (modeling_*.py), built with a hidden size of 16 and perturbed weights, converted
with ``from_torch(module)``: the form identified and the largest difference from the module
on an input other than the identification's probe, or the refusal's reason.

--models: tiny models built from configs with perturbed norm weights (Llama, Mistral,
Qwen2, Qwen3, Phi-3, DeepSeek-V3, OLMo, OLMo 2, Gemma, Gemma 2, Gemma 3, Cohere with its
QK-norm, T5, ViT, BERT); every norm converted in one ``norms_from_state_dict(model,
{"(.*)": r"\\1"})`` call, each compared with the torch module on the activations the model
feeds it (forward hooks), in float32 and in bfloat16.

--lookalikes: classes named like PyTorch's from other code bases (the ConvNeXt repository's
channels-first LayerNorm, gemma_pytorch's RMSNorm) and forwards replaced on the instance.

--fixtures: writes the reference outputs tests/test_torch_hf.py checks its NumPy
stand-ins and the conversion against (a few classes, their state, input and output).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import pathlib
import re
import warnings

import numpy as np
import torch
import transformers

from jaxnorm import convert
from jaxnorm._convert_identify import probe_shape, run_jax

HIDDEN = 16


def _perturbed(module, seed=0):
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in module.parameters():
      p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.3)
  return module


def _build(cls):
  """An instance of ``cls`` with a hidden size of 16, from its own arguments or from its
  model's configuration (None if neither fits)."""
  attempts = [
    ((HIDDEN,), {"eps": 1e-6}),
    ((), {"eps": 1e-6}),
    ((HIDDEN,), {}),
    ((), {"hidden_size": HIDDEN}),
    ((HIDDEN, 4), {}),
  ]  # (Mamba's gated RMSNorm: hidden size, group size)
  package = importlib.import_module(cls.__module__.rsplit(".", 1)[0])
  for config_cls in [getattr(package, n) for n in dir(package) if n.endswith("Config")]:
    try:
      config = config_cls()
      config = getattr(config, "text_config", None) or config
      config.hidden_size = HIDDEN
      attempts.append(((config,), {}))
    except Exception:
      continue
  for args, kwargs in attempts:
    try:
      module = cls(*args, **kwargs)
    except Exception:
      continue
    if list(inspect.signature(module.forward).parameters)[:1]:
      return module
  return None


def _norm_classes():
  """Every ``*Norm`` class defined in the installed transformers' modeling files."""
  root = pathlib.Path(transformers.__file__).parent / "models"
  found = {}
  for path in sorted(root.glob("*/modeling_*.py")):
    name = f"transformers.models.{path.parent.name}.{path.stem}"
    names = re.findall(r"^class (\w+(?:RMSNorm|LayerNorm|Norm)\w*)\(", path.read_text(), re.M)
    if not names:
      continue
    try:
      module = importlib.import_module(name)
    except Exception:
      continue
    for n in names:
      cls = getattr(module, n, None)
      if inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and cls.__name__ not in found:
        found[cls.__name__] = cls
  return found


def _difference(module, layer):
  """Largest relative difference on an input of scale 2 and mean 0.5 (not the probe)."""
  arrays = {k: v.detach().float().numpy() for k, v in module.state_dict().items()}
  trailing = layer.module in ("LayerNorm", "RMSNorm") and "channels" not in (layer.identified or "")
  kind = "LayerNorm" if trailing else layer.module + "2d"
  given = getattr(module, "normalized_shape", None) or (HIDDEN,)
  spatial = 1 if "NCL" in (layer.identified or "") else 2
  shape = probe_shape(kind, arrays, {"normalized_shape": given, "spatial": spatial})
  x = np.random.default_rng(1).normal(0.5, 2.0, (3, *shape[1:])).astype(np.float32)
  with torch.no_grad():
    want = module(torch.from_numpy(x)).float().numpy()
  got = run_jax(layer, x, np.float32, False)
  return float(np.abs(got - want).max() / np.abs(want).max())


def check_classes():
  classes = _norm_classes()
  outcome = collections.Counter()
  for name, cls in sorted(classes.items()):
    module = _build(cls)
    if module is None:
      outcome["not built"] += 1
      print(f"{name:40s} not built with a hidden size alone (takes a config)")
      continue
    _perturbed(module)
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = convert.from_torch(module)
    except ValueError as error:
      outcome["refused"] += 1
      reason = str(error).split(". Where you know")[0].split("): ", 1)[-1]
      print(f"{name:40s} refused: {reason[:160]}")
      continue
    diff = _difference(module, layer)
    outcome["converted" if diff < 1e-4 else "WRONG"] += 1
    print(f"{name:40s} {layer.identified or layer.module}; max rel diff {diff:.1e}")
  print(dict(outcome), f"of {len(classes)} classes")


def _configs():
  t = transformers
  common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)  # fmt: skip
  vit = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             image_size=16, patch_size=8)  # fmt: skip
  bert = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64)  # fmt: skip
  t5 = dict(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
  return {
    "Llama": (t.LlamaConfig(**common), t.LlamaForCausalLM, "ids"),
    "Mistral": (t.MistralConfig(**common), t.MistralForCausalLM, "ids"),
    "Qwen2": (t.Qwen2Config(**common), t.Qwen2ForCausalLM, "ids"),
    "Qwen3": (t.Qwen3Config(**common), t.Qwen3ForCausalLM, "ids"),
    "Phi3": (t.Phi3Config(**common), t.Phi3ForCausalLM, "ids"),
    "DeepseekV3": (
      t.DeepseekV3Config(
        **{**common, "num_key_value_heads": 4},
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
      ),
      t.DeepseekV3ForCausalLM,
      "ids",
    ),  # fmt: skip
    "Olmo": (t.OlmoConfig(**common), t.OlmoForCausalLM, "ids"),
    "Olmo2": (t.Olmo2Config(**common), t.Olmo2ForCausalLM, "ids"),
    "Gemma": (t.GemmaConfig(**common), t.GemmaForCausalLM, "ids"),
    "Gemma2": (t.Gemma2Config(**common), t.Gemma2ForCausalLM, "ids"),
    "Gemma3": (t.Gemma3TextConfig(**common), t.Gemma3ForCausalLM, "ids"),
    "Cohere": (t.CohereConfig(**common, use_qk_norm=True), t.CohereForCausalLM, "ids"),
    "T5": (t.T5Config(**t5), t.T5EncoderModel, "ids"),
    "ViT": (t.ViTConfig(**vit), t.ViTModel, "pixels"),
    "BERT": (t.BertConfig(**bert), t.BertModel, "ids"),
  }


def _norm_inputs(model, inputs, names):
  """Each converted norm's input in one forward pass (by module name)."""
  seen, hooks = {}, []
  modules = dict(model.named_modules())
  by_module = {modules[name]: name for name in names}

  def keep(module, args, output):  # (returns None: the output passes on unchanged)
    seen[by_module[module]] = args[0].detach().clone()

  hooks += [m.register_forward_hook(keep) for m in by_module]
  with torch.no_grad():
    model(**inputs)
  for h in hooks:
    h.remove()
  return seen


def check_models():
  torch.manual_seed(0)
  for name, (config, cls, feed) in _configs().items():
    for dtype in (torch.float32, torch.bfloat16):
      model = cls(config).eval()
      with torch.no_grad():
        for n, p in model.named_parameters():
          if "norm" in n.lower() or "ln" in n.lower():
            p.add_(torch.randn_like(p) * 0.3)
      model = model.to(dtype)
      with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
      norms = [n for n, m in model.named_modules() if re.search("norm", type(m).__name__, re.I)]
      if feed == "pixels":
        inputs = {"pixel_values": torch.randn(2, 3, 16, 16, dtype=dtype)}
      else:
        inputs = {"input_ids": torch.randint(0, 64, (2, 7))}
      xs = _norm_inputs(model, inputs, list(layers))
      worst = 0.0
      modules = dict(model.named_modules())
      for path, layer in layers.items():
        x = xs[path]
        with torch.no_grad():
          want = modules[path](x).float().numpy()
        x_np = x.float().numpy()
        got = run_jax(layer, x_np, layer.kwargs.get("param_dtype", np.float32), False)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
      forms = collections.Counter(layer.identified or layer.module for layer in layers.values())
      left = [n for n in norms if n not in layers]
      print(f"{name:10s} {str(dtype)[6:]:8s} {len(layers)}/{len(norms)} norms converted, "
            f"worst max|Δ|/max|y| on the model's activations {worst:.1e}; "
            f"warnings {len(seen)}; not converted {left}; forms {dict(forms)}")  # fmt: skip


class ConvNextRepoLayerNorm(torch.nn.Module):
  """The ConvNeXt reference repository's LayerNorm (copied into ConvNeXt-V2, InternImage and
  many detection repositories), as its README describes it: channels_last over the last
  axis, channels_first over axis 1 of NCHW. Named LayerNorm, like PyTorch's."""

  def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
    super().__init__()
    self.weight = torch.nn.Parameter(torch.ones(normalized_shape))
    self.bias = torch.nn.Parameter(torch.zeros(normalized_shape))
    self.eps, self.data_format = eps, data_format
    self.normalized_shape = (normalized_shape,)

  def forward(self, x):
    if self.data_format == "channels_last":
      return torch.nn.functional.layer_norm(
        x, self.normalized_shape, self.weight, self.bias, self.eps
      )
    mean = x.mean(1, keepdim=True)
    var = (x - mean).pow(2).mean(1, keepdim=True)
    x = (x - mean) / torch.sqrt(var + self.eps)
    return self.weight[:, None, None] * x + self.bias[:, None, None]


ConvNextRepoLayerNorm.__name__ = ConvNextRepoLayerNorm.__qualname__ = "LayerNorm"


class GemmaPytorchRMSNorm(torch.nn.Module):
  """google/gemma_pytorch's RMSNorm: x·(1 + w) with add_unit_offset (its default), w = 0
  at initialization. Named RMSNorm, like PyTorch's."""

  def __init__(self, dim, eps=1e-6, add_unit_offset=True):
    super().__init__()
    self.eps, self.add_unit_offset = eps, add_unit_offset
    self.weight = torch.nn.Parameter(torch.zeros(dim))

  def forward(self, x):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
    return (y * (1 + self.weight.float()) if self.add_unit_offset else y * self.weight).type_as(x)


GemmaPytorchRMSNorm.__name__ = GemmaPytorchRMSNorm.__qualname__ = "RMSNorm"


def check_lookalikes():
  """The issue's D21 and D24: each converts as what it computes (or is refused), never as
  its name says."""
  c = 8
  square = torch.randn(2, c, 5, c) * 0.1 + 1  # NCHW with W == C
  cases = {
    "ConvNeXt repo LayerNorm, channels_first": (
      _perturbed(ConvNextRepoLayerNorm(c, data_format="channels_first")), square),
    "ConvNeXt repo LayerNorm, channels_last": (
      _perturbed(ConvNextRepoLayerNorm(c)), torch.randn(2, 5, c)),
    "gemma_pytorch RMSNorm at init": (GemmaPytorchRMSNorm(c), torch.randn(2, 5, c)),
    "gemma_pytorch RMSNorm trained": (_perturbed(GemmaPytorchRMSNorm(c)), torch.randn(2, 5, c)),
  }  # fmt: skip
  bn = _perturbed(torch.nn.BatchNorm2d(c)).eval()
  original = bn.forward
  bn.forward = lambda x: 2 * original(x)
  cases["BatchNorm2d, forward replaced on the instance"] = (bn, square)
  ln = _perturbed(torch.nn.LayerNorm(c))
  original_ln = ln.forward
  ln.forward = lambda x: original_ln(x)  # (accelerate's device_map wraps every forward so)
  cases["LayerNorm, forward wrapped on the instance"] = (ln, torch.randn(2, 5, c))
  for name, (module, x) in cases.items():
    try:
      with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        layer = convert.from_torch(module)
    except ValueError as error:
      print(f"{name:48s} refused: {str(error)[:200]}")
      continue
    with torch.no_grad():
      want = module(x).numpy()
    got = run_jax(layer, x.numpy(), np.float32, False)
    diff = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"{name:48s} {layer.identified}; max|Δ|/max|y| {diff:.1e}; {len(seen)} warning(s)")


# The classes the tests' stand-ins reproduce (tests/test_torch_hf.py): name, constructor.
FIXTURE_CLASSES = {
  "LlamaRMSNorm": lambda t: t.models.llama.modeling_llama.LlamaRMSNorm(HIDDEN, eps=1e-6),
  "GemmaRMSNorm": lambda t: t.models.gemma.modeling_gemma.GemmaRMSNorm(HIDDEN, eps=1e-6),
  "T5LayerNorm": lambda t: t.models.t5.modeling_t5.T5LayerNorm(HIDDEN, eps=1e-6),
  "CohereLayerNorm": lambda t: t.models.cohere.modeling_cohere.CohereLayerNorm((4, 8), eps=1e-5),
  "OlmoLayerNorm": lambda t: t.models.olmo.modeling_olmo.OlmoLayerNorm(HIDDEN),
}


def write_fixtures(out):
  arrays = {}
  for name, make in FIXTURE_CLASSES.items():
    module = _perturbed(make(transformers), seed=len(name))
    for k, v in module.state_dict().items():
      arrays[f"{name}/state/{k}"] = v.numpy()
    shape = (2, 3, *(module.weight.shape if hasattr(module, "weight") else (HIDDEN,)))
    x = np.random.default_rng(2).normal(0.5, 1.0, shape).astype(np.float32)
    x[1] *= 2e-3  # rows whose variance is about ε
    arrays[f"{name}/x"] = x
    with torch.no_grad():
      arrays[f"{name}/y"] = module(torch.from_numpy(x)).numpy()
  arrays["versions"] = np.array(
    f"torch {torch.__version__}, transformers {transformers.__version__}"
  )
  np.savez_compressed(out, **arrays)
  print(f"wrote {out}: {sorted(FIXTURE_CLASSES)}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--classes", action="store_true")
  parser.add_argument("--models", action="store_true")
  parser.add_argument("--lookalikes", action="store_true")
  parser.add_argument("--fixtures", default=None)
  args = parser.parse_args()
  print(f"torch {torch.__version__}, transformers {transformers.__version__}")
  if args.classes:
    check_classes()
  if args.models:
    check_models()
  if args.lookalikes:
    check_lookalikes()
  if args.fixtures:
    write_fixtures(args.fixtures)


if __name__ == "__main__":
  main()
