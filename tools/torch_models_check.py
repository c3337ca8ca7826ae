"""Converts whole torchvision and timm models' norms with jaxnorm.convert and compares every
converted layer with the PyTorch module on the module's own input, in evaluation and in
training (running statistics included). Run where torch, torchvision and timm are
installed (none is a dependency of jaxnorm or of its tests):

  python tools/torch_models_check.py

Prints, per model, how many norm modules it has, how many were converted, the activations
named, and the largest difference of any layer's output and running statistics.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import timm
import torch
import torchvision

from jaxnorm import convert


def _inputs(model, shape):
  """Each norm module's input in one forward pass of ``model`` (by module name)."""
  seen, hooks = {}, []
  for name, module in model.named_modules():
    if convert.torch_kind(module) is not None:
      # (a hook that returns a value replaces the module's output: this one returns None)
      hooks.append(module.register_forward_hook(lambda m, a, o, n=name: seen.update({n: a[0]})))
  with torch.no_grad():
    model(torch.randn(shape))
  for h in hooks:
    h.remove()
  return seen


def _norm_only(module, x, train):
  """The module's output without what it carries after the norm (timm's act/drop), in
  training or evaluation mode."""
  carried = {k: getattr(module, k) for k in ("act", "drop") if hasattr(module, k)}
  for k in carried:
    setattr(module, k, torch.nn.Identity())
  module.train(train)
  with torch.no_grad():
    out = module(x)
  module.eval()
  for k, v in carried.items():
    setattr(module, k, v)
  return out.numpy()


def _diff(got, expected):
  """The largest difference, relative to the larger of 1 and the largest |expected|."""
  expected = np.asarray(expected)
  return float(np.abs(np.asarray(got) - expected).max() / max(1.0, np.abs(expected).max()))


def check(name, model, shape):
  model.eval()
  norms = {n: m for n, m in model.named_modules() if convert.torch_kind(m) is not None}
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _, layers, rest = convert.norms_from_state_dict(model, {r"(.*)": r"\1"})
  carried = sorted({layer.activation for layer in layers.values() if layer.activation})
  inputs = _inputs(model, shape)
  worst = 0.0
  for path, layer in layers.items():
    module, x = norms[path], inputs[path].detach()
    xj = jnp.asarray(x.numpy())
    if "batch_stats" not in layer.variables or layer.module == "FrozenBatchNorm":
      y = layer.linen().apply(layer.variables, xj)
      worst = max(worst, _diff(y, _norm_only(module, x, False)))
      continue
    y = layer.linen().apply(layer.variables, xj, use_running_average=True)
    worst = max(worst, _diff(y, _norm_only(module, x, False)))
    y, upd = layer.linen().apply(layer.variables, xj, use_running_average=False,
                                 mutable=["batch_stats"])  # fmt: skip
    worst = max(worst, _diff(y, _norm_only(module, x, True)))
    for k in ("mean", "var"):  # (the PyTorch module's after its training step)
      got = np.asarray(upd["batch_stats"][k])
      worst = max(worst, _diff(got, getattr(module, f"running_{k}").numpy()))
  print(f"{name}: {len(layers)} of {len(norms)} norms converted, rest {len(rest)} keys, "
        f"activations named {carried}, warnings {len(caught)}, "
        f"largest difference {worst:.1e} (relative to max(1, |PyTorch's|))")  # fmt: skip


def main():
  torch.manual_seed(0)
  check("torchvision resnet18 (FrozenBatchNorm2d)",
        torchvision.models.resnet18(norm_layer=torchvision.ops.misc.FrozenBatchNorm2d),
        (2, 3, 64, 64))  # fmt: skip
  check("torchvision mobilenet_v3_small", torchvision.models.mobilenet_v3_small(), (2, 3, 64, 64))
  check("timm efficientnet_b0", timm.create_model("efficientnet_b0"), (2, 3, 64, 64))
  check("timm convnext_atto", timm.create_model("convnext_atto"), (2, 3, 64, 64))
  check("timm vit_tiny", timm.create_model("vit_tiny_patch16_224", img_size=64), (2, 3, 64, 64))
  check("timm resnet18 gn", timm.create_model("resnet18", norm_layer="groupnorm1"), (2, 3, 64, 64))
  check("timm RmsNorm", torch.nn.Sequential(timm.layers.RmsNorm(16, eps=1e-5)), (2, 5, 16))
  check("timm RmsNorm2d", torch.nn.Sequential(timm.layers.RmsNorm2d(16)), (2, 16, 4, 4))


if __name__ == "__main__":
  main()
