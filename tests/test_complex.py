"""Complex inputs with Flax's semantics in every norm: complex mean, real variance
``E|x − μ|²`` (mean square ``E|x|²`` for RMSNorm), real parameters, complex output; BatchNorm
keeps a complex running mean and a real running variance."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests import reference as ref
from tests.cases import CASES, IDS


def _complex(rng, shape, loc=0.0):
  return (rng.normal(loc, 1.5, shape) + 1j * rng.normal(-loc, 0.5, shape)).astype(np.complex64)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pure_functions_match_the_complex_reference(case, jit, rng):
  x = _complex(rng, (6, 5, 4), loc=2.0)
  gamma, beta = rng.normal(1.0, 0.3, 4), rng.normal(0.0, 0.3, 4)
  fn = jax.jit(case.call) if jit else case.call
  y = fn(x, jnp.asarray(gamma, jnp.float32), jnp.asarray(beta, jnp.float32))
  assert y.dtype == jnp.complex64
  np.testing.assert_allclose(np.asarray(y), case.reference(x, gamma, beta), atol=2e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_modules_match_the_reference_and_flax(case, rng):
  x = _complex(rng, (6, 5, 4))
  ours = case.linen()
  theirs = case.flax_linen()
  variables = theirs.init(jax.random.key(0), x)
  y_ours = ours.apply(variables, x, mutable=["batch_stats"])[0]
  y_theirs = theirs.apply(variables, x, mutable=["batch_stats"])[0]
  assert y_ours.dtype == y_theirs.dtype == jnp.complex64
  np.testing.assert_allclose(np.asarray(y_ours), case.reference(x, None, None), atol=2e-5)
  np.testing.assert_allclose(np.asarray(y_ours), np.asarray(y_theirs), atol=2e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_batch_norm_complex_running_statistics(masked, rng):
  """Flax's own ``test_batch_norm_complex`` checks, against the formulas."""
  x = _complex(rng, (4, 3, 2))
  mask = None
  if masked:
    mask = rng.random((4, 3, 1)) < 0.6
    mask[0, 0] = mask[1, 1] = True
    x = np.where(mask, x, np.nan).astype(np.complex64)  # masked values never enter
  bn = jaxnorm.BatchNorm(momentum=0.9, use_running_average=False, dtype=jnp.complex64)
  y, variables = bn.init_with_output(jax.random.key(0), x, mask=mask)
  assert variables["batch_stats"]["mean"].dtype == jnp.complex64
  assert variables["batch_stats"]["var"].dtype == jnp.float32
  np.testing.assert_allclose(np.mean(y, (0, 1), where=mask), 0.0, atol=1e-5)
  np.testing.assert_allclose(np.var(y, (0, 1), where=mask), 1.0, rtol=1e-4)
  _, upd = bn.apply(variables, x, mask=mask, mutable=["batch_stats"])
  _, mean, var = ref.batch_norm(x, mask=mask)
  stats = upd["batch_stats"]
  assert stats["mean"].dtype == jnp.complex64 and stats["var"].dtype == jnp.float32
  np.testing.assert_allclose(stats["mean"], 0.1 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * var, rtol=1e-5)
  # Inference with the complex running statistics.
  y_eval = jaxnorm.BatchNorm(use_running_average=True).apply({**variables, **upd}, x)
  expected = ref.batch_norm_eval(x, stats["mean"], stats["var"])
  np.testing.assert_allclose(np.asarray(y_eval), expected, atol=2e-5, equal_nan=True)


def test_flax_initialized_real_running_mean_becomes_complex(rng):
  """A checkpoint whose running mean is real (Flax's init) takes complex updates, as in Flax."""
  x = _complex(rng, (8, 3))
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.5)
  variables = nn.BatchNorm(use_running_average=False).init(jax.random.key(0), x)
  assert variables["batch_stats"]["mean"].dtype == jnp.float32
  _, upd = bn.apply(variables, x, mutable=["batch_stats"])
  np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.5 * x.mean(0), rtol=1e-5)


def _layer_norm_formula(x, g, b, eps=1e-6):
  mean = jnp.mean(x, -1, keepdims=True)
  var = jnp.mean(jnp.abs(x - mean) ** 2, -1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * g[None] + b[None]


@pytest.mark.parametrize("masked", [False, True])
def test_complex_gradients_match_autodiff_of_the_formula(masked, rng):
  x = jnp.asarray(_complex(rng, (3, 8), loc=1.0))
  g, b = jnp.asarray(rng.normal(1, 0.2, 8), jnp.float32), jnp.zeros(8)
  cot = jnp.asarray(_complex(rng, (3, 8)))
  mask = jnp.ones((3, 8), bool) if masked else None

  def loss(fn):
    return lambda x, g: jnp.real(jnp.sum(fn(x, g) * jnp.conj(cot)))

  ours = jax.grad(loss(lambda x, g: jaxnorm.layer_norm(x, g, b, mask=mask)), (0, 1))(x, g)
  theirs = jax.grad(loss(lambda x, g: _layer_norm_formula(x, g, b)), (0, 1))(x, g)
  for a, e in zip(ours, theirs, strict=True):
    assert a.dtype == e.dtype
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=1e-4)
