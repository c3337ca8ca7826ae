"""The modern norms against the forms users write by hand: DyT and the adaptive norms.

For Dynamic Tanh (``g·tanh(a·x) + b``), AdaLN (LayerNorm without affine, then
``x̂·(1 + scale) + shift`` per sample) and modulated RMSNorm, at a DiT-XL token shape
(8, 256, 1152) and a GPT-2 one (16, 512, 768), float32 and bfloat16 activations (float32
parameters and conditioning), forward and forward+backward (a VJP with a random cotangent,
into x and the parameters or the per-sample shift and scale), each jitted:

- ``jnp``: the textbook form in plain ``jax.numpy``, statistics in float32 (two-pass
  variance), as a user writes it;
- ``flax``: AdaLN with ``flax.linen.LayerNorm(use_scale=False, use_bias=False)`` then the
  same modulation (the JAX DiT ports' form);
- ``jaxnorm``: :func:`jaxnorm.dyt`, :func:`jaxnorm.adaptive_layer_norm`,
  :func:`jaxnorm.adaptive_rms_norm`.

Times are medians of interleaved runs (A B C C B A ...); ratios are jaxnorm's over the best
hand-written form; bytes accessed (XLA's cost analysis) as multiples of |x|. A control,
``jnp (again)``, times the ``jnp`` form a second time as if it were another library (its
own jit, the same program): its ratio to ``jnp`` is the run's noise at that row, and a
jaxnorm ratio inside it says nothing either way.

  python benchmarks/bench_modern.py [--repeats 31] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import argparse
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from bench_norms import analyse, timed

import jaxnorm
from tests.programs import forward_backward  # (bench_norms put the repository on the path)

SHAPES = {"dit_xl": (8, 256, 1152), "gpt2": (16, 512, 768)}
EPS = 1e-6


def _ln_jnp(x):
  xf = x.astype(jnp.float32)
  mu = xf.mean(-1, keepdims=True)
  var = jnp.square(xf - mu).mean(-1, keepdims=True)
  return (xf - mu) * jax.lax.rsqrt(var + EPS)


def _rms_jnp(x):
  xf = x.astype(jnp.float32)
  return xf * jax.lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + EPS)


def _modulated(xhat, shift, scale, dtype):
  return (xhat * (1 + scale[:, None]) + shift[:, None]).astype(dtype)


_FLAX_LN = nn.LayerNorm(use_scale=False, use_bias=False, epsilon=EPS, dtype=jnp.float32)
_FLAX_RMS = nn.RMSNorm(use_scale=False, epsilon=EPS, dtype=jnp.float32)


def forms(kind):
  """``{implementation: forward(params, x, rest)}`` for one kind; ``params`` are what the
  VJP differentiates besides x."""
  if kind == "dyt":
    return {
      "jnp": lambda p, x, _: (p["g"] * jnp.tanh(p["a"] * x) + p["b"]).astype(x.dtype),
      "jaxnorm": lambda p, x, _: jaxnorm.dyt(x, p["a"], p["g"], p["b"], dtype=x.dtype),
    }
  if kind == "adaln":
    return {
      "jnp": lambda p, x, _: _modulated(_ln_jnp(x), p["shift"], p["scale"], x.dtype),
      "flax": lambda p, x, _: _modulated(_FLAX_LN.apply({}, x), p["shift"], p["scale"], x.dtype),
      "jaxnorm": lambda p, x, _: jaxnorm.adaptive_layer_norm(
        x, p["shift"], p["scale"], epsilon=EPS, dtype=x.dtype
      ),
    }
  return {
    "jnp": lambda p, x, _: _modulated(_rms_jnp(x), p["shift"], p["scale"], x.dtype),
    "flax": lambda p, x, _: _modulated(_FLAX_RMS.apply({}, x), p["shift"], p["scale"], x.dtype),
    "jaxnorm": lambda p, x, _: jaxnorm.adaptive_rms_norm(
      x, p["shift"], p["scale"], epsilon=EPS, dtype=x.dtype
    ),
  }


def params_for(kind, shape, rng):
  b, _, d = shape
  if kind == "dyt":
    return {"a": jnp.float32(0.5), "g": jnp.asarray(rng.normal(1, 0.1, d), jnp.float32),
            "b": jnp.asarray(rng.normal(0, 0.1, d), jnp.float32)}  # fmt: skip
  return {k: jnp.asarray(rng.normal(0, 0.1, (b, d)), jnp.float32) for k in ("shift", "scale")}


KINDS = ("dyt", "adaln", "adarms")


def build(kind, shape, dtype, seed=0):
  """``(x, {implementation: (jitted forward, jitted forward+backward, args, cotangent)})``,
  the structure of :func:`bench_norms.build`, for :mod:`gpu_suite`."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(2.0, 1.5, shape), dtype)
  cot = jnp.asarray(rng.normal(size=shape), dtype)
  p = params_for(kind, shape, rng)
  impls = {
    name: (jax.jit(f), jax.jit(forward_backward(f)), (p, x, None), cot)
    for name, f in forms(kind).items()
  }
  return x, impls


def run(repeats, shapes=SHAPES, dtypes=("float32", "bfloat16")):
  rows = []
  rng = np.random.default_rng(0)
  for kind in KINDS:
    for shape_name, shape in shapes.items():
      for dtype in dtypes:
        x = jnp.asarray(rng.normal(2.0, 1.5, shape), dtype)
        cot = jnp.asarray(rng.normal(size=shape), dtype)
        p = params_for(kind, shape, rng)
        impls = forms(kind)
        impls["jnp (again)"] = lambda *a, f=impls["jnp"]: f(*a)  # the control
        want = np.asarray(impls["jnp"](p, x, None), np.float32)
        for f in impls.values():  # the same output (to the dtype's rounding)
          got = np.asarray(jax.jit(f)(p, x, None), np.float32)
          np.testing.assert_allclose(got, want, atol=0.05 if dtype == "bfloat16" else 1e-4)
        for mode in ("forward", "forward+backward"):
          fns = {
            k: jax.jit(f if mode == "forward" else forward_backward(f)) for k, f in impls.items()
          }
          args = (p, x, None) if mode == "forward" else (p, x, None, cot)
          times = timed({k: (lambda fn=fn, a=args: fn(*a)) for k, fn in fns.items()}, repeats)
          nbytes = x.size * x.dtype.itemsize
          traffic = {k: analyse(fn, args, nbytes)[0] for k, fn in fns.items()}
          best = min(v for k, v in times.items() if k not in ("jaxnorm", "jnp (again)"))
          rows.append(dict(kind=kind, shape=shape_name, dtype=dtype, mode=mode, times=times,
                           bytes=traffic, ratio=times["jaxnorm"] / best,
                           noise=times["jnp (again)"] / times["jnp"]))  # fmt: skip
          print(_line(rows[-1]), flush=True)
  return rows


def _line(r):
  times = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in r["times"].items() if k != "jnp (again)")
  traffic = ", ".join(f"{k} {v:.1f}" for k, v in r["bytes"].items() if k != "jnp (again)")
  return (f"| {r['kind']} | {r['shape']} | {r['dtype']} | {r['mode']} | {times} | "
          f"**{r['ratio']:.2f}** | {r['noise']:.2f} | {traffic} |")  # fmt: skip


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeats", type=int, default=31)
  ap.add_argument("--out", default=None, help="folder for bench_modern.md")
  args = ap.parse_args(argv)
  header = ("| norm | shape | dtype | pass | median time | jaxnorm / best hand-written | "
            "control: jnp / jnp | bytes accessed / \\|x\\| |\n"
            "|---|---|---|---|---|---|---|---|")  # fmt: skip
  print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}\n\n{header}")
  rows = run(args.repeats)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_modern.md"), "w") as f:
      f.write(f"# bench_modern.py on {jax.devices()[0].device_kind} (jax {jax.__version__}, "
              f"{args.repeats} interleaved repeats)\n\n{header}\n")  # fmt: skip
      f.write("\n".join(_line(r) for r in rows) + "\n")
  return rows


if __name__ == "__main__":
  main()
