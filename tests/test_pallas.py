"""The Pallas row kernels (``implementation="pallas"``), run in Pallas's interpreter on CPU:
outputs and every gradient against the float64 formulas, rows that do not fill a block, row
lengths that are not a power of two, masks, half precision, Add & Norm, the transforms, the
modules, the errors, and lowering for GPUs (Triton) and TPUs (Mosaic)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference

# name -> (function, its keywords, the reference's (center, ε in the root, zero-centred))
NORMS = {
  "layer": (jaxnorm.layer_norm, {}, (True, True, False)),
  "rms": (jaxnorm.rms_norm, {}, (False, True, False)),
  "rms_eps_outside": (jaxnorm.rms_norm, dict(epsilon_in_root=False), (False, False, False)),
  "rms_zero_centered": (jaxnorm.rms_norm, dict(zero_centered_scale=True), (False, True, True)),
}
ADD = {"layer": jaxnorm.add_layer_norm, "rms": jaxnorm.add_rms_norm}
EPS = 1e-2  # large enough that ε's place changes the answer by far more than the tolerance


def _formula(x, g, b, residual, mask, center, in_root, zero_centered):
  """The norm from its definition in float64 ``jnp`` (differentiable), returning ``(y, h)``."""
  h = x if residual is None else x + residual
  w = jnp.ones_like(h) if mask is None else mask.astype(h.dtype)
  count = w.sum(-1, keepdims=True)
  n = jnp.maximum(count, 1)
  mean = (w * h).sum(-1, keepdims=True) / n if center else 0.0
  var = (w * (h - mean) ** 2).sum(-1, keepdims=True) / n
  xhat = (h - mean) / (jnp.sqrt(var + EPS) if in_root else jnp.sqrt(var) + EPS)
  xhat = jnp.where(count > 0, xhat, 0.0)  # a row with no valid element: x̂ = 0

  def row(a):
    return jnp.reshape(a, (1,) * (h.ndim - 1) + (-1,))

  gamma = row(1 + g if zero_centered else g)
  return xhat * gamma + (0.0 if b is None else row(b)), h


def _data(shape, seed=0, offset=3.0, spread=0.1):
  """Off-centre rows of small spread: the mean and ε both matter (σ² ≈ ε)."""
  rng = np.random.default_rng(seed)
  d = shape[-1]
  return (
    rng.normal(offset, spread, shape).astype(np.float32),
    rng.normal(0.0, 0.1, shape).astype(np.float32),
    rng.normal(1.0, 0.5, d).astype(np.float32),
    rng.normal(0.0, 0.5, d).astype(np.float32),
    rng.normal(size=shape).astype(np.float32),
  )


def _close(ours, ref, tol):
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  np.testing.assert_allclose(ours, ref, atol=tol * max(1.0, np.abs(ref).max()), rtol=0)


# (59, 100): 8 blocks of 8 rows in the interpreter, the last one partial, over 3 programs
# of the persistent backward grid (3, 3 and 2 blocks each).
SHAPES = [(59, 100), (2, 3, 33), (1, 1), (9, 128), (3, 257)]


# Every shape (blocks, odd and padded rows) for LayerNorm and RMSNorm; the RMS options
# change only per-row factors, so two shapes each (interpret mode costs ~5 s a case).
@pytest.mark.parametrize(
  "name, shape",
  [(n, s) for n in ("layer", "rms") for s in SHAPES]
  + [(n, s) for n in ("rms_eps_outside", "rms_zero_centered") for s in (SHAPES[0], SHAPES[-1])],
)
def test_forward_and_gradients_match_the_formula(name, shape):
  fn, kw, (center, in_root, zc) = NORMS[name]
  x, _, g, b, ct = _data(shape, offset=3.0 if center else 0.0)
  bias = b if name != "rms" else None

  def f(x, g, *bb):
    return fn(x, g, *bb, epsilon=EPS, implementation="pallas", **kw)

  args = (x, g) + ((bias,) if bias is not None else ())
  y, vjp = jax.vjp(f, *args)
  grads = vjp(jnp.asarray(ct))
  with jax.enable_x64(True):

    def ref(x, g, *bb):
      return _formula(x, g, *(bb or (None,)), None, None, center, in_root, zc)[0]

    y64, vjp64 = jax.vjp(ref, *(jnp.asarray(a, jnp.float64) for a in args))
    grads64 = vjp64(jnp.asarray(ct, jnp.float64))
  _close(y, y64, 1e-5)  # (|μ|/σ = 30: the XLA path is 1e-6 off too)
  if name == "layer":  # and the NumPy reference of the suite
    _close(y, reference.layer_norm(x, g, b, eps=EPS), 1e-5)
  for ours, ref64 in zip(grads, grads64, strict=True):
    _close(ours, ref64, 2e-5)
  # The inputs tell ε apart (σ² ≈ ε): another ε changes the output by far more than 1e-5.
  other = fn(x, g, *args[2:], epsilon=1.0, **kw)
  assert shape[-1] == 1 or np.abs(np.asarray(y) - np.asarray(other)).max() > 0.1


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name", ["layer", "rms"])
def test_half_precision_rounds_like_the_xla_path(name, dtype):
  fn, kw, _ = NORMS[name]
  x, _, g, b, ct = _data((13, 100), offset=0.0, spread=1.0)
  xh, cth = jnp.asarray(x, dtype), jnp.asarray(ct, dtype)

  def run(impl):
    def f(x, g):
      return fn(x, g, epsilon=EPS, implementation=impl, dtype=dtype, **kw)

    y, vjp = jax.vjp(f, xh, jnp.asarray(g))
    return (y, *vjp(cth))

  for ours, xla in zip(run("pallas"), run("xla"), strict=True):
    assert ours.dtype == xla.dtype
    _close(ours, xla, 1e-2 if ours.dtype == dtype else 1e-3)


@pytest.mark.parametrize("name", sorted(ADD))
def test_add_and_norm_fuses_both_cotangents(name):
  center = name == "layer"
  x, r, g, b, ct = _data((3, 5, 96), offset=0.0, spread=1.0)
  ct_h = np.random.default_rng(3).normal(size=x.shape).astype(np.float32)

  def f(*a):
    return ADD[name](*a, epsilon=EPS, implementation="pallas")

  (y, h), vjp = jax.vjp(f, x, r, g, b)
  grads = vjp((jnp.asarray(ct), jnp.asarray(ct_h)))
  with jax.enable_x64(True):

    def ref(x, r, g, b):
      return _formula(x, g, b, r, None, center, True, False)

    (y64, h64), vjp64 = jax.vjp(ref, *(jnp.asarray(a, jnp.float64) for a in (x, r, g, b)))
    grads64 = vjp64((jnp.asarray(ct, jnp.float64), jnp.asarray(ct_h, jnp.float64)))
  _close(y, y64, 2e-6)
  _close(h, h64, 1e-7)
  for ours, ref64 in zip(grads, grads64, strict=True):
    _close(ours, ref64, 2e-5)
  # h's cotangent reaches x and the residual (without it the gradient differs by ~1):
  assert np.abs(np.asarray(grads[0]) - np.asarray(vjp((jnp.asarray(ct), 0 * h))[0])).max() > 0.5


def test_add_and_norm_keeps_the_residual_stream_in_its_dtype():
  x, r, g, b, ct = _data((4, 64), offset=0.0, spread=1.0)
  xb = jnp.asarray(x, jnp.bfloat16)
  for impl in ("pallas", "xla"):
    y, h = jaxnorm.add_rms_norm(xb, xb, g, residual_dtype=jnp.float32, implementation=impl)
    assert (y.dtype, h.dtype) == (jnp.float32, jnp.float32)
  ours = jaxnorm.add_rms_norm(xb, r, g, residual_dtype=jnp.float32, implementation="pallas")
  xla = jaxnorm.add_rms_norm(xb, r, g, residual_dtype=jnp.float32)
  for a, e in zip(ours, xla, strict=True):
    _close(a, e, 1e-6)


def test_masks_count_only_valid_positions_and_normalize_every_one():
  x, _, g, b, ct = _data((11, 40), offset=0.0, spread=2.0)
  mask = np.random.default_rng(4).random(x.shape) > 0.4
  mask[3] = False  # a row with no valid element: x̂ = 0, y = β

  def f(x, g, b):
    return jaxnorm.layer_norm(x, g, b, epsilon=EPS, mask=mask, implementation="pallas")

  y, vjp = jax.vjp(f, x, g, b)
  grads = vjp(jnp.asarray(ct))
  kept = np.arange(len(x)) != 3  # (the NumPy reference has no rule for an empty row)
  _close(np.asarray(y)[kept], reference.layer_norm(x, g, b, eps=EPS, mask=mask)[kept], 2e-6)
  np.testing.assert_array_equal(np.asarray(y)[3], b)
  with jax.enable_x64(True):

    def ref(x, g, b):
      return _formula(x, g, b, None, jnp.asarray(mask), True, True, False)[0]

    grads64 = jax.vjp(ref, *(jnp.asarray(a, jnp.float64) for a in (x, g, b)))[1](
      jnp.asarray(ct, jnp.float64)
    )
  for ours, ref64 in zip(grads, grads64, strict=True):
    _close(ours, ref64, 2e-5)


def test_huge_rows_do_not_overflow():
  """Issue 20, item 9: float32 sums of squares overflow past |x| ≈ 1.8e19; the kernels
  scale each row by its largest magnitude first (the XLA path returns zeros: test_inputs)."""
  x = np.random.default_rng(5).normal(size=(6, 50)).astype(np.float32)
  for scale in (1e20, 1e30, 3e37):
    for fn, ref in (
      (jaxnorm.layer_norm, reference.layer_norm),
      (jaxnorm.rms_norm, reference.rms_norm),
    ):
      y = fn(x * np.float32(scale), implementation="pallas")
      _close(y, ref(x), 1e-5)


def test_transforms():
  x, _, g, b, ct = _data((4, 6, 48), offset=0.0, spread=1.0)
  ln = functools.partial(jaxnorm.layer_norm, epsilon=EPS)

  def loss(impl):
    return lambda x, g: jnp.sum(ln(x, g, implementation=impl) ** 3)

  xla, pallas = loss("xla"), loss("pallas")
  checks = {
    "jit(grad)": lambda f: jax.jit(jax.grad(f, (0, 1)))(x, g),
    "vmap(grad)": lambda f: jax.vmap(jax.grad(f), (0, None))(x, g),
    "grad(vmap)": lambda f: jax.grad(lambda x: jnp.sum(jax.vmap(f, (0, None))(x, g)))(x),
    "jvp": lambda f: jax.jvp(lambda x: ln(x, g, implementation=f), (x,), (jnp.asarray(ct),)),
    "remat": lambda f: jax.grad(jax.checkpoint(f), (0, 1))(x, g),
  }
  for name, check in checks.items():
    impls = ("xla", "pallas") if name == "jvp" else (xla, pallas)
    for a, e in zip(
      jax.tree.leaves(check(impls[1])), jax.tree.leaves(check(impls[0])), strict=True
    ):
      _close(a, e, 2e-5), name
  with pytest.raises(NotImplementedError, match="second order.*implementation='xla'"):
    jax.hessian(lambda x: pallas(x, g))(x[0, 0])

  def eps_grad(impl):
    return jax.grad(lambda e: jnp.sum(jaxnorm.rms_norm(x, epsilon=e, implementation=impl) * ct))

  _close(eps_grad("pallas")(0.5), eps_grad("xla")(0.5), 1e-5)  # a traced, differentiated ε


def test_modules_take_the_option_and_keep_their_variables():
  x, r, g, b, _ = _data((2, 5, 32), offset=0.0, spread=1.0)
  for cls in (jaxnorm.LayerNorm, jaxnorm.RMSNorm):
    variables = cls().init(jax.random.key(0), x)
    ours = cls(implementation="pallas").apply(variables, x, residual=r)
    for a, e in zip(ours, cls().apply(variables, x, residual=r), strict=True):
      _close(a, e, 1e-6)
  for cls in (jnnx.LayerNorm, jnnx.RMSNorm):
    fast, plain = cls(32, implementation="pallas", rngs=nnx.Rngs(0)), cls(32, rngs=nnx.Rngs(0))
    assert jax.tree.structure(nnx.state(fast)) == jax.tree.structure(nnx.state(plain))

    def grad(m):
      return nnx.grad(lambda m: jnp.sum(m(x) ** 2))(m)

    for a, e in zip(jax.tree.leaves(grad(fast)), jax.tree.leaves(grad(plain)), strict=True):
      _close(a, e, 2e-5)


def test_clear_errors():
  x = jnp.ones((4, 8))
  with pytest.raises(
    ValueError, match="implementation must be None.*'xla' or 'pallas', got 'triton'"
  ):
    jaxnorm.layer_norm(x, implementation="triton")
  misfits = {
    "not the trailing axes": dict(reduction_axes=0),
    "feature axes": dict(scale=jnp.ones(4), feature_axes=0),
    "across devices": dict(axis_name="i"),
    "float64": dict(dtype=jnp.float64),
  }
  for reason, kw in misfits.items():
    with jax.enable_x64(True), pytest.raises(ValueError, match=f"cannot compute.*{reason}.*'xla'"):
      jaxnorm.layer_norm(x, implementation="pallas", **kw)

  # None picks XLA (the kernels measured slower for training on an H100): the program of "xla"
  def jaxpr(impl):
    return str(jax.make_jaxpr(lambda x: jaxnorm.layer_norm(x, implementation=impl))(x))

  assert jaxpr(None) == jaxpr("xla") and "pallas_call" in jaxpr("pallas")


@pytest.mark.parametrize("platform, marker", [("cuda", "triton"), ("tpu", "tpu_custom_call")])
def test_lowers_for_gpus_and_tpus(platform, marker):
  x, r, g, b, _ = _data((3, 7, 100), offset=0.0, spread=1.0)
  mask = jnp.asarray(x > 0)

  def step(x, r, g, b):
    y, h = jaxnorm.add_layer_norm(x, r, g, b, mask=mask, implementation="pallas")
    z = jaxnorm.rms_norm(y.astype(jnp.bfloat16), g, implementation="pallas")
    return jnp.sum(z.astype(jnp.float32) ** 2) + jnp.sum(h)

  fn = jax.jit(jax.value_and_grad(step, (0, 1, 2, 3)))
  checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  try:
    exported = export.export(fn, platforms=(platform,), disabled_checks=checks)(x, r, g, b)
  except RuntimeError as error:  # JAX 0.12 lowers Triton only knowing the GPU it targets
    if "No supported GPU devices found" not in str(error):
      raise
    pytest.skip(f"this JAX ({jax.__version__}) lowers Triton kernels only with a GPU device")
  text = exported.mlir_module()
  assert text.count(marker) >= 3, text[:2000]  # forward, backward, and the second norm
  if platform == "cuda":  # Triton neither masks nor pads an access past the array's edge:
    # unmasked, a row padded to 128 columns wrote its tail over the next row (RESULTS, 57)
    kernels = re.findall(r'ir = "(.*?)", name = "jaxnorm_row_norm_(?:fwd|bwd)"', text)
    assert len(kernels) >= 3
    for ir in kernels:  # (the Triton IR's source locations name each access's primitive)
      assert "masked_load:" in ir and "masked_swap:" in ir
      assert "\\00get:" not in ir and "\\00swap:" not in ir, "an unmasked load or store"


def _uses_kernels(fn):
  """Whether the compiled ``fn`` runs the Pallas kernels (interpreted on the CPU: their
  ``pallas_call`` is in the jaxpr)."""
  return "pallas_call" in str(jax.make_jaxpr(fn)())


def test_default_implementation_follows_the_rule(monkeypatch):
  """``implementation=None`` is XLA everywhere as shipped (on an H100 the kernels'
  forward+backward measured slower), and takes the kernels exactly where the rule says once filled:
  by platform and row length, never where they cannot apply."""
  from jaxnorm._engine import pallas_rows as _rows

  rows = {d: jnp.ones((4, d), jnp.float32) for d in (64, 256, 1024)}
  scale = {d: jnp.ones(d) for d in rows}
  assert _rows.PALLAS_BY_DEFAULT == {}
  for d, x in rows.items():
    assert not _uses_kernels(lambda x=x, d=d: jaxnorm.layer_norm(x, scale=scale[d]))
  monkeypatch.setitem(_rows.PALLAS_BY_DEFAULT, jax.default_backend(), (128, 512))
  picked = {
    d: _uses_kernels(lambda x=x, d=d: jaxnorm.layer_norm(x, scale=scale[d]))
    for d, x in rows.items()
  }
  assert picked == {64: False, 256: True, 1024: False}
  # Where no kernel applies (statistics over a leading axis), None stays XLA and never raises.
  assert not _uses_kernels(lambda: jaxnorm.layer_norm(rows[256], reduction_axes=0))
  # Another platform's entry changes nothing here.
  monkeypatch.setattr(_rows, "PALLAS_BY_DEFAULT", {"not-this-platform": (1, 16384)})
  assert not _uses_kernels(lambda: jaxnorm.layer_norm(rows[256], scale=scale[256]))
