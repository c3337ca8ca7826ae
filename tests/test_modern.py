"""The modern norms' pure functions (DyT, L2, LRN, modulation, AdaLN, modulated RMSNorm,
AdaIN, conditional BatchNorm) against the float64 reference: values in float32, bfloat16
and float16 (computed in float32, rounded once), derivatives against the reference's
central differences and second-order ``check_grads``, and their errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxnorm
from tests import reference as ref

B, T, D = 3, 5, 8
ROWS = (B, T, D)
IMAGE = (2, 4, 3, 6)  # N, H, W, C


def _data(seed=0):
  """x (B, T, D) off centre (so a wrong mean shows), per-sample conditioning, parameters."""
  r = np.random.default_rng(seed)
  return dict(
    x=r.normal(3.0, 2.0, ROWS),
    shift=r.normal(0, 1, (B, D)),
    scale=r.normal(0, 0.5, (B, D)),
    g=r.normal(1, 0.3, D),
    b=r.normal(0, 0.3, D),
    content=r.normal(2.0, 1.5, IMAGE),
    style=r.normal(-4.0, 3.0, (1, 5, 2, 6)),  # one style, other spatial size
    labels=np.array([2, 0, 1]),
    table_g=r.normal(1, 0.5, (3, D)),
    table_b=r.normal(0, 0.5, (3, D)),
  )


def _update(x):
  """A sublayer's output for the gate, in float32 (so x's rounding is the only one)."""
  return jnp.square(x.astype(jnp.float32)) * 0.1


def _mask():
  return np.arange(D)[None, None, :] < 6


# name -> (jaxnorm(args), reference(args), the argument names; x first, differentiated)
CASES = {
  "dyt": (
    lambda x, g, b: jaxnorm.dyt(x, 0.7, g, b),
    lambda x, g, b: ref.dyt(x, 0.7, g, b),
    ("x", "g", "b"),
  ),
  "dyt_alpha_per_feature": (
    lambda x, g: jaxnorm.dyt(x, g * 0.5, None, g),
    lambda x, g: ref.dyt(x, np.asarray(g) * 0.5, None, g),
    ("x", "g"),
  ),
  "l2_normalize": (lambda x: jaxnorm.l2_normalize(x), ref.l2_normalize, ("x",)),
  "l2_normalize_2d": (
    lambda x: jaxnorm.l2_normalize(x, (1, 2)),
    lambda x: ref.l2_normalize(x, (1, 2)),
    ("x",),
  ),
  "lrn": (
    lambda x: jaxnorm.local_response_norm(x, 3, 0.2, 0.75, 2.0),
    lambda x: ref.local_response_norm(x, 3, 0.2, 0.75, 2.0),
    ("x",),
  ),
  "lrn_even_channels_first": (
    lambda x: jaxnorm.local_response_norm(x, 4, 0.5, 0.6, 1.0, channel_axis=1),
    lambda x: ref.local_response_norm(x, 4, 0.5, 0.6, 1.0, channel_axis=1),
    ("x",),
  ),
  "modulate": (
    lambda x, shift, scale: jaxnorm.modulate(x, shift, scale),
    lambda x, shift, scale: ref.modulate(x, ref.per_sample(shift, 3), ref.per_sample(scale, 3)),
    ("x", "shift", "scale"),
  ),
  "film": (
    lambda x, shift, scale: jaxnorm.modulate(x, shift, scale, zero_centered_scale=False),
    lambda x, shift, scale: ref.modulate(
      x, ref.per_sample(shift, 3), ref.per_sample(scale, 3), zero_centered=False
    ),
    ("x", "shift", "scale"),
  ),
  "gated_residual": (
    lambda x, shift, scale: jaxnorm.gated_residual(x, _update(x), scale),
    lambda x, shift, scale: (
      np.asarray(x, np.float64) + ref.per_sample(scale, 3) * np.asarray(x, np.float64) ** 2 * 0.1
    ),
    ("x", "shift", "scale"),
  ),
  "adaptive_layer_norm": (
    lambda x, shift, scale: jaxnorm.adaptive_layer_norm(x, shift, scale),
    lambda x, shift, scale: ref.modulate(
      ref.layer_norm(x), ref.per_sample(shift, 3), ref.per_sample(scale, 3)
    ),
    ("x", "shift", "scale"),
  ),
  "adaptive_layer_norm_masked": (
    lambda x, shift, scale: jaxnorm.adaptive_layer_norm(x, shift, scale, mask=_mask()),
    lambda x, shift, scale: ref.modulate(
      ref.layer_norm(x, mask=_mask()), ref.per_sample(shift, 3), ref.per_sample(scale, 3)
    ),
    ("x", "shift", "scale"),
  ),
  "adaptive_rms_norm": (
    lambda x, shift, scale: jaxnorm.adaptive_rms_norm(x, shift, scale),
    lambda x, shift, scale: ref.modulate(
      ref.rms_norm(x), ref.per_sample(shift, 3), ref.per_sample(scale, 3)
    ),
    ("x", "shift", "scale"),
  ),
  "adaptive_instance_norm": (
    lambda content, style: jaxnorm.adaptive_instance_norm(content, style),
    ref.adaptive_instance_norm,
    ("content", "style"),
  ),
  "adaptive_instance_norm_nchw": (
    lambda content, style: jaxnorm.adaptive_instance_norm(
      content.transpose(0, 3, 1, 2), style.transpose(0, 3, 1, 2), feature_axes=1
    ),
    lambda content, style: ref.adaptive_instance_norm(
      np.transpose(content, (0, 3, 1, 2)), np.transpose(style, (0, 3, 1, 2)), channel_axis=1
    ),
    ("content", "style"),
  ),
  "conditional_batch_norm": (
    lambda x, table_g, table_b: jaxnorm.conditional_batch_norm_step(
      x,
      jnp.array([2, 0, 1]),
      table_g,
      table_b,
      jnp.zeros(D),
      jnp.ones(D),
      use_running_average=False,
    )[0],  # fmt: skip
    lambda x, table_g, table_b: ref.conditional_batch_norm(
      x, np.array([2, 0, 1]), table_g, table_b
    )[0],
    ("x", "table_g", "table_b"),
  ),
}

TOLERANCE = {jnp.float32: 2e-6, jnp.bfloat16: 8e-3, jnp.float16: 1e-3}


def _args(name, dtype=jnp.float32):
  data = _data()
  return [jnp.asarray(data[a], dtype if i == 0 else jnp.float32)
          for i, a in enumerate(CASES[name][2])]  # fmt: skip


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_float64_reference(name, dtype):
  fn, reference, _ = CASES[name]
  args = _args(name, dtype)
  y = jax.jit(fn)(*args)
  want = reference(*(np.asarray(a, np.float64) for a in args))
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
  data = _data()
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


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_reference_differences(name):
  """⟨∇(Σ w·f), v⟩ in float32 against central differences of the float64 reference."""
  fn, reference, names = CASES[name]
  args = _args(name)
  r = np.random.default_rng(7)
  w = r.normal(size=jax.eval_shape(fn, *args).shape)
  dirs = [r.normal(size=a.shape) for a in args]
  grads = jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=tuple(range(len(args))))(*args)
  got = sum(float(np.sum(np.asarray(g, np.float64) * v)) for g, v in zip(grads, dirs, strict=True))
  h = 1e-5
  f64 = [np.asarray(a, np.float64) for a in args]
  plus = reference(*(a + h * v for a, v in zip(f64, dirs, strict=True)))
  minus = reference(*(a - h * v for a, v in zip(f64, dirs, strict=True)))
  want = float(np.sum((plus - minus) * w)) / (2 * h)
  assert abs(got - want) <= 1e-4 * (1 + abs(want)), (got, want)


@pytest.mark.parametrize("name", ["dyt", "l2_normalize", "lrn"])
def test_check_grads_second_order(name):
  fn, _, names = CASES[name]
  with jax.enable_x64(True):
    args = [jnp.asarray(_data()[a], jnp.float64) for a in names]
    check_grads(jax.jit(fn), args, order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


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
  data = _data()
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


@pytest.mark.parametrize("name", sorted(CASES))
def test_strict_promotion_gives_the_standard_result(name):
  """bfloat16 x with float32 parameters under ``jax_numpy_dtype_promotion="strict"``:
  forward and gradient bit for bit the standard mode's (no TypePromotionError)."""
  fn, _, _ = CASES[name]
  args = _args(name, jnp.bfloat16)

  def run():
    y = jax.jit(fn)(*args)
    grads = jax.jit(jax.grad(lambda *a: fn(*a).astype(jnp.float32).sum(), argnums=0))(*args)
    return y, grads

  with jax.numpy_dtype_promotion("standard"):
    want = run()
  with jax.numpy_dtype_promotion("strict"):
    got = run()
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_adaptive_norms_under_explicit_sharding():
  """Batch and tokens sharded (``AxisType.Explicit``): AdaLN, modulated RMSNorm and the gate
  run, keep the input's sharding, and give the unsharded values and gradients."""
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
  data = _data()
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
