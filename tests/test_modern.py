"""The registry's other norms (``tests.cases.FUNCTIONS``: DyT, L2, LRN, modulation, AdaLN,
modulated RMSNorm, AdaIN, conditional BatchNorm, Add & Norm, Batch Renorm, frozen
BatchNorm, ``normalize``, the weight norms) against the float64 reference: values in
float32, bfloat16 and float16 (computed in float32, rounded once), derivatives against the
reference's central differences and second-order ``check_grads``; the modern norms'
errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxnorm
from tests import reference as ref
from tests.cases import FUNCTION_IDS, FUNCTIONS, IMAGE, ROWS, D, function_data

BY_NAME = {c.name: c for c in FUNCTIONS}

TOLERANCE = {jnp.float32: 2e-6, jnp.bfloat16: 8e-3, jnp.float16: 1e-3}


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", FUNCTIONS, ids=FUNCTION_IDS)
def test_matches_float64_reference(case, dtype):
  args = case.arrays(dtype)
  y = jax.jit(case.fn)(*args)
  want = case.reference(*args)
  assert y.shape == want.shape
  # The first input in half precision, the rest float32: the output is float32 (Flax's
  # promotion) except where the only input is x, which keeps x's dtype.
  expected = dtype if len(args) == 1 else jnp.float32
  assert y.dtype == expected
  # Computed in float32 and rounded once: within a rounding of the output's dtype.
  scale = np.abs(want).max()
  np.testing.assert_allclose(np.asarray(y, np.float64), want, atol=TOLERANCE[expected] * scale)


def test_half_precision_computes_in_float32():
  """bfloat16 input and conditioning, float32 output: exact to float32 rounding. A
  bfloat16 ``1 + scale`` (scale ~1e-3, TransformerEngine#789) or bfloat16 statistics would
  be off by ~1e-3; with a bfloat16 output, one rounding of that result."""
  data = function_data()
  x = jnp.asarray(data["x"], jnp.bfloat16)
  shift, scale = (jnp.asarray(data[k] * 1e-3, jnp.bfloat16) for k in ("shift", "scale"))
  f64 = [np.asarray(a, np.float64) for a in (x, shift, scale)]
  want = ref.modulate(ref.layer_norm(f64[0]), ref.per_sample(f64[1], 3), ref.per_sample(f64[2], 3))
  y = jaxnorm.adaptive_layer_norm(x, shift, scale, dtype=jnp.float32)
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)
  y = jaxnorm.adaptive_layer_norm(x, shift, scale)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(y, jnp.asarray(want, jnp.float32).astype(jnp.bfloat16))


@pytest.mark.parametrize(
  "case", [c for c in FUNCTIONS if c.differences != ()], ids=lambda c: c.name
)
def test_gradient_matches_reference_differences(case):
  """⟨∇(Σ w·f), v⟩ in float32 against central differences of the float64 reference, over
  every floating argument the norm differentiates (``Function.differences``)."""
  args = case.arrays()
  floating = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]
  named = case.differences
  wrt = tuple(i for i in floating if named is None or case.args[i] in named)
  r = np.random.default_rng(7)
  w = r.normal(size=jax.eval_shape(case.fn, *args).shape)
  dirs = {i: r.normal(size=args[i].shape) for i in wrt}
  grads = jax.grad(lambda *a: jnp.sum(case.fn(*a) * w), argnums=wrt)(*args)
  got = sum(
    float(np.sum(np.asarray(g, np.float64) * dirs[i])) for i, g in zip(wrt, grads, strict=True)
  )
  h = 1e-5
  f64 = [np.asarray(a, np.float64) if i in dirs else np.asarray(a) for i, a in enumerate(args)]
  plus = case.ref(*(a + h * dirs[i] if i in dirs else a for i, a in enumerate(f64)))
  minus = case.ref(*(a - h * dirs[i] if i in dirs else a for i, a in enumerate(f64)))
  want = float(np.sum((plus - minus) * w)) / (2 * h)
  assert abs(got - want) <= 1e-4 * (1 + abs(want)), (got, want)


@pytest.mark.parametrize("name", ["dyt", "l2_normalize", "lrn"])
def test_check_grads_second_order(name):
  case = BY_NAME[name]
  with jax.enable_x64(True):
    args = [jnp.asarray(function_data()[a], jnp.float64) for a in case.args]
    check_grads(jax.jit(case.fn), args, order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


def test_per_sample_conditioning_is_not_aligned_by_trailing_axes():
  """(B, D) against (B, T, D) with B == T: NumPy would pair the batch with the tokens."""
  x = jnp.zeros((4, 4, 2))
  shift = jnp.arange(8.0).reshape(4, 2)
  y = jaxnorm.modulate(x, shift)
  np.testing.assert_array_equal(y[2, 0], shift[2])
  np.testing.assert_array_equal(y[2, 3], shift[2])


def test_conditioning_of_another_shape_is_refused():
  with pytest.raises(ValueError, match=r"shift has shape \(3, 7\).*\(3, 8\).*broadcasts"):
    jaxnorm.adaptive_layer_norm(jnp.zeros(ROWS), jnp.zeros((3, 7)), None)


def test_l2_normalize_is_pytorch_formula_at_zero_and_below_epsilon():
  x = jnp.array([[0.0, 0.0], [3e-13, 4e-13], [3.0, 4.0]])
  y = jaxnorm.l2_normalize(x)
  np.testing.assert_allclose(y, [[0, 0], [0.3, 0.4], [0.6, 0.8]], rtol=1e-6)
  g = jax.grad(lambda v: jaxnorm.l2_normalize(v).sum())(jnp.zeros(3))
  np.testing.assert_allclose(g, np.full(3, 1e12), rtol=1e-6)  # x/ε: PyTorch's 1/ε, not NaN


def test_lrn_size_must_be_positive():
  with pytest.raises(ValueError, match="size must be a positive int"):
    jaxnorm.local_response_norm(jnp.ones((2, 4)), 0)


def test_adaptive_instance_norm_refuses_other_channels():
  with pytest.raises(ValueError, match=r"channels \(6,\)"):
    jaxnorm.adaptive_instance_norm(jnp.ones(IMAGE), jnp.ones((2, 4, 3, 5)))


def test_conditional_batch_norm_labels_out_of_range():
  x, table = jnp.ones((3, D)), jnp.ones((3, D))
  kw = dict(use_running_average=True)
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\).*from 0 to 3"):
    jaxnorm.conditional_batch_norm_step(x, jnp.array([0, 1, 3]), table, None, jnp.zeros(D),
                                        jnp.ones(D), **kw)  # fmt: skip
  traced = jax.jit(lambda lab: jaxnorm.conditional_batch_norm_step(
    x, lab, table, None, jnp.zeros(D), jnp.ones(D), **kw)[0])(jnp.array([0, 1, 3]))  # fmt: skip
  assert np.isnan(traced[2]).all() and np.isfinite(traced[:2]).all()  # never class 2's γ


def test_conditional_batch_norm_updates_shared_statistics():
  data = function_data()
  x = jnp.asarray(data["x"].reshape(-1, D)[:6])
  labels = jnp.array([0, 1, 2, 0, 1, 2])
  y, (mean, var) = jaxnorm.conditional_batch_norm_step(
    x, labels, data["table_g"], data["table_b"], jnp.zeros(D), jnp.ones(D),
    use_running_average=False, momentum=0.9,
  )  # fmt: skip
  _, bm, bv = ref.batch_norm(np.asarray(x))
  np.testing.assert_allclose(mean, ref.running_average(np.zeros(D), bm, 0.9), rtol=1e-5)
  np.testing.assert_allclose(var, ref.running_average(np.ones(D), bv, 0.9), rtol=1e-5)
  soft = jax.nn.one_hot(labels, 3)  # class weights: the same as the indices
  y2, _ = jaxnorm.conditional_batch_norm_step(
    x, soft, data["table_g"], data["table_b"], jnp.zeros(D), jnp.ones(D),
    use_running_average=False,
  )  # fmt: skip
  np.testing.assert_allclose(y2, y, rtol=1e-6, atol=1e-6)


def test_adaptive_norms_under_explicit_sharding():
  """Batch and tokens sharded (``AxisType.Explicit``): AdaLN, modulated RMSNorm and the gate
  run, keep the input's sharding, and give the unsharded values and gradients."""
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
  data = function_data()
  x = np.concatenate([data["x"]] * 4, axis=1)[:2, :8]  # (2, 8, 8)
  shift, scale = data["shift"][:2], data["scale"][:2]

  def loss(x, shift, scale):
    y = jaxnorm.adaptive_layer_norm(x, shift, scale) + jaxnorm.adaptive_rms_norm(x, shift, scale)
    return jnp.sum(jnp.sin(jaxnorm.gated_residual(x, y, scale))), y

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  (_, want_y), want = step(x, shift, scale)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, P("data", "model", None)))
    cs = [jax.device_put(a, NamedSharding(mesh, P("data", None))) for a in (shift, scale)]
    (_, y), grads = step(xs, *cs)
  assert tuple(y.sharding.spec)[:2] == ("data", "model")
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  for got, w in zip(grads, want, strict=True):
    np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)
