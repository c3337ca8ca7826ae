"""Batch Renormalization against the float64 reference: outputs, r/d clipping both ways,
the schedule, running statistics, gradients with r and d held constant, masks, devices,
transforms (with ghost batches in one scan) and both front ends."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

FIXED = dict(warmup_steps=0, r_max_steps=None, d_max_steps=None)  # limits from step 0


def _data(rng, shape=(16, 5), loc=2.0, scale=3.0):
  return rng.normal(loc, scale, shape).astype(np.float32)


# Running statistics that put r and d inside their bounds, above, below and on both sides.
RUNNING = {
  "inside": (np.full(5, 1.8), np.full(5, 8.0)),
  "r_high_d_high": (np.full(5, -3.0), np.full(5, 0.1)),  # σ small: r = r_max, d = +d_max
  "r_low_d_low": (np.full(5, 40.0), np.full(5, 900.0)),  # σ large, μ far above: r = 1/r_max
  "mixed": (np.array([-3.0, 40.0, 1.8, 2.0, 0.0]), np.array([0.1, 900.0, 8.0, 1.0, 50.0])),
}


@pytest.mark.parametrize("case", list(RUNNING))
def test_renorm_output_and_clipping_against_reference(case, rng):
  x = _data(rng)
  gamma, beta = rng.normal(1, 0.3, 5), rng.normal(0, 0.3, 5)
  mean, var = RUNNING[case]
  r_max, d_max = 2.5, 0.7
  y, stats = jaxnorm.batch_renorm(
    x, gamma, beta, mean=mean.astype(np.float32), var=var.astype(np.float32), r_max=r_max,
    d_max=d_max,
  )  # fmt: skip
  expected, bmean, bvar, r, d = ref.batch_renorm(x, mean, var, r_max, d_max, gamma, beta)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(stats.mean, bmean, rtol=1e-5)
  np.testing.assert_allclose(stats.var, bvar, rtol=1e-5)
  clipped = {"inside": (r > 1 / r_max) & (r < r_max) & (np.abs(d) < d_max)}
  clipped["r_high_d_high"] = (r == r_max) & (d == d_max)
  clipped["r_low_d_low"] = (r == 1 / r_max) & (d == -d_max)
  clipped["mixed"] = np.array([True, True, True, True, True])
  assert clipped[case].all(), (r, d)  # the case exercises what it says
  if case == "inside":  # unclipped, training output = inference output with the running stats
    np.testing.assert_allclose(
      np.asarray(y), ref.batch_norm_eval(x, mean, var, gamma, beta), rtol=1e-5, atol=2e-5
    )


def test_renorm_with_limits_one_and_zero_is_batch_norm(rng):
  x = _data(rng, (8, 3, 4))
  y, _ = jaxnorm.batch_renorm(x, mean=jnp.full(4, 5.0), var=jnp.full(4, 0.1), r_max=1.0, d_max=0.0)
  np.testing.assert_allclose(np.asarray(y), ref.batch_norm(x)[0], atol=3e-5)


@pytest.mark.parametrize(
  "schedule",
  [
    dict(warmup_steps=5000, r_max_steps=40000, d_max_steps=25000),
    dict(warmup_steps=100, r_max_steps=None, d_max_steps=300),
    FIXED,
  ],
)
def test_schedule_at_its_breakpoints(schedule):
  steps = [0, 1, 99, 100, 101, 200, 300, 4999, 5000, 5001, 22500, 25000, 30000, 40000, 10**6]
  r, d = jaxnorm.renorm_limits(jnp.array(steps), r_max=3.0, d_max=5.0, **schedule)
  w, rs, ds = schedule["warmup_steps"], schedule["r_max_steps"], schedule["d_max_steps"]
  expected = np.array([ref.renorm_limits(s, 3.0, 5.0, w, rs, ds) for s in steps])
  np.testing.assert_allclose(np.asarray(r), expected[:, 0], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(d), expected[:, 1], rtol=1e-6)


def test_schedule_errors():
  with pytest.raises(ValueError, match="r_max must be >= 1"):
    jaxnorm.renorm_limits(0, r_max=0.5)
  with pytest.raises(ValueError, match="d_max must be >= 0"):
    jaxnorm.BatchRenorm(use_running_average=False, d_max=-1.0).init(
      jax.random.key(0), jnp.ones((4, 2))
    )
  with pytest.raises(ValueError, match="comes before the end of the warm-up"):
    jnnx.BatchRenorm(2, warmup_steps=10, r_max_steps=5, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="virtual_batch_size"):
    jnnx.BatchRenorm(2, virtual_batch_size=2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="unbiased_running_var"):
    jnnx.BatchRenorm(2, unbiased_running_var=True, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="complex"):
    jaxnorm.batch_renorm(jnp.ones((4, 2), jnp.complex64), mean=jnp.zeros(2), var=jnp.ones(2))


def test_renorm_module_steps_running_statistics_and_inference(rng):
  schedule = dict(warmup_steps=2, r_max_steps=4, d_max_steps=3)
  brn = jaxnorm.BatchRenorm(use_running_average=False, momentum=0.8, **schedule)
  xs = [_data(rng, (12, 4), loc, 2.0) for loc in (0.0, 3.0, -2.0, 5.0, 1.0, 8.0)]
  variables = brn.init(jax.random.key(0), xs[0])
  assert int(variables["batch_stats"]["steps"]) == 0  # init does not count as a step
  gamma, beta = (np.asarray(variables["params"][k]) for k in ("scale", "bias"))
  ra_mean, ra_var = np.zeros(4), np.ones(4)
  linen_ys = []
  for step, x in enumerate(xs):
    y, upd = brn.apply(variables, x, mutable=["batch_stats"])
    linen_ys.append(np.asarray(y))
    variables = {**variables, **upd}
    r_max, d_max = ref.renorm_limits(step, 3.0, 5.0, 2, 4, 3)
    expected, bmean, bvar, _, _ = ref.batch_renorm(x, ra_mean, ra_var, r_max, d_max, gamma, beta)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=3e-5)
    ra_mean = ref.running_average(ra_mean, bmean, 0.8)
    ra_var = ref.running_average(ra_var, bvar, 0.8)
    np.testing.assert_allclose(variables["batch_stats"]["mean"], ra_mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(variables["batch_stats"]["var"], ra_var, rtol=1e-5)
    assert int(variables["batch_stats"]["steps"]) == step + 1
  y = jaxnorm.BatchRenorm(use_running_average=True).apply(variables, xs[0])
  np.testing.assert_allclose(np.asarray(y), ref.batch_norm_eval(xs[0], ra_mean, ra_var), atol=3e-5)

  # NNX: the same steps give the same outputs and state, and the state restores the schedule.
  nbrn = jnnx.BatchRenorm(4, momentum=0.8, rngs=nnx.Rngs(0), **schedule)
  for x in xs[:3]:
    nbrn(x)
  restored = jnnx.BatchRenorm(4, momentum=0.8, rngs=nnx.Rngs(1), **schedule)
  nnx.update(restored, nnx.state(nbrn))
  assert int(restored.steps[...]) == 3
  for x, y_linen in zip(xs[3:], linen_ys[3:], strict=True):
    np.testing.assert_allclose(np.asarray(restored(x)), y_linen, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(restored.mean[...], ra_mean, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(restored.var[...], ra_var, rtol=1e-5)


@pytest.mark.parametrize("case", ["inside", "mixed"])
def test_renorm_gradients_hold_r_and_d_constant(case, rng):
  x = _data(rng, (10, 5))
  gamma, beta = rng.normal(1, 0.3, 5).astype(np.float32), rng.normal(0, 0.3, 5).astype(np.float32)
  dy = rng.normal(size=x.shape).astype(np.float32)
  mean, var = (a.astype(np.float32) for a in RUNNING[case])

  def loss(x, g, b):
    return jnp.sum(jaxnorm.batch_renorm(x, g, b, mean=mean, var=var, r_max=2.5, d_max=0.7)[0] * dy)

  grads = jax.grad(loss, argnums=(0, 1, 2))(x, gamma, beta)
  _, _, _, r, d = ref.batch_renorm(x, mean, var, 2.5, 0.7, gamma, beta)
  for got, want in zip(grads, ref.batch_renorm_grads(x, dy, r, d, gamma), strict=True):
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-4)


def test_renorm_check_grads_where_clipping_makes_r_and_d_constant(rng):
  # Every feature is clipped on both r and d, so r and d are locally constant and the
  # numerical derivative sees the same function as autodiff with r and d held constant.
  x = _data(rng, (6, 3)).astype(np.float64)
  running = (jnp.array([-30.0, 100.0, -30.0]), jnp.array([0.01, 1e4, 0.01]))

  def fn(x, g, b):
    return jaxnorm.batch_renorm(x, g, b, mean=running[0], var=running[1], r_max=2.0, d_max=0.5)[0]

  with jax.enable_x64(True):
    args = (jnp.asarray(x), jnp.array([1.0, 0.5, 2.0]), jnp.array([0.1, 0.0, -0.2]))
    running = tuple(jnp.asarray(a, jnp.float64) for a in running)
    check_grads(fn, args, order=2, modes=("fwd", "rev"), atol=1e-4, rtol=1e-4)


def test_renorm_masks_and_devices_against_reference(rng):
  n_dev = 8
  mesh = jax.make_mesh((n_dev,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  x = _data(rng, (n_dev * 4, 5))
  counts = [4, 1, 0, 3, 2, 4, 0, 1]
  mask = np.zeros((n_dev * 4, 1), bool)
  for dev, c in enumerate(counts):
    mask[dev * 4 : dev * 4 + c] = True
  mean, var = RUNNING["mixed"]

  def fn(x, m):
    y, stats = jaxnorm.batch_renorm(
      x, mask=m, axis_name="d", mean=jnp.asarray(mean, jnp.float32),
      var=jnp.asarray(var, jnp.float32), r_max=2.5, d_max=0.7,
    )  # fmt: skip
    return y, stats.mean, stats.var

  specs = dict(in_specs=(P("d"), P("d")), out_specs=(P("d"), P(), P()))
  mapped = jax.jit(jax.shard_map(fn, mesh=mesh, **specs))
  with jax.set_mesh(mesh):
    args = [jax.device_put(a, NamedSharding(mesh, P("d"))) for a in (x, mask)]
    y, bmean, bvar = (np.asarray(a) for a in mapped(*args))
  expected, emean, evar, _, _ = ref.batch_renorm(x, mean, var, 2.5, 0.7, mask=mask)
  np.testing.assert_allclose(bmean, emean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bvar, evar, rtol=1e-5)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=3e-5)


def test_jit_vmap_grad_and_scan(rng):
  x = _data(rng, (3, 8, 4))  # 3 independent batches of 8
  fn = jax.jit(lambda x: jaxnorm.batch_renorm(x, mean=jnp.zeros(4), var=jnp.ones(4))[0])
  vm = jax.vmap(fn)(x)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(vm[i]), np.asarray(fn(x[i])), rtol=1e-6, atol=1e-6)
  ghost = jax.vmap(lambda x: jaxnorm.batch_norm(x, virtual_batch_size=4)[0])(x)
  np.testing.assert_allclose(np.asarray(ghost[1]), ref.ghost_batch_norm(x[1], 4)[0], atol=3e-5)
  g = jax.grad(lambda x: jnp.sum(jaxnorm.batch_norm(x, virtual_batch_size=4)[0] ** 3))(x[0])
  g_ref = jax.grad(
    lambda x: sum(jnp.sum(jaxnorm.batch_norm(x[i : i + 4])[0] ** 3) for i in (0, 4))
  )(x[0])
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-5)

  class Stack(nn.Module):
    @nn.compact
    def __call__(self, carry, x):
      y = jaxnorm.BatchRenorm(use_running_average=False, **FIXED)(x)
      return carry, jaxnorm.BatchNorm(use_running_average=False, virtual_batch_size=4)(y)

  scan = nn.scan(
    Stack, variable_axes={"params": 0, "batch_stats": 0}, split_rngs={"params": True},
    in_axes=0, length=3,
  )()  # fmt: skip
  variables = scan.init(jax.random.key(0), None, x)
  (_, ys), upd = scan.apply(variables, None, x, mutable=["batch_stats"])
  assert upd["batch_stats"]["BatchRenorm_0"]["steps"].tolist() == [1, 1, 1]
  assert ys.shape == x.shape and np.isfinite(np.asarray(ys)).all()

  @nnx.vmap(in_axes=0, out_axes=0)
  def make(key):
    return jnnx.BatchRenorm(4, rngs=nnx.Rngs(key), **FIXED)

  layers = make(jax.random.split(jax.random.key(0), 3))

  @nnx.scan(in_axes=(0, 0), out_axes=0)
  def run(layer, x):
    return layer(x)

  ys = run(layers, x)
  for i in range(3):
    expected = ref.batch_renorm(x[i], np.zeros(4), np.ones(4), 3.0, 5.0)[0]
    np.testing.assert_allclose(np.asarray(ys[i]), expected, rtol=1e-5, atol=3e-5)
  assert layers.steps[...].tolist() == [1, 1, 1]
