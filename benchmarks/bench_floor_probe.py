"""How close can XLA get to the floor? A hand-written LayerNorm forward+backward, no autodiff.

The closed-form gradient of LayerNorm over the last axis written out directly as one
jit-compiled program (the forward, then ``dx``, ``dγ``, ``dβ`` from the saved mean and
inverse deviation), timed in the same interleaved loop as jaxnorm's and Flax's VJPs and the
suite's floor kernels (``bench_norms.floors``: 5|x| of traffic), in float32 and in bfloat16
activations with float32 statistics. If even this program sits far above the floor, the
gap is the compiler's, not the library's formulation (benchmarks/RESULTS.md, item 25).

  python benchmarks/bench_floor_probe.py [--shape 16 512 768] [--repeats 15]
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
from bench_norms import analyse, floors, timed

import jaxnorm

F32 = jnp.float32


def hand_written(dtype, eps=1e-6):
  """LayerNorm over the last axis of ``x`` and its exact VJP, formulas written out."""

  def step(x, dy, scale, bias):
    xf = x.astype(F32)
    mean = xf.mean(-1, keepdims=True)
    r = jax.lax.rsqrt(((xf - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (xf - mean) * r
    y = (xhat * scale + bias).astype(dtype)
    dyf = dy.astype(F32)
    gdy = dyf * scale
    a = gdy.mean(-1, keepdims=True)
    c = (gdy * xhat).mean(-1, keepdims=True)
    dx = (r * (gdy - a - xhat * c)).astype(dtype)
    rows = tuple(range(x.ndim - 1))
    return y, (dx, (dyf * xhat).sum(rows), dyf.sum(rows))

  return jax.jit(step)


def library(lib, dtype, x):
  """The library's LayerNorm VJP w.r.t. the input and the parameters, as in bench_norms."""
  module = lib.LayerNorm(dtype=dtype)
  params = module.init(jax.random.key(0), x)

  def step(x, dy, params):
    y, vjp = jax.vjp(lambda p, x: module.apply(p, x), params, x)
    return y, vjp(dy)

  return jax.jit(step), params


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", type=int, nargs=3, default=(16, 512, 768))
  parser.add_argument("--repeats", type=int, default=15)
  args = parser.parse_args(argv)
  b, t, d = args.shape
  print(f"device: {jax.devices()[0].device_kind}; LayerNorm ({b}, {t}, {d}) fwd+bwd; ms")
  print("dtype | hand-written | jaxnorm | flax | floor | hand/floor | jaxnorm/floor | bytes hand")
  for dtype in (jnp.float32, jnp.bfloat16):
    print(probe(dtype, (b, t, d), args.repeats))


def probe(dtype, shape, repeats):
  """One table row: the three programs and the floor, timed interleaved, in ``dtype``."""
  k1, k2 = jax.random.split(jax.random.key(1))
  x = jax.random.normal(k1, shape, F32).astype(dtype)
  dy = jax.random.normal(k2, shape, F32).astype(dtype)
  scale, bias = jnp.ones(shape[-1]), jnp.zeros(shape[-1])
  hand = hand_written(dtype)
  jn, jn_params = library(jaxnorm, dtype, x)
  fx, fx_params = library(nn, dtype, x)
  calls = {
    "hand": lambda: hand(x, dy, scale, bias),
    "jaxnorm": lambda: jn(x, dy, jn_params),
    "flax": lambda: fx(x, dy, fx_params),
    "floor": floors(x, dy)["fwd+bwd"],
  }
  ms = {k: 1e3 * v for k, v in timed(calls, repeats).items()}
  hand_bytes = analyse(hand, (x, dy, scale, bias), x.size * x.dtype.itemsize)[0]
  return (
    f"{jnp.dtype(dtype).name} | {ms['hand']:.2f} | {ms['jaxnorm']:.2f} | {ms['flax']:.2f} | "
    f"{ms['floor']:.2f} | {ms['hand'] / ms['floor']:.1f} | {ms['jaxnorm'] / ms['floor']:.1f} | "
    f"{hand_bytes:.1f}|x|"
  )


if __name__ == "__main__":
  main()
