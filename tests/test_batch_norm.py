"""BatchNorm: training vs inference, the momentum convention, running statistics that init
never touches and empty batches never corrupt, and statistics per time step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests import reference as ref


def _train(module, variables, x, **kw):
  y, upd = module.apply(variables, x, mutable=["batch_stats"], **kw)
  return y, {**variables, **upd}


def test_training_steps_follow_the_momentum_convention(rng):
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.8)
  xs = [rng.normal(loc, 2.0, (16, 3, 3, 4)).astype(np.float32) for loc in (0.0, 1.0, -2.0)]
  variables = bn.init(jax.random.key(0), xs[0])
  np.testing.assert_array_equal(variables["batch_stats"]["mean"], 0.0)
  np.testing.assert_array_equal(variables["batch_stats"]["var"], 1.0)
  ra_mean, ra_var = np.zeros(4), np.ones(4)
  for x in xs:
    y, variables = _train(bn, variables, x)
    expected_y, mean, var = ref.batch_norm(x)
    np.testing.assert_allclose(np.asarray(y), expected_y, atol=2e-5)
    ra_mean = ref.running_average(ra_mean, mean, 0.8)
    ra_var = ref.running_average(ra_var, var, 0.8)
    np.testing.assert_allclose(variables["batch_stats"]["mean"], ra_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(variables["batch_stats"]["var"], ra_var, rtol=1e-5)
  # Inference uses the running averages, and per-example results do not depend on the batch.
  x = xs[0]
  y = jaxnorm.BatchNorm(use_running_average=True).apply(variables, x)
  expected = ref.batch_norm_eval(x, ra_mean, ra_var)
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5)
  alone = jaxnorm.BatchNorm(use_running_average=True).apply(variables, x[:1])
  np.testing.assert_allclose(alone, y[:1], atol=1e-6)


def test_use_running_average_from_call(rng):
  bn = jaxnorm.BatchNorm()
  x = rng.normal(size=(8, 5)).astype(np.float32)
  variables = bn.init(jax.random.key(0), x, use_running_average=False)
  y_eval = bn.apply(variables, x, use_running_average=True)
  np.testing.assert_allclose(y_eval, x / np.sqrt(1 + 1e-5), rtol=1e-6)
  y_train, upd = bn.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
  np.testing.assert_allclose(y_train, ref.batch_norm(x)[0], atol=2e-5)
  assert not np.allclose(upd["batch_stats"]["mean"], 0.0)


def test_init_does_not_update_and_accepts_a_batch_of_one(rng):
  bn = jaxnorm.BatchNorm(use_running_average=False)
  for shape in [(1, 6), (7, 6)]:
    x = rng.normal(3.0, 1.0, shape).astype(np.float32)
    variables = bn.init(jax.random.key(0), x)
    np.testing.assert_array_equal(variables["batch_stats"]["mean"], 0.0)
    np.testing.assert_array_equal(variables["batch_stats"]["var"], 1.0)
  y, variables = bn.init_with_output(jax.random.key(0), x)
  np.testing.assert_allclose(y, ref.batch_norm(x)[0], atol=2e-5)  # batch statistics at init


@pytest.mark.parametrize("shape", [(3,), (1, 3), (1, 1, 1, 3)])
def test_init_with_one_value_per_feature_returns_the_bias(shape):
  """At init, one value per feature is normalized with its own batch statistics (mean x,
  variance 0), which gives β, what Flax gives; the running statistics are not touched."""
  x = jnp.broadcast_to(jnp.arange(3.0), shape)
  bias_init = lambda key, shape, dtype: jnp.array([0.5, -1.0, 2.0], dtype)  # noqa: E731
  bn = jaxnorm.BatchNorm(bias_init=bias_init)
  y, variables = bn.init_with_output(jax.random.key(0), x, use_running_average=False)
  np.testing.assert_array_equal(y, jnp.broadcast_to(jnp.array([0.5, -1.0, 2.0]), shape))
  np.testing.assert_array_equal(variables["batch_stats"]["mean"], 0.0)
  np.testing.assert_array_equal(variables["batch_stats"]["var"], 1.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_nan_batch_does_not_poison_the_running_statistics(jit, rng):
  """A feature whose batch statistics are not finite keeps its running values (the output
  of that step still shows the NaN); the others take the batch as usual."""
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.9)
  batches = [rng.normal(1.0, 2.0, (16, 4)).astype(np.float32) for _ in range(51)]
  poisoned = batches[0].copy()
  poisoned[3, 2] = np.nan  # one NaN in channel 2
  all_nan = np.full_like(batches[0], np.nan)

  def step(variables, x):
    y, upd = bn.apply(variables, x, mutable=["batch_stats"])
    return y, {**variables, **upd}

  step = jax.jit(step) if jit else step
  init = bn.init(jax.random.key(0), batches[0])

  def run(first):
    variables = init
    for i, x in enumerate(([first] if first is not None else []) + batches[1:]):
      y, variables = step(variables, x)
      if i == 0 and first is not None and np.isnan(first).any():
        assert np.isnan(np.asarray(y)[:, 2]).any()  # divergence stays visible
    return {k: np.asarray(v) for k, v in variables["batch_stats"].items()}

  clean, with_batch = run(None), run(batches[0])
  for first in (all_nan, poisoned):
    stats = run(first)
    skipped = [0, 1, 2, 3] if first is all_nan else [2]
    kept = [c for c in range(4) if c not in skipped]
    for name in ("mean", "var"):
      assert np.all(np.isfinite(stats[name]))
      np.testing.assert_array_equal(stats[name][skipped], clean[name][skipped])
      np.testing.assert_array_equal(stats[name][kept], with_batch[name][kept])
  # The reference: the clean run is the momentum recursion over the 50 clean batches.
  mean = np.zeros(4)
  for x in batches[1:]:
    mean = ref.running_average(mean, x.mean(0), 0.9)
  np.testing.assert_allclose(clean["mean"], mean, rtol=1e-5, atol=1e-6)


def test_fully_masked_batch_leaves_running_statistics_untouched(rng):
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.5)
  x = rng.normal(size=(8, 4)).astype(np.float32)
  variables = bn.init(jax.random.key(0), x)
  _, variables = _train(bn, variables, x)
  before = jax.tree_util.tree_map(np.asarray, variables["batch_stats"])
  y, after = _train(bn, variables, x * 100, mask=np.zeros((8, 1), bool))
  assert np.all(np.isfinite(y))
  jax.tree_util.tree_map(np.testing.assert_array_equal, after["batch_stats"], before)
  # Per feature: a feature with no valid element keeps its statistics, the others move.
  mask = np.ones((8, 4), bool)
  mask[:, 2] = False
  _, partly = _train(bn, variables, x + 5, mask=mask)
  np.testing.assert_array_equal(partly["batch_stats"]["mean"][2], before["mean"][2])
  _, mean, _ = ref.batch_norm(x + 5)
  moved = np.asarray(partly["batch_stats"]["mean"])[[0, 1, 3]]
  np.testing.assert_allclose(
    moved, 0.5 * before["mean"][[0, 1, 3]] + 0.5 * mean[[0, 1, 3]], rtol=1e-5
  )


def test_masked_statistics_use_only_valid_elements(rng):
  x = rng.normal(size=(10, 3)).astype(np.float32)
  mask = rng.random((10, 1)) < 0.5
  mask[0] = mask[1] = True
  y, stats = jaxnorm.batch_norm(x, mask=mask)
  valid = x[mask[:, 0]]
  np.testing.assert_allclose(stats.mean, valid.mean(0), rtol=1e-5)
  np.testing.assert_allclose(stats.var, valid.var(0), rtol=1e-5)
  np.testing.assert_allclose(stats.count, mask.sum())
  np.testing.assert_allclose(y, (x - valid.mean(0)) / np.sqrt(valid.var(0) + 1e-5), atol=2e-5)


def test_sequence_statistics_per_time_step(rng):
  x = rng.normal(size=(6, 5, 4)).astype(np.float32) + np.arange(5)[None, :, None]
  bn = jaxnorm.BatchNorm(use_running_average=False, reduction_axes=0, momentum=0.0)
  variables = bn.init(jax.random.key(0), x)
  assert variables["batch_stats"]["mean"].shape == (5, 4)
  assert variables["params"]["scale"].shape == (4,)
  y, variables = _train(bn, variables, x)
  expected_y, mean, var = ref.batch_norm(x, axis=(1, 2))
  np.testing.assert_allclose(np.asarray(y), expected_y, atol=2e-5)
  np.testing.assert_allclose(variables["batch_stats"]["mean"], mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(variables["batch_stats"]["var"], var, rtol=1e-5)
  y_eval = jaxnorm.BatchNorm(use_running_average=True, reduction_axes=0).apply(variables, x)
  np.testing.assert_allclose(np.asarray(y_eval), expected_y, atol=2e-5)


def test_pure_functions_train_then_infer(rng):
  x = rng.normal(1.0, 2.0, (12, 5)).astype(np.float32)
  gamma, beta = rng.normal(size=5).astype(np.float32), rng.normal(size=5).astype(np.float32)
  y, stats = jaxnorm.batch_norm(x, gamma, beta)
  np.testing.assert_allclose(np.asarray(y), ref.batch_norm(x, gamma, beta)[0], atol=2e-5)
  mean, var = jaxnorm.update_running_average(jnp.zeros(5), jnp.ones(5), stats, 0.9)
  np.testing.assert_allclose(mean, ref.running_average(0.0, stats.mean, 0.9), rtol=1e-6)
  y_eval = jaxnorm.batch_norm(x, gamma, beta, mean=mean, var=var)
  np.testing.assert_allclose(
    np.asarray(y_eval), ref.batch_norm_eval(x, mean, var, gamma, beta), atol=2e-5
  )


@pytest.mark.parametrize("momentum", [0.0, 0.99, 1.0])
def test_momentum_extremes(momentum, rng):
  x = rng.normal(2.0, 1.0, (8, 3)).astype(np.float32)
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=momentum)
  _, variables = _train(bn, bn.init(jax.random.key(0), x), x)
  expected = ref.running_average(np.zeros(3), x.mean(0), momentum)
  np.testing.assert_allclose(variables["batch_stats"]["mean"], expected, rtol=1e-5, atol=1e-7)
