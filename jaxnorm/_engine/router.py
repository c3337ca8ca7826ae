"""The router: which algorithm computes a norm, decided while it is traced.

Every route is exact for any offset of the data. The platform is the one the program is
traced for (:func:`~jaxnorm._engine.platform.traced_for`: the input's or the context's
mesh, else JAX's default backend), and only its form is traced. Read top to bottom, the
first row that matches decides (``tests/test_routing.py`` reads each from the traced
program; ``docs/development.md`` lists each platform choice with its figure and guard):

=============================  ==============================================================
the call                       the route (file: function)
=============================  ==============================================================
complex input or parameters    two passes, JAX's own derivative (kernel: complex_normalize)
a mask                         two passes over the valid elements (maths: two_pass), the
                               closed-form derivative (kernel: normalize)
``axis_name`` (mapped axis)    each device's sums shifted by two of its elements, gathered
                               in one collective (collectives: device_parts); the kernel
ε outside the root             the kernel; its statistics as a plain call's below
on a mesh, any platform        Flax's program (accelerators) with the merged shifted sums
                               (maths: merged_sums), partitioned by GSPMD, each shard's sums
                               gathered in one collective (sharding: mesh_blocks; under
                               automatic sharding TPUs' per-sample statistics and GPUs'
                               rows are not cut; under explicit sharding each sharded
                               reduced axis cut into its shards: typed_blocks; TPUs merge
                               the blocks in one reduction: blocks_merged_at_once);
                               XLA:GPU's columns: two shifts per index of the first
                               reduced axis (gpu: two_shifts), also where explicit
                               sharding shards that axis alone
XLA:CPU, one device            the kernel (kernel: normalize). Forward: rows in two passes
                               (one YNNPACK fusion); columns ``Σx ∥ Σx²`` checked with an
                               exact second pass (cpu: checked_moments); channel groups in
                               two passes. Differentiated: sums shifted by two elements
                               sliced from x (cpu: by_method), the closed-form derivative
TPUs                           Flax's program with the merged sums (merged_moments); Add &
                               LayerNorm from 512 wide: sums around each row's rough mean
                               (tpu: moments_about)
GPUs                           Flax's program; rows of up to 8,192 elements: two passes
                               forward (gpu: row_moments, one kernel with the norm), the
                               merged sums differentiated and for longer rows;
                               columns: sums shifted by two elements (gpu: two_shifts),
                               over batches of up to 64 per index of it, merged over it;
                               with few kept indices both sums in one reduction, long
                               columns in chunks merged, off a mesh channel groups
                               shifted by two elements of each group, not merged over
                               its channels (gpu: few_kept, column_chunks)
``implementation="pallas"``    the Pallas row kernels (pallas_rows: normalize_rows), each
                               platform's traced, the lowering keeping its own (pallas)
=============================  ==============================================================

The functions below are those decisions, in that order: :func:`affine_normalize` and
:func:`_program` (which program), :func:`kernel_moments` and :func:`group_moments` (the
kernel's statistics), :func:`exact_moments` and :func:`merged_moments` (Flax's program's
statistics). Counts, ``1/n`` and every sum are in at least float32; a group with no valid
element has mean 0, variance 0 and count 0.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm._axes import Axes, canonicalize_axes
from jaxnorm._config import Config, freeze_groups
from jaxnorm._dtypes import count_dtype, promote, real_dtype, reduction_dtype
from jaxnorm._engine import accelerators, gpu, kernel
from jaxnorm._engine.collectives import device_parts
from jaxnorm._engine.cpu import by_method
from jaxnorm._engine.gpu import row_moments, two_shifts
from jaxnorm._engine.inputs import broadcast_mask, check_epsilon, shaped_params
from jaxnorm._engine.maths import (
  Moments,
  Variance,
  group_sum,
  merged_sums,
  moments_of,
  over_groups,
  shifted_parts,
  shifts,
  squeezed,
  textbook_jvp,
  two_pass,
)
from jaxnorm._engine.platform import switch
from jaxnorm._engine.sharding import crosses_devices, on_mesh, sharded_axes
from jaxnorm._engine.tpu import moments_about


def affine_normalize(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  cfg: Config,
  *,
  epsilon: Any,
  mask: jax.Array | None = None,
  about: jax.Array | None = None,
) -> tuple[jax.Array, Moments]:
  """Normalizes ``x`` over ``cfg.axes`` with its own statistics and applies ``γ, β``.

  Args:
    x: the input, in any dtype (converted to ``cfg.dtype`` inside). Complex inputs (or
      parameters) take the exact two-pass statistics and JAX's own derivative.
    scale: optional ``γ`` in ``cfg.dtype``, broadcastable to ``x`` or of the feature shape
      (:func:`~jaxnorm._engine.inputs.affine_params`).
    bias: optional ``β``, the same.
    cfg: the normalization (axes, centring, ε's place, channel groups, devices, dtypes).
    epsilon: the constant (>= 0) added to the variance (or, with
      ``epsilon_in_root=False``, to the standard deviation); traced values work.
    mask: optional boolean mask broadcastable to ``x``; statistics use its True positions,
      every position is normalized, and groups without a valid element give ``x̂ = 0``.
    about: optional rough mean of each group (:func:`~jaxnorm._engine.tpu.rough_row_mean`, Add &
      LayerNorm), around which XLA:TPU sums; the statistics do not depend on it.

  Returns:
    ``(y, Moments)`` with ``y`` in ``cfg.out_dtype`` and the moments' reduced dimensions
    kept (size 1); with channel groups each group's statistics are repeated on its channels.
  """
  if mask is not None:
    mask = broadcast_mask(mask, x.shape)
  eps = jnp.asarray(check_epsilon(epsilon), real_dtype(cfg.dtype))
  if jnp.issubdtype(cfg.dtype, jnp.complexfloating) or any(
    jnp.iscomplexobj(a) for a in (x, scale, bias)
  ):
    return kernel.compiled_complex_normalize(x, scale, bias, mask, eps, cfg)
  return _compiled_affine_normalize(x, scale, bias, mask, eps, cfg, about)


def _program(x, scale, bias, mask, epsilon, cfg, about=None):
  """The program of a real call: the closed-form kernel with a mask, an ``axis_name`` or ε
  outside the root, and on XLA:CPU's single device; Flax's program with exact statistics
  (:mod:`~jaxnorm._engine.accelerators`) on a mesh and on every other platform."""
  if not accelerators.applies(x, scale, bias, mask, cfg):
    return kernel.normalize(x, scale, bias, mask, epsilon, cfg)
  if on_mesh(x):
    return accelerators.affine_normalize(x, scale, bias, epsilon, cfg, exact_moments)
  statistics = functools.partial(exact_moments, about=about)
  return switch(
    x,
    scale,
    bias,
    epsilon,
    like=x,
    cpu=lambda x, s, b, e: kernel.normalize(x, s, b, None, e, cfg),
    default=lambda x, s, b, e: accelerators.affine_normalize(x, s, b, e, cfg, statistics),
  )


# Compiled once per shape and configuration: eager calls run one XLA program instead of
# dispatching every operation; under an outer jit this is simply inlined.
_compiled_affine_normalize = jax.jit(shaped_params(_program), static_argnums=(5,))


def kernel_moments(x, scale, bias, mask, cfg, differentiated):
  """The closed-form kernel's statistics of ``x`` on its view
  (:func:`~jaxnorm._engine.kernel.view`), and whether they are XLA:CPU's fused rows. The
  variance: undifferentiated, two passes over short trailing rows and for channel groups,
  else ``Σx ∥ Σx²`` checked on XLA:CPU (its fastest forward) and the merged sums
  elsewhere; under differentiation the shifted sums (no ``lax.cond``, whose untaken
  branch XLA counts as traffic): ``benchmarks/RESULTS.md``, items 4, 9, 11, 34, 37, 38
  and 39. All are exact for any offset."""
  v = kernel.view(x.shape, cfg.axes, cfg.channel_groups, scale, bias, sharded=sharded_axes(x))
  variance, shift = Variance.CHECKED, None
  rows = v.axes == (len(v.groups) - 1,) and cfg.channel_groups is None
  fused_rows = not differentiated and rows and mask is None and cfg.axis_name is None
  if fused_rows:
    v = kernel.View(tuple((i,) for i in range(x.ndim)), cfg.axes, None)
    variance = Variance.TWO_PASS
  elif not differentiated and cfg.channel_groups is not None:
    variance = Variance.TWO_PASS  # (no cond, Flax's reads of x: items 37 and 39)
  elif differentiated:
    variance = Variance.SHIFTED
  if variance is Variance.SHIFTED or (cfg.channel_groups and variance is Variance.TWO_PASS):
    # Sliced from x itself, not from its view: XLA:CPU then reads them once (item 11).
    shift = shifts(x, cfg.axes, cfg.channel_groups)
    shift = None if shift is None else tuple(v(s).astype(cfg.dtype) for s in shift)
  return group_moments(v(x), v(mask), v.config(cfg), variance, shift), fused_rows


def group_moments(
  x: jax.Array,
  mask: jax.Array | None,
  cfg: Config,
  variance: Variance = Variance.TWO_PASS,
  shift: tuple[jax.Array, jax.Array] | None = None,
) -> Moments:
  """Moments of ``x`` over ``cfg.axes`` (and ``cfg.channel_groups``, see
  ``maths.group_sum``), in ``cfg.dtype``, with the reduced dims kept.

  On one device without a mask the centred variance comes from ``variance``
  (``maths.Variance``; with channel groups ``SHIFTED`` takes the two elements ``shift``
  from ``maths.shifts``, the two-pass formula when they are None; without, by
  :func:`_unmasked`, exact also where GSPMD shards a reduced axis); with a mask, for
  complex or empty inputs from the two-pass formula (``maths.two_pass``); across devices
  from each device's statistics combined in one collective (``collectives.device_parts``).
  Counts, ``1/n`` and every sum are in at least float32; the variance comes back in the
  real dtype, the count in the count dtype.
  """
  axes, groups, out_dtype = cfg.axes, cfg.channel_groups, jnp.dtype(cfg.dtype)
  raw = x
  # Half precision (force_float32_reductions=False) is summed in float32 and rounded at the
  # end, as jnp.mean does: a float16 sum of more than 65,504 ones overflows.
  x = x.astype(promote(out_dtype, jnp.float32))
  count_dt = count_dtype(x.dtype)
  if jnp.iscomplexobj(x) or x.size == 0:
    variance = Variance.TWO_PASS
  valid = None if mask is None else broadcast_mask(mask, x.shape)
  if valid is None:
    per_group = 1 if groups is None else x.shape[groups[0]] // groups[1]
    kept = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    count = jnp.full(kept, math.prod(x.shape[a] for a in axes) * per_group, count_dt)
  else:
    count = group_sum(valid, axes, groups, dtype=count_dt)
  inv_n = 1.0 / jnp.maximum(count, 1)

  def result(stats, count=count):
    mean, var = stats
    return Moments(mean.astype(out_dtype), var.astype(real_dtype(out_dtype)), count)

  if cfg.axis_name is not None:
    parts = device_parts(x, valid, count, inv_n, cfg)
    return result(moments_of(parts, None), parts[0].astype(count_dt))
  if valid is not None or not cfg.center or jnp.iscomplexobj(x) or not x.size:
    return result(two_pass(x, axes, groups, inv_n, valid, cfg.center))
  if groups is None and (shift is None or on_mesh(raw)):
    mean, var = _unmasked(raw, axes, variance, x.dtype)
  elif variance is Variance.SHIFTED and shift is not None:
    mean, var = moments_of(shifted_parts(x, axes, groups, shift, raw), None)
  else:  # (two passes on raw x: XLA:CPU's fastest for channel groups, items 21 and 39)
    about = None if shift is None else shift[0]
    mean, var = two_pass(x, axes, groups, inv_n, about=about, raw=raw)
  return result((mean, var))


def _unmasked(raw, axes, variance, dtype):
  """Mean and variance of ``raw`` over ``axes`` in ``dtype``: the merged shifted sums
  (:func:`merged_moments`) where ``raw`` lies on a mesh (XLA partitions them exactly, in
  one gather of each shard's sums) and on every platform but XLA:CPU (no conditional, one
  read of x); on XLA:CPU's single device, ``variance``'s method (its fastest forward:
  ``Σx ∥ Σx²`` checked, ``benchmarks/RESULTS.md``, item 38), with the same derivative."""
  if on_mesh(raw):
    return merged_moments(raw, axes, None, dtype)
  return switch(
    raw,
    like=raw,
    cpu=lambda raw: by_method(raw, axes, variance, dtype),
    default=lambda raw: merged_moments(raw, axes, None, dtype),
  )


def exact_moments(raw, axes, groups, dtype, about=None):
  """``(mean, var)`` of Flax's program on the accelerators and meshes: the merged sums
  (:func:`merged_moments`); with ``about`` (Add & LayerNorm's rough row mean,
  :func:`~jaxnorm._engine.tpu.rough_row_mean`), on TPUs the sums around it
  (:func:`~jaxnorm._engine.tpu.moments_about`)."""
  if about is None:
    return merged_moments(raw, axes, groups, dtype)
  return switch(
    raw,
    about,
    like=raw,
    tpu=lambda r, a: moments_about(r, a, axes, groups, dtype),
    default=lambda r, a: merged_moments(r, axes, groups, dtype),
  )


def _differentiated(raw, axes, groups, dtype):
  """The statistics under differentiation: the merged sums, except XLA:GPU's column
  reductions (reduced axes short of the last), whose variadic form it writes out (14|x|
  against Flax's 3): plain sums shifted by elements there (3|x|, RESULTS item 47), per
  index of the batch where they reduce over a batch of up to ``gpu.PER_SAMPLE_BATCH``
  (RESULTS items 70, 73)."""

  def merged(raw):  # (each channel's sums, merged over its channel group)
    return over_groups(merged_sums(raw, axes, dtype, known=groups is not None), groups)

  sharded = set(sharded_axes(raw)) & set(axes)
  # (explicit sharding cannot slice one element of a sharded axis: XLA:GPU's shifts per
  # index of the first reduced axis are sliced from the others)
  if raw.ndim - 1 in axes or sharded - set(axes[:1]) or (sharded and len(axes) == 1):
    parts = merged(raw)
  else:
    crosses = crosses_devices(raw, axes)
    per_outer = crosses or (axes[:1] == (0,) and raw.shape[0] <= gpu.PER_SAMPLE_BATCH)
    shifted = functools.partial(
      two_shifts, axes=axes, dtype=dtype, per_outer=per_outer, groups=groups
    )
    parts = switch(raw, like=raw, gpu=shifted, default=merged)
  if groups is None:  # (in the sums' own shape, as the norm's arithmetic: RESULTS item 79)
    return tuple(jnp.expand_dims(t, axes) for t in moments_of(squeezed(parts, axes), None))
  return moments_of(parts, None)


_under_differentiation = jax.custom_jvp(_differentiated, nondiff_argnums=(1, 2, 3))
_under_differentiation.defjvp(textbook_jvp(_under_differentiation))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def merged_moments(raw: jax.Array, axes: tuple[int, ...], groups: Any, dtype: Any) -> Any:
  """``(mean, var)`` of ``raw`` in ``dtype`` over ``axes`` and channel ``groups`` (kept
  dims), exact for any offset, with the textbook derivative (JAX differentiates no
  reduction with its own combiner). As :func:`_differentiated`, except XLA:GPU's
  undifferentiated rows (the last axis alone) of at most ``gpu.FUSED_ROW`` elements off a
  mesh: two passes, which it turns with the norm into one kernel (2|x| against Flax's 3;
  differentiated, 12|x| against 7)."""
  stats = functools.partial(_differentiated, axes=axes, groups=groups, dtype=dtype)
  # (over more axes it made no one kernel; over longer rows a slower one: gpu.FUSED_ROW)
  if axes != (raw.ndim - 1,) or on_mesh(raw) or raw.shape[-1] > gpu.FUSED_ROW:
    return stats(raw)
  rows = functools.partial(row_moments, axes=axes, groups=groups, dtype=dtype)
  return switch(raw, like=raw, gpu=rows, default=stats)


merged_moments.defjvp(textbook_jvp(_under_differentiation))


def moments(
  x: jax.Array,
  axes: Axes,
  *,
  center: bool = True,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  keepdims: bool = False,
) -> Moments:
  """Computes the mean and variance (or mean square) of ``x`` over ``axes``.

  The variance comes from sums shifted by an element of each group (the exact two-pass
  formula with a mask, across devices, over a sharded axis, and for complex or empty
  inputs), so it keeps full precision when the mean is large compared with the spread,
  unlike ``E[x**2] - E[x]**2``. For complex ``x`` the mean is complex and the variance is
  the real ``E|x − μ|²``; a size-0 reduced axis gives mean 0, variance 0 and count 0.

  Args:
    x: the input array, of any rank.
    axes: the axes to reduce over (int or sequence, negative allowed).
    center: if False, ``mean`` is 0 and ``var`` is the mean square ``mean(x**2)`` (RMS²).
    mask: optional boolean array broadcastable to ``x``; only its True positions enter the
      statistics. A group with no True position gets mean 0, var 0 and count 0.
    axis_name: optional name of a mapped axis (``pmap``, ``shard_map``, ``vmap``) to combine
      the statistics across: counts and sums are summed over it, so the result equals the
      statistics of the concatenated data, also when devices hold different valid counts.
    axis_index_groups: optional groups of indices along ``axis_name`` (see ``lax.psum``).
    dtype: minimum dtype of the statistics (default: ``x``'s dtype).
    force_float32_reductions: promote the statistics to at least float32 (default True).
    keepdims: keep the reduced axes as size-1 dimensions.

  Returns:
    A :class:`Moments` ``(mean, var, count)`` in the reduction dtype.

  >>> x = jnp.array([[1., 2., 3., 4.], [2., 3., 4., 5.]])
  >>> m = moments(x, axes=1)
  >>> m.mean.tolist(), m.var.tolist(), m.count.tolist()
  ([2.5, 3.5], [1.25, 1.25], [4.0, 4.0])
  """
  x = jnp.asarray(x)
  axes = canonicalize_axes(axes, x.ndim)
  stats_dtype = reduction_dtype(x.dtype, dtype, force_float32_reductions)
  groups = freeze_groups(axis_index_groups)
  cfg = Config(axes, (), center, axis_name=axis_name, axis_index_groups=groups, dtype=stats_dtype)
  return _compiled_moments(x, mask, cfg, keepdims)


def _moments(x, mask, cfg, keepdims):
  x = x.astype(cfg.dtype)
  stats = group_moments(x, mask, cfg, Variance.SHIFTED)
  if keepdims:
    return stats
  return Moments(*(jnp.squeeze(s, cfg.axes) for s in stats))


# One compiled program per shape, as the kernel's: eagerly, each of its operations was
# compiled and dispatched on its own.
_compiled_moments = jax.jit(_moments, static_argnums=(2, 3))
