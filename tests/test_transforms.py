"""Behaviour under JAX and Flax transforms: jit, grad, vmap (also with an axis name, where
the statistics must equal those of the concatenated batch), nn.remat and nn.scan."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests import reference as ref
from tests.cases import CASES, FUNCTION_IDS, FUNCTIONS, IDS


def test_vmap_equals_batched_call(rng):
  x = rng.normal(size=(5, 3, 8)).astype(np.float32)
  g = rng.normal(size=8).astype(np.float32)
  per_example = jax.vmap(lambda x: jaxnorm.layer_norm(x, g))(x)
  np.testing.assert_allclose(per_example, jaxnorm.layer_norm(x, g), atol=1e-6)
  gn = jax.vmap(lambda x: jaxnorm.group_norm(x[None], num_groups=2)[0])(x)
  np.testing.assert_allclose(gn, jaxnorm.group_norm(x, num_groups=2), atol=1e-6)


def _vmap_equals_a_loop_and_jit_eager(fn, args):
  """``vmap(fn)`` over two different sets of ``args`` stacked on a new leading axis equals
  ``fn`` on each (the second set not an affine map of the first, which a norm undoes);
  ``jit(fn)`` equals ``fn`` eagerly."""
  other = [a + 0.5 * jnp.sin(3 * a) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in args]
  stacked = [jnp.stack(pair) for pair in zip(args, other, strict=True)]
  mapped = jax.vmap(fn)(*stacked)
  for i, one in enumerate((args, other)):
    np.testing.assert_allclose(mapped[i], fn(*one), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jax.jit(fn)(*args), fn(*args), rtol=1e-6, atol=1e-6)
  assert not np.allclose(mapped[0], mapped[1], atol=1e-3)  # (the two calls differ)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_norm_under_vmap_and_jit(case, rng):
  x = rng.normal(2.0, 3.0, (4, 3, 8)).astype(np.float32)
  g, b = rng.normal(1.0, 0.3, 8).astype(np.float32), rng.normal(0, 0.3, 8).astype(np.float32)
  _vmap_equals_a_loop_and_jit_eager(case.call, [jnp.asarray(a) for a in (x, g, b)])


@pytest.mark.parametrize("case", FUNCTIONS, ids=FUNCTION_IDS)
def test_every_other_norm_under_vmap_and_jit(case):
  _vmap_equals_a_loop_and_jit_eager(case.fn, case.arrays())


def test_vmap_with_axis_name_gives_global_statistics_with_unequal_masks(rng):
  """Four 'devices' (a named vmap axis) with different valid counts: the statistics equal
  those of the concatenated valid rows, weighted by count (Flax averages the means)."""
  x = rng.normal(2.0, 3.0, (4, 6, 5)).astype(np.float32)
  mask = np.zeros((4, 6, 1), bool)
  for d, n in enumerate([6, 1, 3, 0]):
    mask[d, :n] = True

  def per_device(x, m):
    return jaxnorm.batch_norm(x, mask=m, axis_name="devices")

  y, stats = jax.vmap(per_device, axis_name="devices")(x, mask)
  valid = x[mask[..., 0]]
  for d in range(4):
    np.testing.assert_allclose(stats.mean[d], valid.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.var[d], valid.var(0), rtol=1e-4)
    np.testing.assert_allclose(stats.count[d], 10)
  expected = (x - valid.mean(0)) / np.sqrt(valid.var(0) + 1e-5)
  np.testing.assert_allclose(np.asarray(y), expected, atol=1e-4)


def test_vmap_axis_name_gradients_equal_full_batch(rng):
  x = rng.normal(size=(2, 4, 3)).astype(np.float32)
  cot = rng.normal(size=x.shape).astype(np.float32)

  def sharded(x):
    y, _ = jax.vmap(lambda x: jaxnorm.batch_norm(x, axis_name="d"), axis_name="d")(x)
    return jnp.sum(y * cot)

  def full(x):
    return jnp.sum(jaxnorm.batch_norm(x.reshape(8, 3))[0] * cot.reshape(8, 3))

  np.testing.assert_allclose(jax.grad(sharded)(x), jax.grad(full)(x).reshape(2, 4, 3), atol=1e-5)


def test_jit_matches_eager_and_grad_under_jit(rng):
  x = rng.normal(size=(6, 4, 4, 8)).astype(np.float32)
  bn = jaxnorm.BatchNorm(use_running_average=False)
  variables = bn.init(jax.random.key(0), x)

  def loss(params, x):
    y, upd = bn.apply({**variables, "params": params}, x, mutable=["batch_stats"])
    return jnp.mean(y**2 * jnp.arange(8.0)[None, None, None]), upd

  eager = jax.value_and_grad(loss, has_aux=True)(variables["params"], x)
  jitted = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"], x)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), eager, jitted)


class _RematBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    return nn.relu(jaxnorm.BatchNorm(use_running_average=False)(x))


def test_remat_keeps_outputs_stats_and_grads(rng):
  x = rng.normal(size=(6, 8)).astype(np.float32)
  plain, remat = _RematBlock(), nn.remat(_RematBlock)()
  variables = plain.init(jax.random.key(0), x)

  def loss(module, params):
    y, upd = module.apply({**variables, "params": params}, x, mutable=["batch_stats"])
    return jnp.sum(y**2), upd

  (l1, u1), g1 = jax.value_and_grad(loss, argnums=1, has_aux=True)(plain, variables["params"])
  (l2, u2), g2 = jax.value_and_grad(loss, argnums=1, has_aux=True)(remat, variables["params"])
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  jax.tree_util.tree_map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), (u1, g1), (u2, g2)
  )


class _ScanLayer(nn.Module):
  @nn.compact
  def __call__(self, carry, _):
    h = jaxnorm.LayerNorm()(carry)
    h = jaxnorm.RMSNorm()(nn.Dense(carry.shape[-1])(h))
    return carry + h, None


def test_scan_over_layers(rng):
  x = rng.normal(size=(3, 16)).astype(np.float32)
  stack = nn.scan(_ScanLayer, variable_axes={"params": 0}, split_rngs={"params": True}, length=4)()
  variables = stack.init(jax.random.key(0), x, None)
  assert variables["params"]["LayerNorm_0"]["scale"].shape == (4, 16)
  y, _ = stack.apply(variables, x, None)
  # Unrolled by hand with the pure functions and the same parameters.
  p = variables["params"]
  h = x
  for i in range(4):
    t = jaxnorm.layer_norm(h, p["LayerNorm_0"]["scale"][i], p["LayerNorm_0"]["bias"][i])
    t = t @ p["Dense_0"]["kernel"][i] + p["Dense_0"]["bias"][i][None]
    h = h + jaxnorm.rms_norm(t, p["RMSNorm_0"]["scale"][i])
  np.testing.assert_allclose(y, h, atol=1e-5)
  grads = jax.grad(lambda v: jnp.sum(stack.apply(v, x, None)[0]))(variables)
  assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))


def test_named_scopes_appear_in_the_jaxpr():
  text = str(jax.make_jaxpr(lambda x: jaxnorm.layer_norm(x))(jnp.ones((2, 4))))
  hlo = jax.jit(lambda x: jaxnorm.layer_norm(x)).lower(jnp.ones((2, 4))).as_text(debug_info=True)
  assert "jaxnorm.layer_norm" in hlo, text[:200]


def test_reference_agrees_with_itself_on_identities(rng):
  """Guards the reference: GN with one group equals LN over (H, W, C)."""
  x = rng.normal(size=(2, 3, 3, 4))
  np.testing.assert_allclose(
    ref.group_norm(x, 1), ref.layer_norm(x, reduction_axes=(1, 2, 3)), atol=1e-12
  )
