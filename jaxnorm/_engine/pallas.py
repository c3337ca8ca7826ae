"""Pallas kernels for the row norms: LayerNorm and RMSNorm over the last axis of a ``(R, D)``
array, optionally after a residual add (Add & Norm), forward and backward in one pass each.

A program holds ``BR`` whole rows, padded to a block of ``DP`` columns (a power of two for
Triton, a multiple of 128 for Mosaic); the padding and masked-out positions are excluded
with an iota mask, never multiplied away (their contents are undefined). Statistics are
recomputed in the backward kernel rather than stored: it reads ``x`` anyway, and the
per-row scaling below then matches the forward exactly.

Overflow: each row is scaled by a power of two ``s ≈ 1/max|x|`` (exact: no bit of the
input is lost) before its moments are taken, so the sums of squares stay finite for any
finite float32 input (issue 20, item 9), at the cost of one max per row, which is free in a
memory-bound kernel; rows with ``max|x| < 2`` are not scaled at all. With
``r' = 1/sqrt(var(s·x) + ε·s²)`` the output is ``(s·x − mean(s·x))·r'``, which equals
``(x − μ)/sqrt(σ² + ε)`` exactly in real arithmetic.

The backward kernel returns ``dx`` (plus the residual's cotangent, added in; in each
differentiated input's dtype, written by the kernel) and partial sums of ``dγ`` and
``dβ``, which the caller sums. On GPUs they come from a persistent grid of about as many
programs as the GPU has SMs, each looping over its row blocks and summing in float32
registers: ``(programs, D)`` partials whatever the rows (one row per block made them twice
the size of x at 4,096 features). On TPUs from a ``(cores, steps)`` grid whose partials'
block stays in VMEM across a core's steps: ``(2, 1, D)``.
On CPU the kernels run in Pallas's interpret mode (the tests; either layout:
:data:`INTERPRET_AS`), on NVIDIA and AMD GPUs through Triton, on TPU through Mosaic;
:func:`forward` and :func:`backward` trace each platform's kernel and let the lowering
keep its own (:func:`jaxnorm._engine.platform.every_platform`), so one exported program
carries each.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxnorm._engine.platform import every_platform

MAX_ROW = 16384  # the longest row one block holds (columns after padding)


class RowSpec(NamedTuple):
  """What a row kernel computes: static, part of the kernel's identity."""

  d: int  # valid columns per row
  center: bool  # LayerNorm (True) or RMSNorm (False)
  epsilon_in_root: bool
  has_residual: bool
  has_scale: bool
  has_bias: bool
  has_mask: bool


class Target(NamedTuple):
  """Where a kernel runs: its ``layout`` ("gpu": Triton, masked accesses and a persistent
  backward grid; "tpu": Mosaic's padded blocks and a per-core accumulating grid) and whether
  Pallas's interpreter stands in for it (on the CPU)."""

  layout: str
  interpret: bool = False


# The layout the interpreter (CPU) runs: the GPU's; the tests also run the TPU's.
INTERPRET_AS = "gpu"


def _next_power_of_2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


class Layout(NamedTuple):
  """How a kernel is cut: ``rows`` per block, ``columns`` padded, Triton's ``warps`` and the
  backward's ``programs`` (GPUs: the persistent grid; TPUs: the cores)."""

  rows: int
  columns: int
  warps: int
  programs: int


TPU_BLOCK = 262144  # elements of a TPU block (1 MiB in float32)
# GPU layouts measured on a device (benchmarks/pallas_tune.py), per (padded row length,
# bytes of an element of x): (rows per block, warps, programs), each entry committed with
# the results that chose it; other row lengths take the rule of :func:`_layout`. These:
# LayerNorm forward+backward on an H200 (132 SMs, as an H100), 0.70-0.74x the rule's time
# (results/nvidia-h200/pallas_tune.md, RESULTS item 71).
GPU_TABLE: dict[tuple[int, int], tuple[int, int, int]] = {
  (1024, 2): (8, 4, 264),
  (2048, 2): (2, 4, 264),
  (4096, 2): (1, 8, 264),
}
SMS = 132  # an H100's streaming multiprocessors: the persistent grid's programs by rule
CORES = 2  # TPU cores the backward's grid splits its row blocks over ("parallel"; megacore
# chips run one half on each, one-core chips both in turn)


def _layout(target: Target, rows: int, d: int, itemsize: int) -> Layout:
  """The cut of ``rows`` rows of ``d`` elements of ``itemsize`` bytes for ``target``."""
  if target.layout == "tpu":  # (8, 128) tiles: the most rows (a power of two, 8 to 512) whose
    # float32 block is at most 1 MiB: the kernels' buffers and temporaries then fit the
    # 16 MiB of VMEM Mosaic allows by default (32 rows at 16,384 columns did not compile)
    dp = -(-d // 128) * 128
    br = max(8, min(512, 1 << (max(1, TPU_BLOCK // dp).bit_length() - 1)))
    return Layout(rows if rows < br else br, dp, 0, CORES)
  dp = _next_power_of_2(d)
  if target.interpret:  # small blocks and few programs: the tests cross block edges and
    # the persistent grid's programs loop, the last one's share short
    return Layout(8, dp, 0, 3)
  br, warps, programs = GPU_TABLE.get((dp, itemsize), gpu_rule(dp))
  return Layout(max(1, min(_next_power_of_2(rows), br)), dp, warps, programs)


def gpu_rule(dp: int) -> tuple[int, int, int]:
  """The GPU layout where :data:`GPU_TABLE` has no entry: 4,096 elements a block (a row at
  least), 8 warps (fewer where the block holds under 512 elements a warp), a program per
  SM."""
  return max(1, 4096 // dp), 8, SMS


def _compiler_params(target: Target, cut: Layout, semantics: Any = None) -> dict[str, Any]:
  """``pallas_call``'s lowering options; ``semantics``: Mosaic's dimension semantics."""
  if target.interpret:
    return dict(interpret=True)
  if target.layout == "gpu":
    from jax.experimental.pallas import triton as pltriton

    warps = min(cut.warps, max(cut.rows * cut.columns // 512, 1))  # (no more than the block fills)
    return dict(compiler_params=pltriton.CompilerParams(num_warps=warps))
  if semantics is None:
    return {}
  from jax.experimental.pallas import tpu as pltpu

  return dict(compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))


def _unpack(
  refs: Any, spec: RowSpec, inputs: tuple[str, ...], outputs: tuple[str, ...], gradients: int = 1
) -> dict[str, Any]:
  """The kernel's refs by name (the optional ones present per ``spec``; ``gradients``: how
  copies of ``dx`` the backward writes: ``dx``, then ``dx2``)."""
  present = dict(
    residual=spec.has_residual, scale=spec.has_scale, bias=spec.has_bias, mask=spec.has_mask,
    h=spec.has_residual, dh=spec.has_residual, dscale=spec.has_scale, dbias=spec.has_bias,
    dx=gradients >= 1, dx2=gradients == 2,
  )  # fmt: skip
  names = [n for n in inputs + outputs if present.get(n, True)]
  return dict(zip(names, refs, strict=False))


def _row_statistics(x: Any, valid: Any, eps: Any, spec: RowSpec) -> tuple[Any, ...]:
  """The parts of ``(xs − mean')·r'``, per row: ``xs = s·x`` (every position), the scaled mean,
  ``r'``, the scale ``s``, the valid count ``n`` and ``sqrt(var')`` (see the module doc)."""
  x0 = jnp.where(valid, x, 0.0)
  n = jnp.sum(valid.astype(jnp.float32), axis=1, keepdims=True)
  s = _power_of_2_scale(jnp.max(jnp.abs(x0), axis=1, keepdims=True))
  xs = x * s
  inv_n = 1.0 / jnp.maximum(n, 1.0)
  mean = jnp.sum(jnp.where(valid, xs, 0.0), axis=1, keepdims=True) * inv_n if spec.center else 0.0
  xc = jnp.where(valid, xs - mean, 0.0)
  var = jnp.sum(xc * xc, axis=1, keepdims=True) * inv_n
  std = jnp.sqrt(var)
  if spec.epsilon_in_root:
    r = lax.rsqrt(var + eps * s * s)
  else:
    r = 1.0 / (std + eps * s)
  if spec.has_mask:
    r = jnp.where(n > 0, r, 0.0)  # a row with no valid element: x̂ = 0, no NaN
  return xs, mean, r, s, inv_n, std


def _power_of_2_scale(a):
  """``2^-E`` for ``a = 1.m·2^E``, E clamped to [0, 126] (a normal float32): exact to
  multiply by, so the scaled row keeps every bit of the input."""
  exponent = (lax.bitcast_convert_type(a, jnp.int32) >> 23) - 127
  exponent = jnp.clip(exponent, 0, 126)
  return lax.bitcast_convert_type((127 - exponent) << 23, jnp.float32)


def _valid(x: Any, spec: RowSpec, mask_ref: Any, block: Any = None) -> Any:
  col = lax.broadcasted_iota(jnp.int32, x.shape, 1)
  valid = col < spec.d
  if mask_ref is not None:
    valid = _and_mask(valid, _get(mask_ref, block))
  return valid


def _and_mask(columns: Any, mask: Any) -> Any:
  """``columns & (mask != 0)`` as a select: Mosaic lays the column test out replicated over
  rows and cannot relayout the mask's booleans to match (an ``&`` failed to compile)."""
  return jnp.where(columns, mask.astype(jnp.int32), 0) != 0


def _bounds(shape: tuple[int, ...], d: int, rows: int | None = None, br: int = 0) -> Any:
  """Which positions of a block (rows ``br`` at a time, columns padded to ``DP``) lie
  inside the array of ``rows`` rows (None: a block of shared parameters) and ``d``
  columns."""
  inside = lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1) < d
  if rows is not None:
    row = pl.program_id(0) * br + lax.broadcasted_iota(jnp.int32, shape, 0)
    inside = inside & (row < rows)
  return inside


def _masks(spec: RowSpec, rows: int, br: int, masked: bool) -> tuple[Any, Any]:
  """The ``inside`` of :func:`_get`/:func:`_put` for the row blocks and for the shared
  parameters' blocks: :func:`_bounds` where ``masked`` (Triton), else None for both."""
  if not masked:
    return None, None
  rows_block = functools.partial(_bounds, d=spec.d, rows=rows, br=br)
  return rows_block, functools.partial(_bounds, d=spec.d)


def _get(ref: Any, inside: Any) -> Any:
  """``ref[...]``; on Triton (``inside`` given) masked to the array: Triton neither masks nor
  pads an access past the array's edge, and a padded row's tail is the next row's head."""
  if inside is None:
    return ref[...]
  from jax.experimental.pallas import triton as plgpu

  return plgpu.load(ref, mask=inside(ref.shape), other=jnp.zeros((), ref.dtype))


def _put(ref: Any, value: Any, inside: Any) -> None:
  """``ref[...] = value``, masked like :func:`_get` (unmasked, the padding would overwrite
  the next row's output, and the last block's would write past the array)."""
  if inside is None:
    ref[...] = value
  else:
    from jax.experimental.pallas import triton as plgpu

    plgpu.store(ref, value, mask=inside(ref.shape))


def _forward_kernel(*refs: Any, spec: RowSpec, rows: int, br: int, masked: bool) -> None:
  r = _unpack(refs, spec, ("x", "residual", "scale", "bias", "mask", "eps"), ("y", "h"))
  block, shared = _masks(spec, rows, br, masked)
  x = _get(r["x"], block)
  if spec.has_residual:
    h = x.astype(r["h"].dtype) + _get(r["residual"], block).astype(r["h"].dtype)
    _put(r["h"], h, block)
    x = h
  x = x.astype(jnp.float32)
  valid = _valid(x, spec, r.get("mask"), block)
  xs, mean, rs, _, _, _ = _row_statistics(x, valid, _get(r["eps"], shared), spec)
  y = (xs - mean) * rs
  if spec.has_scale:
    y = y * _get(r["scale"], shared).astype(jnp.float32)
  if spec.has_bias:
    y = y + _get(r["bias"], shared).astype(jnp.float32)
  _put(r["y"], y.astype(r["y"].dtype), block)


def _backward_block(x, dy, dh, scale, mask, eps, live, spec):
  """One block's backward: ``dx`` (float32) and the block's sums of ``dy·x̂`` and ``dy``
  over its live rows (``(DP,)`` each); ``x``, ``dy``, ``dh``, ``mask`` ``(BR, DP)``
  blocks (``dh``, ``mask`` None when absent), ``scale`` ``(1, DP)`` or None, ``live``
  which rows of the block lie inside the array."""
  x = x.astype(jnp.float32)
  col = lax.broadcasted_iota(jnp.int32, x.shape, 1)
  columns = col < spec.d
  valid = columns if mask is None else _and_mask(columns, mask)
  if spec.has_mask:  # garbage padding (NaN, inf) must not reach the sums of g·x̂ and dy·x̂
    x = jnp.where(valid | jnp.isfinite(x), x, 0.0)
  xs, mean, rs, s, inv_n, std = _row_statistics(x, valid, eps, spec)
  xhat = jnp.where(columns, (xs - mean) * rs, 0.0)
  dy = jnp.where(columns, dy.astype(jnp.float32), 0.0)
  g = jnp.where(columns, dy * scale.astype(jnp.float32), 0.0) if spec.has_scale else dy
  # dx = r·g − [valid]·(r·mean(g) − c·x̂·mean(g·x̂)), the means over all positions divided
  # by the valid count; r = s·r' and c = −r in the root, −1/σ = −s/sqrt(var') outside it.
  rstd = rs * s
  c = -rstd if spec.epsilon_in_root else jnp.where(std > 0, -s / jnp.where(std > 0, std, 1.0), 0.0)
  g2 = jnp.sum(g * xhat, axis=1, keepdims=True) * inv_n
  correction = -c * xhat * g2
  if spec.center:
    correction = correction + rstd * jnp.sum(g, axis=1, keepdims=True) * inv_n
  dx = rstd * g - jnp.where(valid, correction, 0.0)
  if spec.has_residual:
    dx = dx + dh.astype(jnp.float32)
  dscale = jnp.sum(jnp.where(live, dy * xhat, 0.0), axis=0)
  dbias = jnp.sum(jnp.where(live, dy, 0.0), axis=0)
  return dx, dscale, dbias


BACKWARD_REFS = ("x", "scale", "mask", "eps", "dy", "dh"), ("dx", "dx2", "dscale", "dbias")


def _backward_kernel(
  *refs: Any, spec: RowSpec, rows: int, br: int, steps: int, gradients: int
) -> None:
  """TPUs: a ``(cores, steps)`` grid, core ``c`` taking row blocks ``c·steps + i`` in order
  (Mosaic pads the edge blocks, so no access is masked) and summing ``dγ`` and ``dβ`` into
  its own row of partials, which stays in VMEM across its steps (one row per core, not per
  block: 32-row blocks made them 6 % of x's bytes per partial in bfloat16). A step past the
  last block re-reads the last (its index is clamped) and rewrites the same ``dx``; its
  rows count as dead."""
  r = _unpack(refs, spec, *BACKWARD_REFS, gradients)
  x = r["x"][...]
  start = (pl.program_id(0) * steps + pl.program_id(1)) * br
  live = (start + lax.broadcasted_iota(jnp.int32, x.shape, 0)) < rows
  dx, dscale, dbias = _backward_block(
    x, r["dy"][...], r["dh"][...] if spec.has_residual else None,
    r["scale"][...] if spec.has_scale else None, r["mask"][...] if spec.has_mask else None,
    r["eps"][...], live, spec,
  )  # fmt: skip
  for name in ("dx", "dx2")[:gradients]:
    r[name][...] = dx.astype(r[name].dtype)
  sums = [
    (r[n], v)
    for n, v, k in (("dscale", dscale, spec.has_scale), ("dbias", dbias, spec.has_bias))
    if k
  ]

  @pl.when(pl.program_id(1) == 0)
  def _():
    for ref, _ in sums:
      ref[...] = jnp.zeros(ref.shape, ref.dtype)

  for ref, value in sums:
    ref[...] += value[None, None]


def _persistent_backward_kernel(
  *refs: Any,
  spec: RowSpec,
  rows: int,
  br: int,
  dp: int,
  programs: int,
  masked: bool,
  gradients: int,
) -> None:
  """A persistent grid (GPUs): ``programs`` programs, each looping over the row blocks
  ``pid, pid + programs, ...``, summing ``dγ`` and ``dβ`` in float32 registers and writing
  one row of ``(programs, D)`` partials, instead of a row per block (at 4,096 features a
  block is one row: partials twice the size of x). The refs are whole arrays, each access
  masked to them (Triton; the interpreter pads them to whole blocks)."""
  r = _unpack(refs, spec, *BACKWARD_REFS, gradients)
  pid = pl.program_id(0)
  columns = pl.ds(0, dp)

  def load(ref, index, inside):
    if not masked:
      return ref[index]
    from jax.experimental.pallas import triton as plgpu

    return plgpu.load(ref.at[index], mask=inside, other=jnp.zeros((), ref.dtype))

  def store(ref, index, value, inside):
    if not masked:
      ref[index] = value
    else:
      from jax.experimental.pallas import triton as plgpu

      plgpu.store(ref.at[index], value, mask=inside)

  in_row = lax.broadcasted_iota(jnp.int32, (1, dp), 1) < spec.d
  eps = load(r["eps"], (pl.ds(0, 1), pl.ds(0, 1)), jnp.ones((1, 1), bool))
  scale = load(r["scale"], (pl.ds(0, 1), columns), in_row) if spec.has_scale else None

  def body(i, sums):
    start = (pid + i * programs) * br
    index = (pl.ds(start, br), columns)
    live = (start + lax.broadcasted_iota(jnp.int32, (br, dp), 0)) < rows
    inside = live & (lax.broadcasted_iota(jnp.int32, (br, dp), 1) < spec.d)
    dx, dscale, dbias = _backward_block(
      load(r["x"], index, inside), load(r["dy"], index, inside),
      load(r["dh"], index, inside) if spec.has_residual else None, scale,
      load(r["mask"], index, inside) if spec.has_mask else None, eps, live, spec,
    )  # fmt: skip
    for name in ("dx", "dx2")[:gradients]:
      store(r[name], index, dx.astype(r[name].dtype), inside)
    return sums[0] + dscale, sums[1] + dbias

  blocks = pl.cdiv(rows, br)
  steps = (blocks - pid + programs - 1) // programs
  zeros = jnp.zeros((dp,), jnp.float32)
  dscale, dbias = lax.fori_loop(0, steps, body, (zeros, zeros))
  own = (pl.ds(pid, 1), columns)
  if spec.has_scale:
    store(r["dscale"], own, dscale[None], in_row)
  if spec.has_bias:
    store(r["dbias"], own, dbias[None], in_row)


def _row_block(br: int, dp: int) -> pl.BlockSpec:
  return pl.BlockSpec((br, dp), lambda i: (i, 0))


def _fixed_block(shape: tuple[int, ...]) -> pl.BlockSpec:
  """A block at the origin at every point of any grid: shared parameters, ε, and the
  arrays the GPU's persistent programs index themselves."""
  return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def _forward_on(target, spec, x, residual, scale, bias, mask, eps, y_dtype, h_dtype):
  rows = x.shape[0]
  cut = _layout(target, rows, spec.d, x.dtype.itemsize)
  br, dp = cut.rows, cut.columns
  operands = [x, residual, scale, bias, mask, eps]
  blocks = [_row_block(br, dp), _row_block(br, dp), _fixed_block((1, dp)), _fixed_block((1, dp)),
            _row_block(br, dp), _fixed_block((1, 1))]  # fmt: skip
  keep = [o is not None for o in operands]
  out_shape = [jax.ShapeDtypeStruct(x.shape, y_dtype)]
  out_blocks = [_row_block(br, dp)]
  if spec.has_residual:
    out_shape.append(jax.ShapeDtypeStruct(x.shape, h_dtype))
    out_blocks.append(_row_block(br, dp))
  outs = pl.pallas_call(
    functools.partial(_forward_kernel, spec=spec, rows=rows, br=br, masked=target.layout == "gpu"),
    out_shape=tuple(out_shape),
    grid=(pl.cdiv(rows, br),),
    in_specs=[b for b, k in zip(blocks, keep, strict=False) if k],
    out_specs=tuple(out_blocks),
    name="jaxnorm_row_norm_fwd",
    **_compiler_params(target, cut),
  )(*(o for o, k in zip(operands, keep, strict=False) if k))
  return outs[0], (outs[1] if spec.has_residual else None)


def _backward_on(target, spec, x, scale, mask, eps, dy, dh, dx_dtypes):
  rows = x.shape[0]
  cut = _layout(target, rows, spec.d, x.dtype.itemsize)
  br, dp = cut.rows, cut.columns
  blocks = pl.cdiv(rows, br)
  semantics = None
  grid: tuple[int, ...]
  if target.layout == "tpu":  # a row of partials per core (see _backward_kernel)
    grid = (min(cut.programs, blocks), pl.cdiv(blocks, min(cut.programs, blocks)))
    steps = grid[1]
    row = pl.BlockSpec((br, dp), lambda c, i: (jnp.minimum(c * steps + i, blocks - 1), 0))
    kernel = functools.partial(
      _backward_kernel, spec=spec, rows=rows, br=br, steps=steps, gradients=len(dx_dtypes)
    )
    partial = jax.ShapeDtypeStruct((grid[0], 1, spec.d), jnp.float32)
    partial_block = pl.BlockSpec((1, 1, dp), lambda c, i: (c, 0, 0))
    semantics = ("parallel", "arbitrary")
  else:  # the persistent grid: each array one block of whole row blocks and padded
    # columns, which every program indexes itself (past the array's edge, Triton's
    # accesses are masked and the interpreter pads)
    grid = (min(cut.programs, blocks),)
    row = _fixed_block((blocks * br, dp))
    kernel = functools.partial(
      _persistent_backward_kernel, spec=spec, rows=rows, br=br, dp=dp, programs=grid[0],
      masked=not target.interpret, gradients=len(dx_dtypes),
    )  # fmt: skip
    partial = jax.ShapeDtypeStruct((grid[0], spec.d), jnp.float32)
    partial_block = _fixed_block((grid[0], dp))
  operands = [x, scale, mask, eps, dy, dh]
  keep = [o is not None for o in operands]
  in_blocks = [row, _fixed_block((1, dp)), row, _fixed_block((1, 1)), row, row]
  out_shape = [jax.ShapeDtypeStruct(x.shape, dt) for dt in dx_dtypes]
  out_blocks = [row] * len(dx_dtypes)
  for present in (spec.has_scale, spec.has_bias):
    if present:
      out_shape.append(partial)
      out_blocks.append(partial_block)
  outs = pl.pallas_call(
    kernel,
    out_shape=tuple(out_shape),
    grid=grid,
    in_specs=[b for b, k in zip(in_blocks, keep, strict=False) if k],
    out_specs=tuple(out_blocks),
    name="jaxnorm_row_norm_bwd",
    **_compiler_params(target, cut, semantics),
  )(*(o for o, k in zip(operands, keep, strict=False) if k))
  outs = list(outs)
  dx = tuple(outs.pop(0) for _ in dx_dtypes)
  summed = tuple(range(len(partial.shape) - 1))  # (over the programs or cores)
  dscale = outs.pop(0).sum(summed) if spec.has_scale else None
  dbias = outs.pop(0).sum(summed) if spec.has_bias else None
  return dx, dscale, dbias


def _per_platform(fn, *args):
  """``fn(target, *args)`` lowered per platform: Triton on GPUs, Mosaic on TPU, the
  interpreter elsewhere (CPU) in the :data:`INTERPRET_AS` layout."""
  leaves, tree = jax.tree.flatten(args)

  def branch(target):
    return lambda *leaves: fn(target, *jax.tree.unflatten(tree, leaves))

  return every_platform(
    *leaves, gpu=branch(Target("gpu")), tpu=branch(Target("tpu")),
    default=branch(Target(INTERPRET_AS, interpret=True)),
  )  # fmt: skip


def forward(
  spec: RowSpec,
  x: jax.Array,
  residual: jax.Array | None,
  scale: jax.Array | None,
  bias: jax.Array | None,
  mask: jax.Array | None,
  epsilon: jax.Array,
  y_dtype: Any,
  h_dtype: Any,
) -> tuple[jax.Array, jax.Array | None]:
  """``(y, h)`` of rows ``x`` (``(R, D)``; ``residual`` added first when given, ``h`` then
  the sum in ``h_dtype``, else None); ``scale``/``bias`` of shape ``(1, D)``, ``mask``
  ``(R, D)`` int8, ``epsilon`` a ``(1, 1)`` float32 array."""
  fn = functools.partial(_forward_on, y_dtype=jnp.dtype(y_dtype), h_dtype=h_dtype)
  return _per_platform(lambda p, *a: fn(p, spec, *a), x, residual, scale, bias, mask, epsilon)


def backward(
  spec: RowSpec,
  x: jax.Array,
  scale: jax.Array | None,
  mask: jax.Array | None,
  epsilon: jax.Array,
  dy: jax.Array,
  dh: jax.Array | None,
  dx_dtypes: tuple[Any, ...],
) -> tuple[tuple[jax.Array, ...], jax.Array | None, jax.Array | None]:
  """``(dxs, dscale, dbias)`` for the cotangent ``dy`` of :func:`forward`'s ``y`` at rows
  ``x`` (the normalized input: ``h`` for Add & Norm, whose cotangent ``dh`` is added to
  ``dx``): ``dx`` in each of ``dx_dtypes`` (none to two: Add & Norm's input and residual
  each get their own, written by the kernel rather than copied or converted after it);
  ``dscale``/``dbias`` of shape ``(D,)`` in float32, None when absent."""
  fn = functools.partial(_backward_on, dx_dtypes=tuple(jnp.dtype(t) for t in dx_dtypes))
  return _per_platform(lambda p, *a: fn(p, spec, *a), x, scale, mask, epsilon, dy, dh)
