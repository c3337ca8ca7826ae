"""The Pallas row kernels on a real device, against a float64 NumPy reference and the XLA
path: forward and reverse mode, rows and columns that fill no block (the padding Triton
and Mosaic see, and the CPU interpreter does not), masks and Add & Norm.

One short command for a lent GPU or TPU, before its timings (``gpu_suite.py`` runs it
first): a kernel that writes its padding over the next row, or reads past the array,
shows here as a large error. Prints one line per case and exits non-zero on a failure.

  python benchmarks/pallas_device_check.py [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from tests import reference  # (the suite's float64 reference, from the formulas)

EPS = 1e-5
# (norm, rows, features, dtype, masked): the suite's rows, ragged rows and columns, one
# element per row, the longest row.
CASES = [
  ("layer", 16384, 768, jnp.bfloat16, False),
  ("layer", 16384, 768, jnp.float32, False),
  ("rms", 8192, 4096, jnp.bfloat16, False),
  ("layer", 37, 1000, jnp.float32, False),
  ("rms", 37, 1000, jnp.float32, False),
  ("layer", 37, 1000, jnp.float32, True),
  ("add_layer", 4099, 768, jnp.bfloat16, False),
  ("add_rms", 37, 1000, jnp.float32, False),
  ("layer", 5, 16384, jnp.float32, False),
  ("layer", 3, 1, jnp.float32, False),
]
SMOKE = [("layer", 9, 100, jnp.float32, True), ("add_rms", 9, 100, jnp.bfloat16, False)]


def run(norm, rows, d, dtype, masked, seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  x = (jax.random.normal(k[0], (rows, d)) * 2 + 3).astype(dtype)
  r = jax.random.normal(k[1], (rows, d)).astype(dtype)
  g = 1 + 0.1 * jax.random.normal(k[2], (d,))
  b = 0.1 * jax.random.normal(k[3], (d,)) if "layer" in norm else None
  ct = jax.random.normal(k[4], (rows, d)).astype(dtype)
  mask = (jax.random.uniform(k[4], (rows, d)) < 0.7) if masked else None
  fn = dict(layer=jaxnorm.layer_norm, rms=jaxnorm.rms_norm)[norm.removeprefix("add_")]
  add = getattr(jaxnorm, f"{norm}_norm") if norm.startswith("add_") else None

  def f(impl):
    def apply(x, g, *bb):
      kw = dict(epsilon=EPS, mask=mask, implementation=impl)
      if add is not None:
        return add(x, r, g, *bb, residual_dtype=jnp.float32, **kw)[0]
      return fn(x, g, *bb, **kw)

    def grads(ct, *a):
      y, vjp = jax.vjp(apply, *a)
      return vjp(ct.astype(y.dtype))

    return jax.jit(apply), jax.jit(grads)

  args = (x, g) + ((b,) if b is not None else ())
  h = x.astype(jnp.float32) + r.astype(jnp.float32) if add is not None else x
  ref = reference.layer_norm if "layer" in norm else reference.rms_norm
  want = ref(h, g, b, eps=EPS, mask=mask)
  out = {}
  for impl in ("pallas", "xla"):
    fwd, bwd = f(impl)
    y = np.asarray(fwd(*args), np.float64)
    grads = [np.asarray(t, np.float64) for t in bwd(ct, *args)]
    out[impl] = (y, grads)
  scale = max(1.0, np.abs(want).max())
  err = lambda impl: float(np.abs(out[impl][0] - want).max() / scale)  # noqa: E731
  gerr = max(
    float(np.abs(p - q).max() / max(1.0, np.abs(q).max()))
    for p, q in zip(out["pallas"][1], out["xla"][1], strict=True)
  )
  tol = 2e-5 if dtype == jnp.float32 else 2e-2
  gtol = 1e-4 if dtype == jnp.float32 else 5e-2
  ok = err("pallas") <= max(tol, 2 * err("xla")) and gerr <= gtol
  return dict(
    case=f"{norm} {rows}×{d} {jnp.dtype(dtype).name}{' masked' if masked else ''}",
    pallas_vs_float64=err("pallas"),
    xla_vs_float64=err("xla"),
    pallas_grads_vs_xla=gerr,
    ok=bool(ok),
  )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=None)
  ap.add_argument("--smoke", action="store_true", help="two small cases (the tests, on a CPU)")
  args = ap.parse_args(argv)
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
  rows = []
  for case in SMOKE if args.smoke else CASES:
    row = run(*case)
    rows.append(row)
    print(
      f"{'ok  ' if row['ok'] else 'FAIL'} {row['case']}: output off float64 "
      f"{row['pallas_vs_float64']:.2e}"
      f" (XLA {row['xla_vs_float64']:.2e}), gradients off XLA's {row['pallas_grads_vs_xla']:.2e}",
      flush=True,
    )
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pallas_device_check.json"), "w") as f:
      meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__)
      json.dump(dict(meta, rows=rows), f, indent=1)
  return all(r["ok"] for r in rows)


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
