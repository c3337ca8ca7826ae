"""Virtual (ghost) batches against the float64 reference: per sub-batch statistics, masks,
errors, running statistics, devices with unequal masks, both front ends."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

FIXED = dict(warmup_steps=0, r_max_steps=None, d_max_steps=None)  # limits from step 0


def _data(rng, shape=(16, 5), loc=2.0, scale=3.0):
  return rng.normal(loc, scale, shape).astype(np.float32)


@pytest.mark.parametrize("shape,k", [((12, 5), 4), ((8, 3, 3, 4), 2), ((6, 7), 6)])
def test_ghost_equals_batch_norm_per_sub_batch(shape, k, rng):
  x = _data(rng, shape)
  gamma, beta = rng.normal(1, 0.3, shape[-1]), rng.normal(0, 0.3, shape[-1])
  y, stats = jaxnorm.batch_norm(x, gamma, beta, virtual_batch_size=k)
  expected, mean, var = ref.ghost_batch_norm(x, k, gamma, beta)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=3e-5)
  np.testing.assert_allclose(stats.mean, mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats.var, var, rtol=1e-5)
  if k < shape[0]:  # sub-batches really differ from the whole batch
    assert np.abs(np.asarray(y) - ref.batch_norm(x, gamma, beta)[0]).max() > 1e-2


def test_ghost_with_masks(rng):
  x = _data(rng, (12, 3))
  mask = rng.random((12, 3)) < 0.6
  mask[4:8] = False  # one sub-batch has no valid element at all
  y, stats = jaxnorm.batch_norm(x, mask=mask, virtual_batch_size=4)
  expected, mean, var = ref.ghost_batch_norm(x, 4, mask=mask)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=3e-5)
  np.testing.assert_allclose(stats.mean, mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats.var, var, rtol=1e-5)
  assert np.isfinite(np.asarray(y)).all()


def test_ghost_errors(rng):
  x = _data(rng, (12, 3))
  with pytest.raises(ValueError, match="virtual_batch_size=5 must be >= 1 and divide the batch"):
    jaxnorm.batch_norm(x, virtual_batch_size=5)
  with pytest.raises(TypeError, match="positive int"):
    jaxnorm.batch_norm(x, virtual_batch_size=2.0)
  with pytest.raises(ValueError, match="one value per statistic"):
    jaxnorm.batch_norm(x, virtual_batch_size=1)
  bn = jaxnorm.BatchNorm(use_running_average=False, virtual_batch_size=5)
  variables = bn.init(jax.random.key(0), x[:1])  # init's dummy batch is not split
  with pytest.raises(ValueError, match="divide the batch"):
    bn.apply(variables, x, mutable=["batch_stats"])


def test_ghost_module_running_statistics_and_devices(rng):
  n_dev, k = 8, 2
  mesh = jax.make_mesh((n_dev,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  x = _data(rng, (n_dev * 4, 3))
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.5, axis_name="d",
                         virtual_batch_size=k)  # fmt: skip
  variables = bn.init(jax.random.key(0), x[:4])

  def step(v, x):
    return bn.apply(v, x, mutable=["batch_stats"])

  mapped = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("d")), out_specs=(P("d"), P())))
  with jax.set_mesh(mesh):
    y, upd = mapped(variables, jax.device_put(x, NamedSharding(mesh, P("d"))))
  # Sub-batches stay on their device: the output is the ghost norm of the whole batch
  # (each device's 4 rows are two sub-batches of 2), and the running statistics follow
  # the mean over all 16 sub-batches.
  expected, mean, var = ref.ghost_batch_norm(x, k)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=3e-5)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.5 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(upd["batch_stats"]["var"], 0.5 + 0.5 * var, rtol=1e-5)
  # NNX: the same module, the same numbers on one device.
  nbn = jnnx.BatchNorm(3, momentum=0.5, virtual_batch_size=k, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(nbn(x)), expected, rtol=1e-5, atol=3e-5)
  np.testing.assert_allclose(nbn.mean[...], 0.5 * mean, rtol=1e-5, atol=1e-6)


def test_ghost_with_unequal_masks_over_devices(rng):
  n_dev, k = 8, 2
  mesh = jax.make_mesh((n_dev,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  x = _data(rng, (n_dev * 4, 3))
  mask = np.zeros((n_dev * 4, 1), bool)
  for dev, c in enumerate([4, 1, 0, 3, 2, 4, 0, 1]):  # valid rows per device, two empty
    mask[dev * 4 : dev * 4 + c] = True

  def fn(x, m):
    y, stats = jaxnorm.batch_norm(x, mask=m, axis_name="d", virtual_batch_size=k)
    return y, stats.mean, stats.var, stats.count

  specs = dict(in_specs=(P("d"), P("d")), out_specs=(P("d"), P(), P(), P()))
  mapped = jax.jit(jax.shard_map(fn, mesh=mesh, **specs))
  with jax.set_mesh(mesh):
    args = [jax.device_put(a, NamedSharding(mesh, P("d"))) for a in (x, mask)]
    y, mean, var, count = (np.asarray(a) for a in mapped(*args))
  expected, emean, evar = ref.ghost_batch_norm(x, k, mask=mask)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=3e-5)
  np.testing.assert_allclose(mean, emean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(var, evar, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(count, mask.sum())
