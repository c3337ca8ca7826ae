"""The Pallas row kernels as each accelerator gets them, proven without a device (issue 55,
point 2): both layouts (the GPU's persistent backward grid, the TPU's per-core accumulating
one) against the float64 formulas in Pallas's interpreter at every shape class (rows that
do not fill a block, D = 768, 1,000, 4,096, 8,192 and 16,384, masked tails, Add & Norm);
their traffic by construction, read from the lowered ``pallas_call`` (block specs × grid on
TPUs, whole-array operands on GPUs), the least traffic plus the partial sums; and, where
the compilers are installed (CI installs each in its own step: ``.ci/run``), every kernel
compiled for TPU v5e and v6e (Mosaic, libtpu) and for an H100 (Triton, the CUDA plugin)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm._engine import pallas as _pallas
from tests.devices import h100_mesh, tpu_devices
from tests.test_pallas import EPS, _close, _data, _formula

CLASSES = (768, 1000, 4096, 8192, 16384)  # row lengths: GPT-2, ragged, Llama, wide, widest


@pytest.fixture(params=["gpu", "tpu"])
def layout(request, monkeypatch):
  """The interpreter standing in for each layout, with 8-row blocks (the TPU's by a smaller
  block budget) so that a few rows cross block edges, share the grid unevenly and, on the
  TPU's two cores, end in a clamped step; the caches are cleared so no program of the
  other layout is reused."""
  monkeypatch.setattr(_pallas, "INTERPRET_AS", request.param)
  monkeypatch.setattr(_pallas, "TPU_BLOCK", 1024)
  jax.clear_caches()
  yield request.param
  jax.clear_caches()


def _case(d, rows, add, masked, seed=0):
  x, r, g, b, ct = _data((rows, d), seed=seed, offset=0.0, spread=2.0)
  mask = None
  if masked:  # ragged tails (each row's last positions out) and one empty row
    valid = np.arange(d)[None, :] < (d - np.arange(rows)[:, None] * 7 % (d // 2 + 1))
    valid[1] = False
    mask = valid
  return x, (r if add else None), g, b, ct, mask


@pytest.mark.parametrize("d", CLASSES)
def test_every_shape_class_matches_the_formula(layout, d):
  """LayerNorm with a residual and a mask, and RMSNorm plain, at each row length: outputs
  and every gradient against float64 (19 rows: 3 blocks of 8, the last one partial, over
  3 GPU programs or 2 TPU cores)."""
  for center, add, masked in ((True, True, True), (False, False, False)):
    x, r, g, b, ct, mask = _case(d, 19, add, masked)
    bias = b if center else None

    def ours(x, r, g, *bb, center=center, add=add, mask=mask):
      kw = dict(epsilon=EPS, mask=mask, implementation="pallas")
      if add:
        fn = jaxnorm.add_layer_norm if center else jaxnorm.add_rms_norm
        return fn(x, r, g, *bb, **kw)[0]
      return (jaxnorm.layer_norm if center else jaxnorm.rms_norm)(x, g, *bb, **kw)

    args = (x, r if add else x, g) + ((bias,) if center else ())
    y, vjp = jax.vjp(ours, *args)
    grads = vjp(jnp.asarray(ct))
    with jax.enable_x64(True):

      def ref(x, r, g, *bb, center=center, add=add, mask=mask):
        m = None if mask is None else jnp.asarray(mask)
        return _formula(x, g, *(bb or (None,)), r if add else None, m, center, True, False)[0]

      y64, vjp64 = jax.vjp(ref, *(jnp.asarray(a, jnp.float64) for a in args))
      grads64 = vjp64(jnp.asarray(ct, jnp.float64))
    _close(y, y64, 2e-6)
    for i, (got, want) in enumerate(zip(grads, grads64, strict=True)):
      if i == 1 and not add:
        continue  # (the residual slot of the plain norm is unused)
      _close(got, want, 2e-5)


def test_the_tpu_backward_keeps_one_row_of_partials_per_core(layout):
  """The TPU's grid is (cores, steps) with the partials' block fixed per core (accumulated
  in VMEM over the steps), so dγ's partials are (2, 1, D) whatever the rows; the GPU's
  are (programs, D)."""
  d, rows = 100, 59
  spec = _pallas.RowSpec(d, True, True, False, True, True, False)
  x = jax.ShapeDtypeStruct((rows, d), jnp.float32)
  call = _backward_call(_pallas.Target(layout, interpret=True), spec, x)
  partials = [v.aval.shape for v in call.outvars[1:]]
  assert partials == ([(2, 1, d)] * 2 if layout == "tpu" else [(3, d)] * 2)


# -- traffic by construction ---------------------------------------------------------------


def _avals(spec, x, residual_dtype):
  """The abstract operands beside x: a row of parameters, ε, the mask (or None) and the
  residual stream's rows in ``residual_dtype`` (x itself without a residual)."""
  row = jax.ShapeDtypeStruct((1, spec.d), jnp.float32)
  eps = jax.ShapeDtypeStruct((1, 1), jnp.float32)
  mask = jax.ShapeDtypeStruct(x.shape, jnp.int8) if spec.has_mask else None
  h = jax.ShapeDtypeStruct(x.shape, residual_dtype) if spec.has_residual else x
  return row, eps, mask, h


def _kernel_call(fn, *args):
  """The one ``pallas_call`` of ``fn(*args)``'s jaxpr."""
  (call,) = [e for e in jax.make_jaxpr(fn)(*args).eqns if e.primitive.name == "pallas_call"]
  return call


def _backward_call(target, spec, x, gradients=1, residual_dtype=None):
  row, eps, mask, h = _avals(spec, x, residual_dtype)
  dtypes = (x.dtype, h.dtype)[:gradients]

  def backward(*a):
    return _pallas._backward_on(target, spec, *a, dtypes)

  scale = row if spec.has_scale else None
  return _kernel_call(backward, h, scale, mask, eps, x, h if spec.has_residual else None)


def _forward_call(target, spec, x, residual_dtype=None):
  row, eps, mask, h = _avals(spec, x, residual_dtype)
  h_dtype = h.dtype if spec.has_residual else None

  def forward(x, r, g, b, m, e):
    return _pallas._forward_on(target, spec, x, r, g, b, m, e, x.dtype, h_dtype)

  residual = h if spec.has_residual else None
  g, b = (row if spec.has_scale else None), (row if spec.has_bias else None)
  return _kernel_call(forward, x, residual, g, b, mask, eps)


def _block_shape(bm):
  """A block mapping's block shape as integers (``Blocked`` sizes or plain ints; a squeezed
  dimension, None, is 1)."""
  sizes = [getattr(b, "block_size", b) for b in bm.block_shape]
  return [1 if b is None else b for b in sizes]


def _nbytes(aval):
  return math.prod(aval.shape) * aval.dtype.itemsize


def _block_traffic(call):
  """Bytes a Mosaic pipeline moves for ``call``: for each operand and result, the part of
  its block inside the array, each time the block's index changes from the previous step
  of the same core (the grid's first axis is "parallel": each core starts afresh), read
  from the lowered block specs and index maps."""
  gm = call.params["grid_mapping"]
  grid = gm.grid
  if len(grid) == 1:  # one sequence of steps
    runs = [[(i,) for i in range(grid[0])]]
  else:  # (cores, steps)
    runs = [[(c, i) for i in range(grid[1])] for c in range(grid[0])]
  total = 0
  for bm in gm.block_mappings:
    shape = bm.array_aval.shape
    block = _block_shape(bm)
    itemsize = bm.array_aval.dtype.itemsize
    for run in runs:
      last = None
      for point in run:
        jaxpr = bm.index_map_jaxpr
        index = tuple(int(i) for i in jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *point))
        if index != last:
          extent = [min(b, n - i * b) for b, n, i in zip(block, shape, index, strict=True)]
          total += math.prod(extent) * itemsize
        last = index
  return total


TRAFFIC_CASES = [  # (rows, d, dtype, norm, Add & Norm's residual dtype or None, masked)
  (8192, 4096, jnp.bfloat16, "rms", None, False),
  (16384, 768, jnp.bfloat16, "layer", None, False),
  (8192, 4096, jnp.bfloat16, "rms", jnp.float32, False),
  (4099, 1000, jnp.float32, "layer", jnp.float32, True),
  (32768, 2048, jnp.bfloat16, "layer", None, False),
  (4096, 16384, jnp.bfloat16, "layer", None, False),
]


def _least(rows, d, dtype, norm, residual, masked, gradients):
  """The least traffic of each pass (bytes): the forward reads x (the residual, the mask,
  γ, β, ε) and writes y (and h); the backward reads x or h, dy (dh, the mask, γ, ε) and
  writes dx (and the residual's cotangent)."""
  n = rows * d
  x, h = n * jnp.dtype(dtype).itemsize, n * jnp.dtype(residual or dtype).itemsize
  m = n if masked else 0
  add = residual is not None
  forward = x + (2 * h if add else 0) + x + m + d * 4 * (2 if norm == "layer" else 1) + 4
  backward = (h if add else x) + x + (h if add else 0) + m + d * 4 + 4 + sum((x, h)[:gradients])
  return forward, backward


@pytest.mark.parametrize("rows, d, dtype, norm, residual, masked", TRAFFIC_CASES)
def test_tpu_traffic_by_construction_is_the_least_plus_a_row_of_partials_per_core(
  rows, d, dtype, norm, residual, masked
):
  """On TPUs (Mosaic's pipeline: block specs × grid), the forward moves exactly the least
  traffic and the backward the least plus γ and ε once more on the second core and one
  row of float32 partials per core and parameter: under 0.5 % of |x| here. (One row per
  block, as before, was 6 % of |x| per partial in bfloat16.)"""
  layer = norm == "layer"
  spec = _pallas.RowSpec(d, layer, True, residual is not None, True, layer, masked)
  x = jax.ShapeDtypeStruct((rows, d), dtype)
  gradients = 2 if residual is not None else 1
  tpu = _pallas.Target("tpu")
  least_fwd, least_bwd = _least(rows, d, dtype, norm, residual, masked, gradients)
  assert _block_traffic(_forward_call(tpu, spec, x, residual)) == least_fwd
  call = _backward_call(tpu, spec, x, gradients, residual)
  cores = call.params["grid_mapping"].grid[0]
  assert cores == 2
  partials = (2 if layer else 1) * cores * d * 4
  again = (cores - 1) * (d * 4 + 4)  # γ and ε, read by each core
  extra = _block_traffic(call) - least_bwd
  assert extra == partials + again, (extra, partials, again)
  assert extra / (rows * d * jnp.dtype(dtype).itemsize) < 0.005


@pytest.mark.parametrize("rows, d, dtype, norm, residual, masked", TRAFFIC_CASES)
def test_gpu_traffic_by_construction_is_the_least_plus_a_row_of_partials_per_program(
  rows, d, dtype, norm, residual, masked
):
  """On GPUs every array is one whole-array operand of the Triton call, which the programs
  index themselves, each row block once (the float64 tests above would catch a block
  skipped or summed twice), so the traffic is the operands and results: exactly the least,
  plus ``(programs, D)`` float32 partials per parameter, programs = min(the layout's, row
  blocks): 132 by rule (one per SM), 264 where ``GPU_TABLE`` holds an H200's measurement.
  Those partials are the price of the anchors' design: written and read, 2 × 4 × 132 × D
  bytes per parameter by rule, which is under 2 % of |x| only from about 26,000 rows in
  bfloat16 (RMSNorm: 13,000); at 4,096 × 16,384 it is 26 % of |x| for LayerNorm (5 % of
  the pass's 5|x|). Here: the exact sum."""
  layer = norm == "layer"
  spec = _pallas.RowSpec(d, layer, True, residual is not None, True, layer, masked)
  x = jax.ShapeDtypeStruct((rows, d), dtype)
  gradients = 2 if residual is not None else 1
  gpu = _pallas.Target("gpu")
  least_fwd, least_bwd = _least(rows, d, dtype, norm, residual, masked, gradients)
  for call, least in (
    (_forward_call(gpu, spec, x, residual), least_fwd),
    (_backward_call(gpu, spec, x, gradients, residual), least_bwd),
  ):
    gm = call.params["grid_mapping"]
    moved = sum(_nbytes(v.aval) for v in (*call.invars, *call.outvars))
    if call.params["name"].endswith("fwd"):
      assert moved == least
      continue
    programs = gm.grid[0]
    stream = dtype if residual is None else jnp.promote_types(dtype, residual)  # x or h
    cut = _pallas._layout(gpu, rows, d, jnp.dtype(stream).itemsize)
    assert programs == min(cut.programs, -(-rows // cut.rows))
    for bm in gm.block_mappings:  # whole arrays (the programs index them)
      assert all(b >= n for b, n in zip(_block_shape(bm), bm.array_aval.shape, strict=True))
    partials = [v.aval for v in call.outvars[gradients:]]
    assert all(p.shape == (programs, d) and p.dtype == jnp.float32 for p in partials)
    assert moved - least == sum(_nbytes(p) for p in partials)


def test_the_gpu_table_sets_blocks_warps_and_programs_per_row_length_and_dtype(monkeypatch):
  """An entry of ``GPU_TABLE`` (what a device measured) replaces the rule for its row length
  and element size only: the persistent grid's programs, the block's rows (its partials'
  shape and the kernel's loop follow) and Triton's warps."""
  spec = _pallas.RowSpec(1000, True, True, False, True, True, False)
  x = jax.ShapeDtypeStruct((8192, 1000), jnp.bfloat16)
  gpu = _pallas.Target("gpu")

  def cut(call):
    params = call.params["compiler_params"]
    params = getattr(params, "get", lambda _: params)("triton")  # (a dict of them, jax < 0.10)
    warps = params.num_warps
    return call.params["grid_mapping"].grid, call.outvars[1].aval.shape, warps

  assert cut(_backward_call(gpu, spec, x)) == ((264,), (264, 1000), 4)  # the H200's entry
  monkeypatch.delitem(_pallas.GPU_TABLE, (1024, 2))
  assert cut(_backward_call(gpu, spec, x)) == ((132,), (132, 1000), 8)  # the rule: 4 rows
  monkeypatch.setitem(_pallas.GPU_TABLE, (1024, 2), (16, 4, 66))
  assert cut(_backward_call(gpu, spec, x)) == ((66,), (66, 1000), 4)
  assert _pallas._layout(gpu, 8192, 1000, 2).rows == 16
  assert _pallas._layout(gpu, 8192, 1000, 4).rows == 4  # float32: still the rule
  assert _pallas._layout(gpu, 5, 1000, 2).rows == 8  # (no more rows than a block needs)


# -- compiled for the accelerators ---------------------------------------------------------


def _step(kind, shape, dtype, masked):
  """A forward+backward of one row norm (``kind``: layer, rms, add_layer, add_rms) with its
  abstract inputs."""
  d = shape[-1]
  x = jax.ShapeDtypeStruct(shape, dtype)
  p = jax.ShapeDtypeStruct((d,), jnp.float32)
  mask = np.ones(shape, bool) if masked else None
  kw = dict(mask=mask, implementation="pallas")
  if kind.startswith("add"):
    fn = jaxnorm.add_layer_norm if kind == "add_layer" else jaxnorm.add_rms_norm
    ins = [x, jax.ShapeDtypeStruct(shape, jnp.float32), p] + ([p] if kind == "add_layer" else [])

    def f(*a):
      return fn(*a, **kw)
  else:
    fn = jaxnorm.layer_norm if kind == "layer" else jaxnorm.rms_norm
    ins = [x, p] + ([p] if kind == "layer" else [])

    def f(*a):
      return fn(*a, **kw)

  def step(*a):
    *primals, ct = a
    y, vjp = jax.vjp(f, *primals)
    return y, vjp(ct)

  return step, [*ins, jax.eval_shape(f, *ins)]


COMPILED = [  # every row-length class, both dtypes, Add & Norm and masks across them
  (k, (4099, d), dt, m)
  for d in CLASSES
  for k, dt, m in (
    ("layer", jnp.bfloat16, False),
    ("rms", jnp.float32, True),
    ("add_layer", jnp.float32, True),
    ("add_rms", jnp.bfloat16, False),
  )
]


def _compiled_steps(mesh):
  """``(kind, shape, compiled text)`` of each :data:`COMPILED` step for ``mesh``'s device."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  replicated = NamedSharding(mesh, P())
  for kind, shape, dtype, masked in COMPILED:
    step, args = _step(kind, shape, dtype, masked)
    avals = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), args
    )
    yield kind, shape, jax.jit(step).lower(*avals).compile().as_text()


@pytest.mark.parametrize("topology", ["v5e:2x2", "v6e:2x2"])
def test_every_kernel_compiles_for_tpus(topology):
  """Mosaic compiles each kernel at every row length, both dtypes, masks and Add & Norm
  (32-row blocks at 16,384 columns ran out of VMEM; a mask combined with ``&`` failed to
  lay out)."""
  from jax.sharding import Mesh

  for kind, shape, text in _compiled_steps(Mesh(np.array(tpu_devices(topology)[:1]), ("d",))):
    assert text.count('custom_call_target="tpu_custom_call"') == 2, (kind, shape)


def test_every_kernel_compiles_for_an_h100():
  """Triton compiles each kernel for an H100 (the CUDA plugin, no GPU) at every row length,
  both dtypes, masks and Add & Norm: two Triton calls a step and nothing copied or
  converted after them (the residual's cotangent is written by the kernel)."""
  for kind, shape, text in _compiled_steps(h100_mesh()):
    assert text.count('custom_call_target="__gpu$xla.gpu.triton"') == 2, (kind, shape)
    entry = text[text.index("\nENTRY") :]
    assert " copy(" not in entry and "wrapped_convert" not in entry, (kind, shape)
