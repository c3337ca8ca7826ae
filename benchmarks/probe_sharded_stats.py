"""Two ways to exact statistics over a GSPMD-sharded reduced axis (``RESULTS.md``, item 35).

BatchNorm's variance over a batch sharded on 8 virtual CPU devices (automatic sharding,
plain ``jit``), data at an offset of 1e4 (``E[x²] − E[x]²`` is useless there):

- ``variadic``: one ``lax.reduce`` whose state is a shift, a count and the sums of
  ``x − s`` and ``(x − s)²`` (combining two states moves one onto the other's shift);
- ``partitioned``: ``custom_partitioning`` around per-shard statistics (shifted by the
  shard's first row), combined by one ``psum`` of per-shard slots (Chan's formula).

It prints each one's collectives in the compiled program, its relative error against
float64, and the variadic reduction's time against two plain sums on one device.

  python benchmarks/probe_sharded_stats.py
"""

from __future__ import annotations

import os
import re
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental.custom_partitioning import custom_partitioning  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def _merge(a, b):
  """Two (shift, count, Σ(x − shift), Σ(x − shift)²) states as one, on ``a``'s shift when
  ``a`` is not empty."""
  sa, na, s1a, s2a = a
  sb, nb, s1b, s2b = b
  s = jnp.where(na > 0, sa, sb)
  db, da = sb - s, sa - s
  s1 = s1a + s1b + nb * db + na * da
  s2 = s2a + s2b + 2 * db * s1b + nb * db * db + 2 * da * s1a + na * da * da
  return s, na + nb, s1, s2


def variadic_var(x):
  zeros = jnp.zeros_like(x)
  init = tuple(jnp.float32(0) for _ in range(4))
  _, n, s1, s2 = lax.reduce((x, jnp.ones_like(x), zeros, zeros), init, _merge, (0,))
  return s2 / n - (s1 / n) ** 2


def plain_var(x):
  m = jnp.mean(x, 0)
  return jnp.mean(x * x, 0) - m * m


def _local(x):
  """(count, mean, M2) of one shard's rows, shifted by its first row."""
  d = x - x[:1]
  s1, s2, n = jnp.sum(d, 0), jnp.sum(d * d, 0), x.shape[0]
  return jnp.stack([jnp.full_like(s1, n), x[0] + s1 / n, s2 - s1 * s1 / n])


@custom_partitioning
def partitioned_stats(x):
  return _local(x)


def _partition(mesh, arg_shapes, result_shape):
  spec = tuple(arg_shapes[0].sharding.spec) + (None, None)
  rows, features = spec[0], spec[1]

  def lower(x):
    stats = _local(x)
    if rows is None:
      return stats
    slots = jnp.zeros((lax.axis_size(rows),) + stats.shape, stats.dtype)
    gathered = lax.psum(slots.at[lax.axis_index(rows)].set(stats), rows)
    n, mean, m2 = gathered[:, 0], gathered[:, 1], gathered[:, 2]
    total = n.sum(0)
    mu = (n * mean).sum(0) / total
    return jnp.stack([total, mu, m2.sum(0) + (n * (mean - mu) ** 2).sum(0)])

  out = NamedSharding(mesh, P(None, features))
  return mesh, lower, out, (NamedSharding(mesh, P(rows, features)),)


def _infer(mesh, arg_shapes, result_shape):
  return NamedSharding(mesh, P(None, (tuple(arg_shapes[0].sharding.spec) + (None, None))[1]))


partitioned_stats.def_partition(
  infer_sharding_from_operands=_infer, partition=_partition, sharding_rule="n c -> k c"
)


def partitioned_var(x):
  stats = partitioned_stats(x)
  return stats[2] / stats[0]


def main():
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  x = np.random.default_rng(0).normal(1e4, 1.0, (64, 16)).astype(np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("data")))
  truth = x.astype(np.float64).var(0)
  candidates = (("plain", plain_var), ("variadic", variadic_var), ("partitioned", partitioned_var))
  for name, f in candidates:
    hlo = jax.jit(f).lower(xs).compile().as_text()
    ops = {k: len(re.findall(rf" {k}(?:-start)?\(", hlo)) for k in ("all-reduce", "all-gather")}
    err = np.abs(np.asarray(jax.jit(f)(xs)) - truth).max() / truth.max()
    print(f"{name:12s} collectives {ops}  relative error {err:.1e}")
  big = np.random.default_rng(1).normal(size=(128 * 28 * 28, 64)).astype(np.float32)
  times = {}
  for name, f in (("plain", plain_var), ("variadic", variadic_var)):
    jf = jax.jit(f)
    jax.block_until_ready(jf(big))
    samples = []
    for _ in range(20):
      start = time.perf_counter()
      jax.block_until_ready(jf(big))
      samples.append(time.perf_counter() - start)
    times[name] = float(np.median(samples))
  print(f"variadic / plain time on one device: {times['variadic'] / times['plain']:.1f}")
  for transform in ("vmap", "jvp"):
    try:
      if transform == "vmap":
        jax.vmap(partitioned_stats)(np.ones((2, 8, 4), np.float32))
      else:
        jax.jvp(partitioned_stats, (np.ones((8, 4), np.float32),), (np.ones((8, 4), np.float32),))
      print(f"partitioned under {transform}: works")
    except NotImplementedError as e:
      print(f"partitioned under {transform}: {e}")


if __name__ == "__main__":
  main()
