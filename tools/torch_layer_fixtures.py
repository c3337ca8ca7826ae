"""Writes PyTorch reference values for jaxnorm's import of weight-normalized and
spectral-normalized layers, DyT and LocalResponseNorm (tests/test_torch_layers.py).

Run where PyTorch is installed (it is not a dependency of jaxnorm or of its tests):

  python tools/torch_layer_fixtures.py [--out tests/fixtures/torch_layers.npz]

Per case, under ``<case>/...`` keys of one ``.npz``: ``config`` (a JSON string: the layer's
class and constructor attributes, which reparameterization through which API), the
``state`` it is converted from, an input ``x`` (NCHW for convolutions), the training-mode
output ``y_train`` and, for spectral normalization, PyTorch's ``u_after`` that step. Then,
for spectral normalization, the ``converged`` state after 60 more training steps and the
evaluation-mode output ``y_eval`` from it. Weight-norm magnitudes ``g`` are drawn apart
from ``‖v‖`` so that a lost ``g`` or a wrong norm axis shows.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

P = torch.nn.utils.parametrizations


class DynamicTanh(torch.nn.Module):
  """The DyT paper's reference module (Zhu et al. 2025, github.com/jiachenzhu/DyT)."""

  def __init__(self, normalized_shape, channels_last, alpha_init_value=0.5):
    super().__init__()
    self.normalized_shape = normalized_shape
    self.alpha_init_value = alpha_init_value
    self.channels_last = channels_last
    self.alpha = torch.nn.Parameter(torch.ones(1) * alpha_init_value)
    self.weight = torch.nn.Parameter(torch.ones(normalized_shape))
    self.bias = torch.nn.Parameter(torch.zeros(normalized_shape))

  def forward(self, x):
    x = torch.tanh(self.alpha * x)
    if self.channels_last:
      return x * self.weight + self.bias
    return x * self.weight[:, None, None] + self.bias[:, None, None]


def _cases():
  lin = lambda: torch.nn.Linear(6, 4)  # noqa: E731
  return {
    "wn_hook_linear": (lambda: torch.nn.utils.weight_norm(lin()), (5, 6)),
    "wn_param_conv": (
      lambda: P.weight_norm(torch.nn.Conv2d(3, 5, 3, stride=2, padding=1)),
      (2, 3, 9, 9),
    ),  # fmt: skip
    "wn_hook_conv_whole": (
      lambda: torch.nn.utils.weight_norm(torch.nn.Conv2d(3, 5, 3, padding=1), dim=None),
      (2, 3, 7, 7),
    ),
    "sn_hook_linear": (lambda: torch.nn.utils.spectral_norm(lin()), (5, 6)),
    "sn_param_linear": (lambda: P.spectral_norm(lin(), n_power_iterations=2, eps=1e-6), (5, 6)),
    "sn_param_conv": (lambda: P.spectral_norm(torch.nn.Conv2d(3, 5, 3, dilation=2)), (2, 3, 9, 9)),
    "dyt_last": (lambda: DynamicTanh(6, True, 0.7), (2, 5, 6)),
    "dyt_first": (lambda: DynamicTanh(6, False, 0.3), (2, 6, 4, 5)),
    "lrn": (lambda: torch.nn.LocalResponseNorm(3, alpha=0.2, beta=0.6, k=2.0), (2, 7, 3, 3)),
  }


def _config(module):
  """What jaxnorm.convert reads of the module, as JSON."""
  attrs = {}
  for name in ("in_features", "out_features", "in_channels", "out_channels", "kernel_size",
               "stride", "padding", "dilation", "groups", "padding_mode", "normalized_shape",
               "channels_last", "size", "alpha", "beta", "k"):  # fmt: skip
    value = getattr(module, name, None)
    if value is not None and not isinstance(value, torch.Tensor | torch.nn.Parameter):
      attrs[name] = value
  config = {"class": type(module).__name__, "attributes": attrs}
  listed = getattr(getattr(module, "parametrizations", None), "weight", None)
  hooks = [h for h in module._forward_pre_hooks.values() if hasattr(h, "name")]
  for where, found in (("param", list(listed or [])), ("hook", hooks)):
    for p in found:
      config["reparam"] = {"api": where, "class": type(p).__name__, "dim": p.dim}
      if hasattr(p, "n_power_iterations"):
        config["reparam"].update(n_power_iterations=p.n_power_iterations, eps=p.eps)
  return json.dumps(config)


def _state(module):
  return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", default="tests/fixtures/torch_layers.npz")
  args = parser.parse_args()
  torch.manual_seed(0)
  out = {}
  for name, (build, shape) in _cases().items():
    module = build()
    with torch.no_grad():
      for key, p in module.named_parameters():
        if key.endswith(("weight_g", "original0")):
          p.copy_(torch.rand_like(p) * 2 + 0.5)  # g apart from ‖v‖
        elif key in ("weight", "bias") and isinstance(module, DynamicTanh):
          p.copy_(torch.randn_like(p))
    module.train()
    out[f"{name}/config"] = np.array(_config(module))
    out.update({f"{name}/state/{k}": v for k, v in _state(module).items()})
    x = torch.randn(*shape) * 2
    out[f"{name}/x"] = x.numpy()
    out[f"{name}/y_train"] = module(x).detach().numpy()
    if name.startswith("sn_"):
      state = _state(module)
      out[f"{name}/u_after"] = next(v for k, v in state.items() if k.endswith(("weight_u", "_u")))
      for _ in range(60):
        module(x)
      out.update({f"{name}/converged/{k}": v for k, v in _state(module).items()})
      module.eval()
      out[f"{name}/y_eval"] = module(x).detach().numpy()
      module.train()
      out[f"{name}/y_train_converged"] = module(x).detach().numpy()
  np.savez_compressed(args.out, **out)
  print(
    f"wrote {len(out)} arrays for {len(_cases())} cases to {args.out} (torch {torch.__version__})"
  )


if __name__ == "__main__":
  main()
