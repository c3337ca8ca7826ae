"""Counts and sums in at least float32 whatever the statistics' dtype (float16 cannot hold
a count above 65,504, bfloat16 rounds 257 to 256), and running statistics in float64 when
the parameters are float64 under ``jax_enable_x64``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests import reference as ref


def test_float16_layer_norm_over_more_than_65504_values(rng):
  x = rng.normal(1.0, 2.0, (1, 70000)).astype(np.float16)
  ln = jaxnorm.LayerNorm(force_float32_reductions=False)
  variables = ln.init(jax.random.key(0), x)
  y = ln.apply(variables, x)
  assert y.dtype == jnp.float32  # float16 input promoted with the float32 parameters
  np.testing.assert_allclose(np.asarray(y), ref.layer_norm(x), atol=2e-2)
  y16 = jaxnorm.layer_norm(x, force_float32_reductions=False)
  assert y16.dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(y16, np.float64), ref.layer_norm(x), atol=2e-2)
  grad = jax.grad(lambda x: jnp.sum(jaxnorm.layer_norm(x, force_float32_reductions=False)))(x)
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


def test_float16_batch_norm_running_statistics(rng):
  x = rng.normal(3.0, 2.0, (32, 48, 48, 2)).astype(np.float16)  # 73,728 values per channel
  bn = jaxnorm.BatchNorm(
    use_running_average=False, force_float32_reductions=False, param_dtype=jnp.float16
  )
  variables = bn.init(jax.random.key(0), x[:2])
  y, upd = bn.apply(variables, x, mutable=["batch_stats"])
  expected_y, mean, var = ref.batch_norm(x)
  np.testing.assert_allclose(np.asarray(y, np.float64), expected_y, atol=2e-2)
  stats = upd["batch_stats"]
  assert stats["mean"].dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(stats["mean"], np.float64), 0.01 * mean, rtol=2e-3)
  np.testing.assert_allclose(np.asarray(stats["var"], np.float64), 0.99 + 0.01 * var, rtol=2e-3)
  # Parameter gradients sum over 73,728 values per channel: dβ = Σ ct, dγ = Σ ct·x̂.
  cot = (1e-3 * rng.normal(size=x.shape)).astype(np.float16)
  xhat = (np.float64(x) - mean) / np.sqrt(var + 1e-5)
  bn = jaxnorm.BatchNorm(force_float32_reductions=False, param_dtype=jnp.float16)
  for use_ra in (False, True):
    if use_ra:
      variables = {**variables, "batch_stats": {"mean": mean, "var": var}}

    def loss(params, use_ra=use_ra, variables=variables):
      y, _ = bn.apply(
        {**variables, "params": params}, x, use_running_average=use_ra, mutable=["batch_stats"]
      )
      return jnp.sum(y.astype(jnp.float32) * cot)

    grads = jax.grad(loss)(variables["params"])
    sum_axes = (0, 1, 2)
    np.testing.assert_allclose(grads["bias"], np.float64(cot).sum(sum_axes), rtol=1e-2)
    np.testing.assert_allclose(grads["scale"], (cot * xhat).sum(sum_axes), rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("n", [257, 3001])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_counts_are_exact(n, dtype):
  x = jnp.full((2, n), 3.0, dtype)
  m = jaxnorm.moments(x, -1, force_float32_reductions=False)
  assert m.count.dtype == jnp.float32 and m.mean.dtype == dtype
  np.testing.assert_array_equal(m.count, n)
  np.testing.assert_array_equal(np.asarray(m.mean, np.float32), 3.0)
  masked = jaxnorm.moments(x, -1, mask=jnp.ones((2, n), bool), force_float32_reductions=False)
  np.testing.assert_array_equal(masked.count, n)


def test_float64_running_statistics_under_x64(rng):
  with jax.enable_x64(True):
    x = rng.normal(1e7, 1.0, (64, 3))  # float64 data of mean 1e7
    bn = jaxnorm.BatchNorm(momentum=0.0, param_dtype=jnp.float64)
    variables = bn.init(jax.random.key(0), x, use_running_average=False)
    assert variables["batch_stats"]["mean"].dtype == jnp.float64
    assert variables["batch_stats"]["var"].dtype == jnp.float64
    y_train, upd = bn.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
    assert upd["batch_stats"]["mean"].dtype == jnp.float64
    y_eval = bn.apply({**variables, **upd}, x, use_running_average=True)
    # With momentum 0, evaluation on the training batch is training (float32 statistics
    # were 0.14 standard deviations off here).
    np.testing.assert_allclose(np.asarray(y_eval), np.asarray(y_train), atol=1e-8)
    np.testing.assert_allclose(np.asarray(y_train), ref.batch_norm(x)[0], atol=1e-8)
    # float32 parameters keep Flax's float32 running statistics.
    v32 = jaxnorm.BatchNorm().init(jax.random.key(0), x, use_running_average=False)
    assert v32["batch_stats"]["mean"].dtype == jnp.float32


@pytest.mark.parametrize("kind", ["layer", "rms", "batch"])
def test_bfloat16_forward_mode_tangent(kind, rng):
  """``jax.jvp`` of a bfloat16 norm (float32 parameters, every input and parameter moved)
  against the float64 reference's central difference. On XLA:CPU the tangent is a sum of
  parts, each rounded to bfloat16 on its own (``benchmarks/RESULTS.md``, item 56): a few
  roundings of the largest part, far inside a missing or doubled term's error (order 1)."""
  x = rng.normal(2.0, 1.5, (6, 10, 64)).astype(jnp.bfloat16)
  dx = rng.normal(size=x.shape).astype(jnp.bfloat16)
  gamma, beta = rng.normal(1.0, 0.3, 64), rng.normal(0.0, 0.3, 64)
  dgamma, dbeta = rng.normal(size=64), rng.normal(size=64)
  make, reference = {
    "layer": (jaxnorm.LayerNorm, ref.layer_norm),
    "rms": (jaxnorm.RMSNorm, lambda x, g, b: ref.rms_norm(x, g)),
    "batch": (
      lambda **kw: jaxnorm.BatchNorm(use_running_average=False, **kw),
      lambda x, g, b: ref.batch_norm(x, g, b)[0],
    ),
  }[kind]
  module = make(dtype=jnp.bfloat16)
  variables = module.init(jax.random.key(0), x)
  params = {"scale": jnp.asarray(gamma, jnp.float32)}
  tangents = {"scale": jnp.asarray(dgamma, jnp.float32)}
  if "bias" in variables["params"]:
    params["bias"], tangents["bias"] = (
      jnp.asarray(beta, jnp.float32),
      jnp.asarray(dbeta, jnp.float32),
    )
  rest = {k: v for k, v in variables.items() if k != "params"}

  def forward(params, x):
    out = module.apply({**rest, "params": params}, x, mutable=list(rest) or False)
    return out[0] if rest else out

  y, dy = jax.jvp(forward, (params, jnp.asarray(x)), (tangents, jnp.asarray(dx)))
  assert dy.dtype == jnp.bfloat16
  h, f = 1e-6, np.float64
  x64, dx64 = np.asarray(x, f), np.asarray(dx, f)
  g64, b64 = np.asarray(params["scale"], f), np.asarray(params.get("bias", 0.0), f)
  dg, db = np.asarray(tangents["scale"], f), np.asarray(tangents.get("bias", 0.0), f)
  want = (
    reference(x64 + h * dx64, g64 + h * dg, b64 + h * db)
    - reference(x64 - h * dx64, g64 - h * dg, b64 - h * db)
  ) / (2 * h)
  err = np.max(np.abs(np.asarray(dy, f) - want)) / np.max(np.abs(want))
  assert err < 2e-2, err
