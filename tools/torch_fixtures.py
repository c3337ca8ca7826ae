"""Writes PyTorch reference values for jaxnorm's PyTorch import (tests/test_torch.py).

Run where PyTorch is installed (it is not a dependency of jaxnorm or of its tests):

  python tools/torch_fixtures.py [--out tests/fixtures/torch_norms.npz]

For each case it records, under ``<case>/<name>`` keys of one ``.npz`` file: the layer's
``state_dict`` as it starts (non-trivial parameters and running statistics), then for
each of three training steps the input, the output and the ``state_dict`` after the step,
then an input and the output in evaluation mode. bfloat16 arrays are stored as float32
(exact); the case's ``dtype`` key says which it was. Cases: ``BatchNorm1d`` on (N, C) and
(N, C, L), ``BatchNorm2d`` with ``momentum=0.1``, ``momentum=None`` and
``track_running_stats=False``, ``LayerNorm`` over (C, H, W) and (D,), ConvNeXt's
channels-first ``LayerNorm2d``, ``GroupNorm``, ``InstanceNorm2d`` with and without affine
parameters and running statistics, ``RMSNorm(eps=None)`` in float32, bfloat16, float16 and
float64.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


class LayerNorm2d(torch.nn.LayerNorm):
  """timm's and torchvision's ConvNeXt LayerNorm2d: a LayerNorm over the channels of NCHW."""

  def forward(self, x):
    x = x.permute(0, 2, 3, 1)
    x = torch.nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
    return x.permute(0, 3, 1, 2)


# case: (constructor, input shape, input scale). The scales make every property visible far
# above the tests' tolerances: activations whose variance is about ε (so a wrong ε moves
# the output by 10-80 %), running statistics far from the batch's (momentum), W == C or
# W != C (layout).
CASES = {
  "bn1d": (lambda: torch.nn.BatchNorm1d(5), (8, 5), 0.01),
  "bn1d_seq": (lambda: torch.nn.BatchNorm1d(4, eps=1e-3, momentum=0.3), (6, 4, 7), 0.05),
  "bn2d": (lambda: torch.nn.BatchNorm2d(3), (4, 3, 5, 5), 0.005),
  "bn2d_cumulative": (lambda: torch.nn.BatchNorm2d(3, momentum=None), (4, 3, 5, 5), 0.005),
  "bn2d_no_stats": (
    lambda: torch.nn.BatchNorm2d(3, track_running_stats=False),
    (4, 3, 5, 5),
    0.005,
  ),
  "ln_chw": (lambda: torch.nn.LayerNorm((3, 4, 4)), (2, 3, 4, 4), 0.005),
  "ln_d": (lambda: torch.nn.LayerNorm(16, eps=1e-6, bias=False), (2, 5, 16), 0.001),
  "ln2d": (lambda: LayerNorm2d(4, eps=1e-6), (2, 4, 5, 4), 0.001),
  "gn": (lambda: torch.nn.GroupNorm(2, 6), (3, 6, 4, 4), 0.005),
  "in2d": (lambda: torch.nn.InstanceNorm2d(3), (2, 3, 6, 6), 0.005),
  "in2d_affine_stats": (
    lambda: torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
    (2, 3, 6, 6),
    0.005,
  ),
  "rms_f32": (lambda: torch.nn.RMSNorm(16, eps=None), (2, 5, 16), 3e-4),
  "rms_bf16": (lambda: torch.nn.RMSNorm(16, eps=None, dtype=torch.bfloat16), (2, 5, 16), 0.05),
  "rms_f16": (lambda: torch.nn.RMSNorm(16, eps=None, dtype=torch.float16), (2, 5, 16), 0.05),
  "rms_f64": (lambda: torch.nn.RMSNorm(16, eps=None, dtype=torch.float64), (2, 5, 16), 1e-8),
}


def _np(t: torch.Tensor) -> np.ndarray:
  t = t.detach()
  return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()


def record(name, make, shape, scale, gen, out):
  layer = make()
  dtype = next((p.dtype for p in layer.parameters()), torch.float32)
  with torch.no_grad():  # non-trivial starting values
    for p in layer.parameters():
      p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * 0.5 + 1.0)
    if getattr(layer, "running_mean", None) is not None:
      # At the activations' scale, so that ε also shows at evaluation.
      layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=gen) * scale)
      layer.running_var.copy_((torch.rand(layer.running_var.shape, generator=gen) + 0.5) * scale**2)
  out[f"{name}/dtype"] = np.array(str(dtype).removeprefix("torch."))
  for k, v in layer.state_dict().items():
    out[f"{name}/init/{k}"] = _np(v)
  layer.train()
  for step in range(3):
    x = ((torch.randn(shape, generator=gen) * (1 + step) + step) * scale).to(dtype)
    y = layer(x)
    out[f"{name}/train{step}/x"], out[f"{name}/train{step}/y"] = _np(x), _np(y)
    for k, v in layer.state_dict().items():
      out[f"{name}/train{step}/{k}"] = _np(v)
  layer.eval()
  x = ((torch.randn(shape, generator=gen) * 2 + 1) * scale).to(dtype)
  out[f"{name}/eval/x"], out[f"{name}/eval/y"] = _np(x), _np(layer(x))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="tests/fixtures/torch_norms.npz")
  args = ap.parse_args(argv)
  gen = torch.Generator().manual_seed(0)
  out = {"torch_version": np.array(torch.__version__)}
  for name, (make, shape, scale) in CASES.items():
    record(name, make, shape, scale, gen, out)
  np.savez_compressed(args.out, **out)
  print(f"wrote {len(out)} arrays to {args.out} (torch {torch.__version__})")


if __name__ == "__main__":
  main()
