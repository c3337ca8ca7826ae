"""Numerics: the design brief's worked example, cross-norm identities, ill-conditioned and
constant inputs, masks (partial and full), each against the float64 reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests import reference as ref
from tests.cases import CASES, IDS

# The public test vector of the brief: N=2, C=2, H=W=2, channels first.
WORKED = np.array(
  [
    [[[1, 2], [3, 4]], [[5, 6], [7, 8]]],
    [[[2, 3], [4, 5]], [[6, 7], [8, 9]]],
  ],
  dtype=np.float32,
)


def test_worked_example_statistics():
  bn = jaxnorm.moments(WORKED, axes=(0, 2, 3))
  np.testing.assert_allclose(bn.mean[0], 3.0)
  np.testing.assert_allclose(bn.var[0], 1.5)
  ln = jaxnorm.moments(WORKED, axes=(1, 2, 3))
  np.testing.assert_allclose(ln.mean[0], 4.5)
  np.testing.assert_allclose(ln.var[0], 5.25)
  inst = jaxnorm.moments(WORKED, axes=(2, 3))
  np.testing.assert_allclose(inst.mean[0, 0], 2.5)
  np.testing.assert_allclose(inst.var[0, 0], 1.25)
  rms = jaxnorm.moments(jnp.array([1.0, 2.0, 3.0, 4.0]), axes=0, center=False)
  np.testing.assert_allclose(np.sqrt(rms.var), np.sqrt(7.5), rtol=1e-6)


def test_worked_example_outputs_channels_first():
  eps = 1e-5
  y, stats = jaxnorm.batch_norm(WORKED, axis=1, epsilon=eps)
  np.testing.assert_allclose(stats.mean, [3.0, 7.0])
  np.testing.assert_allclose(y[0, 0], (WORKED[0, 0] - 3.0) / np.sqrt(1.5 + eps), rtol=1e-6)
  y = jaxnorm.instance_norm(WORKED, feature_axes=1, epsilon=eps)
  np.testing.assert_allclose(y[0, 0], (WORKED[0, 0] - 2.5) / np.sqrt(1.25 + eps), rtol=1e-6)
  y = jaxnorm.layer_norm(WORKED, reduction_axes=(1, 2, 3), feature_axes=1, epsilon=eps)
  np.testing.assert_allclose(y[0], (WORKED[0] - 4.5) / np.sqrt(5.25 + eps), rtol=1e-6)


@pytest.mark.parametrize("channel_axis", [-1, 1])
def test_group_norm_identities(channel_axis, rng):
  shape = (3, 5, 4, 8) if channel_axis == -1 else (3, 8, 5, 4)
  x = rng.normal(1.0, 2.0, shape).astype(np.float32)
  one_group = jaxnorm.group_norm(x, num_groups=1, feature_axis=channel_axis)
  layer = jaxnorm.layer_norm(x, reduction_axes=(1, 2, 3), feature_axes=channel_axis)
  np.testing.assert_allclose(one_group, layer, atol=1e-5)
  per_channel = jaxnorm.group_norm(x, num_groups=8, feature_axis=channel_axis)
  instance = jaxnorm.instance_norm(x, feature_axes=channel_axis)
  np.testing.assert_allclose(per_channel, instance, atol=1e-5)
  by_size = jaxnorm.group_norm(x, num_groups=None, group_size=1, feature_axis=channel_axis)
  np.testing.assert_allclose(by_size, instance, atol=1e-5)


@pytest.mark.parametrize("offset,tol", [(1e4, 1e-2), (1e6, 0.1)])
@pytest.mark.parametrize("norm", ["batch", "layer", "instance", "group"])
def test_large_offset_stays_accurate(norm, offset, tol, rng):
  """float32 data with mean ≫ std: the reference sees the same rounded data. At 1e6 the
  mean itself can only be stored to 1/16, which bounds what float32 can do there. (Flax's
  default E[x²] − E[x]² is off by thousands at 1e4: see the README's differences table.)"""
  x = (rng.normal(0.0, 1.0, (8, 6, 6, 16)) + offset).astype(np.float32)
  fns = {
    "batch": (lambda x: jaxnorm.batch_norm(x)[0], lambda x: ref.batch_norm(x)[0]),
    "layer": (
      lambda x: jaxnorm.layer_norm(x, reduction_axes=(1, 2, 3)),
      lambda x: ref.layer_norm(x, reduction_axes=(1, 2, 3)),
    ),
    "instance": (jaxnorm.instance_norm, ref.instance_norm),
    "group": (lambda x: jaxnorm.group_norm(x, num_groups=4), lambda x: ref.group_norm(x, 4)),
  }
  ours, theirs = fns[norm]
  err = np.abs(np.asarray(ours(x), np.float64) - theirs(x)).max()
  assert err < tol, err


def test_offset_under_jit_and_with_mask(rng):
  x = (rng.normal(0.0, 1.0, (4, 64)) + 1e4).astype(np.float32)
  mask = rng.random((4, 64)) < 0.7
  y = jax.jit(lambda x, m: jaxnorm.layer_norm(x, mask=m))(x, mask)
  np.testing.assert_allclose(np.asarray(y), ref.layer_norm(x, mask=mask), atol=1e-2)


@pytest.mark.parametrize("norm", ["batch", "layer", "instance", "group", "rms"])
def test_constant_input_gives_bias_and_finite_grads(norm):
  x = jnp.full((4, 3, 3, 8), 7.0)
  beta = jnp.linspace(-1.0, 1.0, 8)
  gamma = jnp.ones(8) * 2.0
  fn = {
    "batch": lambda x, g, b: jaxnorm.batch_norm(x, g, b)[0],
    "layer": lambda x, g, b: jaxnorm.layer_norm(x, g, b, reduction_axes=(1, 2, 3)),
    "instance": jaxnorm.instance_norm,
    "group": lambda x, g, b: jaxnorm.group_norm(x, g, b, num_groups=2),
    "rms": lambda x, g, b: jaxnorm.rms_norm(x * 0, g, b),
  }[norm]
  y = fn(x, gamma, beta)
  np.testing.assert_allclose(y, jnp.broadcast_to(beta, x.shape), atol=1e-6)
  grads = jax.grad(lambda *a: jnp.sum(fn(*a) ** 3), argnums=(0, 1, 2))(x, gamma, beta)
  for g in grads:
    assert np.all(np.isfinite(g))


@pytest.mark.parametrize("jit", [False, True])
def test_partial_mask_matches_reference(jit, rng):
  x = rng.normal(1.0, 2.0, (3, 10, 8)).astype(np.float32)
  mask = rng.random((3, 10, 1)) < 0.6
  mask[0, 0] = True

  def fn(x, m):
    return jaxnorm.layer_norm(x, mask=m, reduction_axes=(1, 2), feature_axes=2)

  fn = jax.jit(fn) if jit else fn
  y = fn(x, mask)
  expected = ref.layer_norm(x, reduction_axes=(1, 2), feature_axes=2, mask=mask)
  # Masked positions are normalized too, with the statistics of the valid ones (as Flax).
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5)


@pytest.mark.parametrize("norm", ["normalize", "layer", "rms", "group", "instance", "batch"])
def test_fully_masked_group_has_no_nan(norm, rng):
  x = rng.normal(size=(4, 6, 8)).astype(np.float32)
  mask = np.ones((4, 6, 8), bool)
  if norm == "batch":
    mask[:, 1] = False  # statistics per (time, feature): time step 1 has no valid element
  else:
    mask[1] = False  # sample 1: nothing valid
  beta = jnp.full(8, 0.5)
  fns = {
    "normalize": lambda x, m: jaxnorm.normalize(x, (1, 2), mask=m),
    "layer": lambda x, m: jaxnorm.layer_norm(x, None, beta, reduction_axes=(1, 2), mask=m),
    "rms": lambda x, m: jaxnorm.rms_norm(x, None, beta, reduction_axes=(1, 2), mask=m),
    "group": lambda x, m: jaxnorm.group_norm(x, None, beta, num_groups=2, mask=m),
    "instance": lambda x, m: jaxnorm.instance_norm(x, None, beta, mask=m),
    "batch": lambda x, m: jaxnorm.batch_norm(x, None, beta, reduction_axes=0, mask=m)[0],
  }
  fn = fns[norm]
  y = np.asarray(fn(x, mask))
  assert np.all(np.isfinite(y))
  empty = y[:, 1] if norm == "batch" else y[1]
  np.testing.assert_allclose(empty, 0.0 if norm == "normalize" else 0.5)
  grad = jax.grad(lambda x: jnp.sum(fn(x, mask) ** 2))(x)
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad[:, 1] if norm == "batch" else grad[1], 0.0)
  # The other groups are unaffected by the empty one.
  keep = [0, 2, 3]
  if norm == "layer":
    np.testing.assert_allclose(
      y[keep], ref.layer_norm(x[keep], None, np.asarray(beta), (1, 2)), atol=2e-5
    )


def test_mask_broadcast_error_names_shapes():
  with pytest.raises(ValueError, match=r"mask of shape \(3,\) does not broadcast.*\(4, 5\)"):
    jaxnorm.layer_norm(jnp.ones((4, 5)), mask=jnp.ones(3, bool))


@pytest.mark.parametrize("eps_in_root", [True, False])
@pytest.mark.parametrize("zero_centered", [True, False])
def test_rms_options_match_reference(eps_in_root, zero_centered, rng):
  x = rng.normal(0.3, 1.0, (4, 16)).astype(np.float32)
  gamma = rng.normal(0.0, 0.2, 16).astype(np.float32)
  beta = rng.normal(0.0, 0.2, 16).astype(np.float32)
  y = jaxnorm.rms_norm(
    x, gamma, beta, epsilon=1e-3, epsilon_in_root=eps_in_root, zero_centered_scale=zero_centered
  )
  expected = ref.rms_norm(
    x, gamma, beta, eps=1e-3, eps_in_root=eps_in_root, zero_centered=zero_centered
  )
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5)


def test_rms_module_options(rng):
  x = jnp.asarray(rng.normal(size=(3, 16)), jnp.float32)
  m = jaxnorm.RMSNorm(use_bias=True, zero_centered_scale=True, epsilon_in_root=False)
  v = m.init(jax.random.key(0), x)
  assert set(v["params"]) == {"scale", "bias"}
  np.testing.assert_array_equal(v["params"]["scale"], 0.0)
  params = {"scale": jnp.full(16, 0.5), "bias": jnp.full(16, 0.25)}
  y = m.apply({"params": params}, x)
  expected = ref.rms_norm(
    np.asarray(x),
    0.5 * np.ones(16),
    0.25 * np.ones(16),
    eps=1e-6,
    eps_in_root=False,
    zero_centered=True,
  )
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5)


@pytest.mark.parametrize(
  "case",
  [*CASES, CASES[1]._replace(name="pallas", kwargs={"implementation": "pallas"})],
  ids=[*IDS, "layer-pallas"],
)
def test_masked_padding_never_reaches_valid_outputs_or_gradients(case, rng):
  """Padding is often garbage: NaN or inf at masked-out positions gives the valid outputs and
  every gradient (of x at valid positions, of the scale and the bias) that zero padding
  gives (once the gradients of BatchNorm, GroupNorm, InstanceNorm were NaN everywhere)."""
  x = rng.normal(2.0, 1.5, (4, 3, 3, 8)).astype(np.float32)
  mask = np.ones((4, 3, 3, 1), bool)
  mask[0, 0, 0] = mask[1, 2, 1] = mask[3, 0, 2] = False
  valid = np.broadcast_to(mask, x.shape)
  dirty, clean = x.copy(), x.copy()
  garbage = np.where(np.arange((~valid).sum()) % 2, np.nan, -np.inf)  # NaN and inf both
  dirty[~valid], clean[~valid] = garbage, 0.0
  g, b = rng.normal(1, 0.3, 8).astype(np.float32), rng.normal(0, 0.3, 8).astype(np.float32)
  w = rng.normal(size=x.shape).astype(np.float32)

  def loss(x, g, b):
    y = case.fn(x, g, b if case.pure_bias else None, mask=mask, **case.kwargs)
    return jnp.where(valid, y * w, 0.0).sum(), y

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  (l_dirty, y_dirty), d_dirty = grad(dirty, g, b)
  (l_clean, y_clean), d_clean = grad(clean, g, b)
  np.testing.assert_allclose(l_dirty, l_clean, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(y_dirty)[valid], np.asarray(y_clean)[valid], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(d_dirty[0])[valid], np.asarray(d_clean[0])[valid],
                             rtol=1e-5, atol=1e-6)  # fmt: skip
  for name, a, c in (("scale", d_dirty[1], d_clean[1]), ("bias", d_dirty[2], d_clean[2])):
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6, err_msg=name)
  assert np.abs(np.asarray(d_clean[0])[valid]).max() > 1e-2  # (gradients that can differ)
