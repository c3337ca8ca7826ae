"""One device's statistics, partitioned by XLA exactly: each shard's own, combined once.

Under GSPMD (plain ``jit`` over sharded arrays) a reduced axis may be sharded. A shift
sliced out of it is then broadcast from one device, and a conditioning check is an
all-reduce of its own: BatchNorm cost 2 all-reduces forward and 4 plus a
collective-permute forward+backward where Flax's costs 1 and 2. Here the statistics are a
``custom_partitioning`` op: on one device (or with no reduced axis sharded) it is the
unsharded computation, unchanged; with reduced axes sharded, every shard computes its
mean and variance with the same method over its own elements (its shift, its check,
local), and one ``psum`` of per-shard slots combines them with Chan, Golub & LeVeque's
formula — one all-reduce, exact (``benchmarks/RESULTS.md``, item 36). Under explicit
sharding, where jax leaves such an op unpartitioned, the same per-shard computation and
combine run in a ``shard_map`` over the sharding x's type names (item 38). ``custom_vmap``
and ``custom_jvp`` give it the batching and differentiation rules the op lacks.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def moments(raw: jax.Array, axes: tuple[int, ...], method: Any, dtype: Any) -> jax.Array:
  """``stack([mean, var])`` of ``raw`` over ``axes`` (kept dims), in ``dtype``, by
  ``method(raw, axes, dtype)``, partitioned exactly over sharded reduced axes (each
  shard's ``method(raw, axes, dtype, parts=True)``: ``stack([a, d, var])``, its mean as
  ``a + d`` unrounded)."""
  return _op(axes, method, jnp.dtype(dtype).name, raw.ndim)(raw)


def _spec(sharding: Any, ndim: int) -> tuple[Any, ...]:
  spec = tuple(getattr(sharding, "spec", ()) or ())
  return spec + (None,) * (ndim - len(spec))


def _names(entry: Any) -> tuple[str, ...]:
  """The mesh axes of one partition-spec entry."""
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, tuple) else (entry,)


@functools.cache
def _op(axes: tuple[int, ...], method: Any, dtype: str, ndim: int) -> Any:
  def compute(raw):
    return method(raw, axes, jnp.dtype(dtype))

  def parts(raw):
    return method(raw, axes, jnp.dtype(dtype), parts=True)

  def shardings(mesh, shape, sharding):
    """The input's sharding (reduced axes that do not split evenly replicated) and the
    output's (the kept axes' sharding, the reduced ones replicated)."""
    spec = list(_spec(sharding, ndim))
    for a in axes:
      size = math.prod(mesh.shape[n] for n in _names(spec[a]))
      if shape[a] % size:
        spec[a] = None
    out = [None] + [None if a in axes else spec[a] for a in range(ndim)]
    return NamedSharding(mesh, P(*spec)), NamedSharding(mesh, P(*out))

  def partition(mesh, arg_shapes, result_shape):
    arg = arg_shapes[0]
    in_sharding, out_sharding = shardings(mesh, arg.shape, arg.sharding)
    spec = _spec(in_sharding, ndim)
    names = tuple(n for a in axes for n in _names(spec[a]))

    body = functools.partial(_combined, compute, parts, names)
    return mesh, body, out_sharding, (in_sharding,)

  def infer(mesh, arg_shapes, result_shape):
    return shardings(mesh, arg_shapes[0].shape, arg_shapes[0].sharding)[1]

  op = custom_partitioning(compute)
  factors = [f"d{a}" for a in range(ndim)]
  result = ["s"] + [f"k{a}" if a in axes else f"d{a}" for a in range(ndim)]
  op.def_partition(
    partition=partition,
    infer_sharding_from_operands=infer,
    sharding_rule=f"{' '.join(factors)} -> {' '.join(result)}",
  )

  @jax.custom_batching.custom_vmap
  def batched(raw):
    mesh = _explicit_mesh(raw)
    return op(raw) if mesh is None else _explicit(compute, parts, axes, raw, mesh)

  @batched.def_vmap
  def _batched_rule(axis_size, in_batched, raw):
    del axis_size, in_batched
    return jax.vmap(compute)(raw), True

  @jax.custom_jvp
  def stats(raw):
    return batched(raw)

  @stats.defjvp
  def _stats_jvp(primals, tangents):
    (raw,), (draw,) = primals, tangents
    out = stats(raw)
    x, dx = raw.astype(dtype), draw.astype(dtype)
    dmean = jnp.mean(dx, axes, keepdims=True)
    dvar = 2.0 * jnp.mean((x - out[0]) * (dx - dmean), axes, keepdims=True)
    return out, jnp.stack([dmean, dvar])

  return stats


# Up to this many shards, one psum of every shard's slot (shards × 2 × the statistics:
# PyTorch's SyncBatchNorm gathers as much); beyond, two psums of the statistics' size.
_SLOTS_UP_TO = 16


def _combined(compute, parts, names, raw):
  """This shard's statistics, combined over the mesh axes ``names`` that split its reduced
  axes. Equal shards: the mean of the means, and the mean variance plus the means' spread
  around it (Chan, Golub & LeVeque), from one ``psum`` of per-shard slots, or beyond
  ``_SLOTS_UP_TO`` shards from a ``psum`` of the means and one of the spread. Each shard's
  mean comes as ``a + d`` (``a`` an element, ``d`` small) and the spread is taken as
  ``(a − ref) + d``: far off centre, a rounded mean is off by half an ulp of the offset,
  more than the spread itself (7e-5 of the variance at 1e4 ± 1 over 8 shards)."""
  if not names:
    return compute(raw)
  a, d, var = parts(raw)
  count = lax.psum(1, names)
  if count > _SLOTS_UP_TO:
    ref = lax.psum(a + d, names) / count  # (rounded, the same on every shard)
    off = (a - ref) + d
    spread = lax.psum(jnp.stack([var + off * off, off]), names) / count
    return jnp.stack([ref + spread[1], spread[0] - spread[1] * spread[1]])
  slots = jnp.zeros((count, 3) + a.shape, a.dtype)
  every = lax.psum(slots.at[lax.axis_index(names)].set(jnp.stack([a, d, var])), names)
  ref = every[:1, 0]
  off = (every[:, 0] - ref) + every[:, 1]  # each shard's mean − ref
  mean_off = jnp.mean(off, 0, keepdims=True)
  var = jnp.mean(every[:, 2], 0) + jnp.mean(jnp.square(off - mean_off), 0)
  return jnp.stack([(ref + mean_off)[0], var])


def _explicit_mesh(raw: Any) -> Any:
  """The mesh of ``raw``'s type when it is explicitly sharded over some axis (every axis
  splitting evenly), else None."""
  try:
    sharding = jax.typeof(raw).sharding
  except (AttributeError, TypeError):
    return None
  mesh: Any = getattr(sharding, "mesh", None)
  types = getattr(mesh, "axis_types", ()) or ()
  if not any(t == jax.sharding.AxisType.Explicit for t in types):
    return None
  spec = _spec(sharding, raw.ndim)
  sizes = [math.prod(mesh.shape[n] for n in _names(e)) for e in spec]
  uneven = any(d % size for d, size in zip(raw.shape, sizes, strict=True))
  return None if uneven or all(size == 1 for size in sizes) else mesh


def _explicit(
  compute: Any, parts: Any, axes: tuple[int, ...], raw: jax.Array, mesh: Any
) -> jax.Array:
  """The partitioned op's computation where x's type names its sharding (explicit
  sharding, where jax leaves a ``custom_partitioning`` op unpartitioned): a ``shard_map``
  over that sharding, every shard's own statistics (its checks local) combined as
  :func:`_combined` does; ``mesh``: :func:`_explicit_mesh`'s."""
  spec = _spec(jax.typeof(raw).sharding, raw.ndim)
  names = tuple(n for a in axes for n in _names(spec[a]))
  out = P(None, *(None if a in axes else spec[a] for a in range(raw.ndim)))
  body = functools.partial(_combined, compute, parts, names)
  return jax.shard_map(body, mesh=mesh, in_specs=P(*spec), out_specs=out)(raw)
