"""Speed parity: each jaxnorm module against its flax.linen twin, in one process.

For each norm and shape, both modules are jit-compiled for the forward pass and for the
forward+backward pass (a VJP with a fixed random cotangent, gradients w.r.t. the input and
the parameters). Runs are interleaved (A B B A ...) after compilation; the script prints
the median times and the per-case ratio jaxnorm/flax, and the geometric mean of the ratios
per pass. Ratios, not absolute times, are the figures to quote on a shared machine.

  python benchmarks/bench_parity.py [--repeats 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm

SHAPES = {"transformer": (16, 512, 768), "cnn": (32, 32, 32, 64)}
CASES = [  # (norm, shape name, constructor kwargs, is batch norm)
  ("BatchNorm", "cnn", dict(use_running_average=False), True),
  ("BatchNorm", "transformer", dict(use_running_average=False), True),
  ("LayerNorm", "transformer", {}, False),
  ("LayerNorm", "cnn", dict(reduction_axes=(1, 2, 3), feature_axes=-1), False),
  ("RMSNorm", "transformer", {}, False),
  ("GroupNorm", "cnn", dict(num_groups=32), False),
  ("InstanceNorm", "cnn", {}, False),
]


def make_fns(module, x, is_bn):
  variables = module.init(jax.random.key(0), x)
  params = variables["params"]
  rest = {k: v for k, v in variables.items() if k != "params"}
  mutable = ["batch_stats"] if is_bn else False

  def forward(params, x):
    out = module.apply({"params": params, **rest}, x, mutable=mutable)
    return out[0] if is_bn else out

  def fwd_bwd(params, x, cot):
    y, vjp = jax.vjp(forward, params, x)
    return y, vjp(cot)

  return jax.jit(forward), jax.jit(fwd_bwd), params


def time_pair(fa, fb, args, repeats):
  for f in (fa, fb):
    jax.block_until_ready(f(*args))
  ta, tb = [], []
  for i in range(repeats):
    order = ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))
    for f, acc in order:
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      acc.append(time.perf_counter() - t0)
  return float(np.median(ta)), float(np.median(tb))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeats", type=int, default=30)
  ap.add_argument("--json", default=None, help="write the results to this JSON file")
  args = ap.parse_args()
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
  rows = []
  for norm, shape_name, kw, is_bn in CASES:
    x = jax.random.normal(jax.random.key(1), SHAPES[shape_name], jnp.float32)
    ours = make_fns(getattr(jaxnorm, norm)(**kw), x, is_bn)
    theirs = make_fns(getattr(nn, norm)(**kw), x, is_bn)
    cot = jax.random.normal(jax.random.key(7), x.shape, x.dtype)
    for p, name, fargs in ((0, "forward", (x,)), (1, "fwd+bwd", (x, cot))):
      t_ours, t_flax = time_pair(ours[p], theirs[p], (ours[2], *fargs), args.repeats)
      rows.append(
        dict(
          norm=norm,
          shape=shape_name,
          pass_=name,
          jaxnorm_ms=t_ours * 1e3,
          flax_ms=t_flax * 1e3,
          ratio=t_ours / t_flax,
        )
      )
      print(
        f"{norm:13s} {shape_name:12s} {name:8s} jaxnorm {t_ours * 1e3:8.2f} ms  "
        f"flax {t_flax * 1e3:8.2f} ms  ratio {t_ours / t_flax:.3f}"
      )
  summary = {}
  for name in ("forward", "fwd+bwd"):
    ratios = [r["ratio"] for r in rows if r["pass_"] == name]
    summary[name] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"geometric mean ratio jaxnorm/flax, {name}: {summary[name]:.3f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(device=str(jax.devices()[0]), rows=rows, geomean=summary), f, indent=1)


if __name__ == "__main__":
  main()
