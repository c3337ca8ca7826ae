"""Statistics across a mapped axis (``axis_name``: ``pmap``, ``shard_map``, ``vmap``):
each device's ``(n, a, s₁, s₂)`` combined in one collective, exact for any offset, also
when devices hold different valid counts; grouped sums under every transform.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm._config import freeze_groups
from jaxnorm._dtypes import real_dtype
from jaxnorm._engine.maths import merge_along, moved_sums, shifted_parts, shifts, two_pass


def axis_size(axis_name: Any) -> int:
  """The size of the mapped axis ``axis_name`` (a Python int: axis sizes are static), or a
  ``NameError`` that names it and says how to bind it (JAX's says only "unbound axis
  name")."""
  try:
    return lax.psum(1, axis_name)
  except NameError:
    raise NameError(
      f"axis_name={axis_name!r} is not bound here: the statistics are combined across the "
      f"mapped axis of that name, which exists only inside a transform that names it: "
      f"jax.vmap(f, axis_name={axis_name!r}) (an Equinox BatchNorm: jax.vmap(bn, "
      f"axis_name={axis_name!r}, in_axes=(0, None), out_axes=(0, None))), jax.shard_map "
      f"over a mesh axis {axis_name!r}, or jax.pmap(f, axis_name={axis_name!r}). Call it "
      f"inside one, or pass axis_name=None for the statistics of this call alone."
    ) from None


def psum(value: Any, axis_name: Any, axis_index_groups: Any = None) -> Any:
  """``lax.psum`` of a pytree over ``axis_name`` (``value`` unchanged when it is None);
  with ``axis_index_groups``, each group's own sum, under ``pmap``, ``shard_map`` and
  ``vmap`` alike (``lax.psum`` refuses groups in the last two): every member puts its
  value in its group's row of a ``(G, ...)`` array of zeros, one ungrouped ``psum`` adds
  the rows and each member reads its group's. (``G`` times a grouped ``psum``'s data, for
  one code path under every transform.)"""
  if axis_name is None:
    return value
  axis_size(axis_name)  # (a clear error when it is unbound)
  if axis_index_groups is None:
    return lax.psum(value, axis_name)
  group, _, count = _group_tables(axis_name, axis_index_groups)
  rows = jnp.arange(count) == group

  def one(v: Any) -> jax.Array:
    v = jnp.asarray(v)
    spread = jnp.where(rows.reshape((-1,) + (1,) * v.ndim), v[None], jnp.zeros((), v.dtype))
    return lax.psum(spread, axis_name)[group]

  return jax.tree.map(one, value)


def _group_tables(axis_name: Any, axis_index_groups: Any) -> tuple[jax.Array, jax.Array, int]:
  """This member's group and its position in it, and the number of groups, after checking
  that the groups split the axis into groups of one size (as ``lax.psum`` asks)."""
  groups = freeze_groups(axis_index_groups) or ()
  size = lax.psum(1, axis_name)  # a Python int: axis sizes are static
  members = sorted(i for g in groups for i in g)
  if members != list(range(size)) or len({len(g) for g in groups}) != 1:
    raise ValueError(
      f"axis_index_groups must split the indices 0..{size - 1} of axis {axis_name!r} into "
      f"groups of equal size, each index in exactly one group; got {[list(g) for g in groups]}."
    )
  group, position = np.empty(size, np.int32), np.empty(size, np.int32)
  for g, indices in enumerate(groups):
    group[list(indices)] = g
    position[list(indices)] = np.arange(len(indices))
  index = lax.axis_index(axis_name)
  return jnp.asarray(group)[index], jnp.asarray(position)[index], len(groups)


def _gather(value, axis_name, axis_index_groups):
  """``value`` of every member of ``axis_name`` (or of this member's group), stacked on a
  new leading axis, as one ungrouped ``psum`` (so also under ``vmap`` and ``shard_map``,
  which refuse grouped ones): each member writes its value into its own slot of zeros,
  ``(G, k, ...)`` with groups. A ``psum`` result is the same on every member in
  ``shard_map``'s type system (an ``all_gather``'s is not, so ``out_specs=P()`` on the
  statistics would be refused)."""
  if axis_index_groups is None:
    slots = jnp.zeros((lax.psum(1, axis_name),) + value.shape, value.dtype)
    return lax.psum(slots.at[lax.axis_index(axis_name)].set(value), axis_name)
  group, position, count = _group_tables(axis_name, axis_index_groups)
  k = len(axis_index_groups[0])
  slots = jnp.zeros((count, k) + value.shape, value.dtype)
  return lax.psum(slots.at[group, position].set(value), axis_name)[group]


# Up to this many members, one gather of every member's (n, a, s₁, s₂); beyond, two psums.
# A gather is a collective of (members × 4 × features): fine across devices, quadratic under
# vmap over a batch (each example a member: 5.8x Equinox's time at 256 examples).
_GATHER_MEMBERS = 16


def _combine_devices(parts, axis_name, axis_index_groups):
  """Each device's ``(n, a, s₁, s₂)`` (its sums around its shift ``a``) combined across
  ``axis_name`` (or this member's group), the same on every member: up to
  ``_GATHER_MEMBERS`` members gathered in one collective (:func:`_gather`) and merged by
  ``maths.merge``; beyond, moved onto one rough mean ``μ̃ = Σ(nᵢaᵢ + s₁ᵢ)/n`` in two
  ``psum`` calls. No offset is squared; devices without a valid element drop out."""
  n, a, s1, s2 = parts
  if axis_size(axis_name) > _GATHER_MEMBERS:
    total, weighted = psum((n, n * a + s1), axis_name, axis_index_groups)
    rough = weighted / jnp.maximum(total, 1)
    moved, more = moved_sums(n, s1, a - rough)
    return (total, rough) + psum((moved, s2 + more), axis_name, axis_index_groups)
  stacked = jnp.stack(jnp.broadcast_arrays(*(t.astype(a.dtype) for t in parts)))
  gathered = _gather(stacked, axis_name, axis_index_groups)  # (members, 4, ...)
  n, a, s1, s2 = merge_along(jnp.moveaxis(gathered, 1, 0), 0)
  return n.real, a, s1, s2.real


def device_parts(x, valid, count, inv_n, cfg):
  """This device's ``(n, a, s₁, s₂)`` per group, combined across ``cfg.axis_name``: sums
  shifted by two elements of each group, one read of x as Flax's, and the device's mean
  handed over unrounded (``a + s₁/n``: the combination is exact); two passes with a mask,
  for complex data and where no element can be sliced. (XLA:CPU took two passes too until
  RESULTS item 66: no faster, and its rounded means cost 4.8e-4 of the variance.)"""
  axes, groups = cfg.axes, cfg.channel_groups
  shift = None
  if valid is None and cfg.center and not jnp.iscomplexobj(x):
    shift = shifts(x, axes, groups)
  if shift is None:
    mean, var = two_pass(x, axes, groups, inv_n, valid, cfg.center)
    parts = (count, mean, jnp.zeros_like(mean), var * count)
  else:  # (the count as given: under shard_map, not varying)
    parts = (count,) + shifted_parts(x, axes, groups, shift)[1:]
  real = real_dtype(x.dtype)
  n, a, s1, s2 = parts[0].astype(real), parts[1], parts[2].astype(x.dtype), parts[3].astype(real)
  return _combine_devices((n, a, s1, s2), cfg.axis_name, cfg.axis_index_groups)
