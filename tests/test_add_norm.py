"""Add & Norm: ``(y, h) = (norm(x + residual), x + residual)`` for LayerNorm and RMSNorm
(every RMS variant), as pure functions and as the ``residual`` call argument of the modules
of both front ends: against the float64 reference, ``check_grads`` in both modes, the
gradients of the unfused composition, a float32 residual stream under bfloat16
activations, and a clear error for mismatched shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

VARIANTS = {  # name: (Add & Norm, the plain norm, the reference of the norm)
  "layer": (jaxnorm.add_layer_norm, jaxnorm.layer_norm, ref.layer_norm),
  "rms": (jaxnorm.add_rms_norm, jaxnorm.rms_norm, ref.rms_norm),
  "rms_eps_outside": (
    lambda *a, **k: jaxnorm.add_rms_norm(*a, epsilon_in_root=False, epsilon=1e-3, **k),
    lambda *a, **k: jaxnorm.rms_norm(*a, epsilon_in_root=False, epsilon=1e-3, **k),
    lambda *a: ref.rms_norm(*a, eps=1e-3, eps_in_root=False),
  ),
  "rms_zero_centered": (
    lambda *a, **k: jaxnorm.add_rms_norm(*a, zero_centered_scale=True, **k),
    lambda *a, **k: jaxnorm.rms_norm(*a, zero_centered_scale=True, **k),
    lambda *a: ref.rms_norm(*a, zero_centered=True),
  ),
}


def _inputs(rng, shape=(3, 5, 16), dtype=np.float32):
  x = rng.normal(0.3, 1.0, shape).astype(dtype)
  r = rng.normal(1.0, 2.0, shape).astype(dtype)
  g = rng.normal(0.0, 0.3, shape[-1]).astype(dtype) + (0 if dtype == np.float64 else 1)
  b = rng.normal(0.0, 0.3, shape[-1]).astype(dtype)
  return x, r, g, b


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_matches_the_reference(name, jit, rng):
  add_norm, _, reference = VARIANTS[name]
  x, r, g, b = _inputs(rng)
  fn = jax.jit(add_norm) if jit else add_norm
  y, h = fn(x, r, g, b)
  np.testing.assert_array_equal(h, x + r)
  np.testing.assert_allclose(np.asarray(y), reference(x + r, g, b), atol=2e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_check_grads_both_outputs(name):
  add_norm = VARIANTS[name][0]
  with jax.enable_x64(True):
    x, r, g, b = (jnp.asarray(a) for a in _inputs(np.random.default_rng(2), (2, 3, 6), np.float64))
    check_grads(add_norm, (x, r, g, b), order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gradients_equal_the_unfused_composition(name, rng):
  add_norm, norm, _ = VARIANTS[name]
  x, r, g, b = _inputs(rng)
  cy, ch = rng.normal(size=x.shape).astype(np.float32), rng.normal(size=x.shape).astype(np.float32)

  def fused(x, r, g, b):
    y, h = add_norm(x, r, g, b)
    return jnp.sum(y * cy) + jnp.sum(h * ch)

  def unfused(x, r, g, b):
    h = x + r
    return jnp.sum(norm(h, g, b) * cy) + jnp.sum(h * ch)

  for a, e in zip(
    jax.grad(fused, (0, 1, 2, 3))(x, r, g, b),
    jax.grad(unfused, (0, 1, 2, 3))(x, r, g, b),
    strict=True,
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_float32_residual_under_bfloat16_activations(name, rng):
  add_norm, _, reference = VARIANTS[name]
  x, r, g, b = _inputs(rng)
  xb = jnp.asarray(x, jnp.bfloat16)
  y, h = add_norm(xb, r, g, b, residual_dtype=jnp.float32, dtype=jnp.bfloat16)
  assert h.dtype == jnp.float32 and y.dtype == jnp.bfloat16
  h_expected = np.asarray(xb, np.float32) + r
  np.testing.assert_array_equal(h, h_expected)  # the stream keeps float32 precision
  np.testing.assert_allclose(np.float32(y), reference(h_expected, g, b), atol=3e-2)
  dx, dr = jax.grad(lambda x, r: jnp.sum(add_norm(x, r, g, b, residual_dtype=jnp.float32)[1]),
                    (0, 1))(xb, r)  # fmt: skip
  assert dx.dtype == jnp.bfloat16 and dr.dtype == jnp.float32
  np.testing.assert_array_equal(np.float32(dx), 1.0)


@pytest.mark.parametrize("api", ["linen", "nnx"])
@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_modules_take_a_residual(norm, api, rng):
  x, r, _, _ = _inputs(rng)
  xb = jnp.asarray(x, jnp.bfloat16)
  kw = dict(residual_dtype=jnp.float32, dtype=jnp.bfloat16)
  if api == "linen":
    module = getattr(jaxnorm, norm)(**kw)
    variables = module.init(jax.random.key(0), xb)
    (y, h), plain = module.apply(variables, xb, residual=r), module.apply(variables, xb)
    # The unfused Linen composition normalizes the same float32 stream.
    y_unfused = module.apply(variables, jnp.asarray(xb, jnp.float32) + r)
    np.testing.assert_array_equal(np.float32(y), np.float32(y_unfused))
  else:  # (flax.nnx's promote_dtype would round an unfused float32 input to bfloat16)
    module = getattr(jnnx, norm)(16, **kw, rngs=nnx.Rngs(0))
    (y, h), plain = module(xb, residual=r), module(xb)
  assert h.dtype == jnp.float32 and y.dtype == plain.dtype == jnp.bfloat16
  h_expected = np.asarray(xb, np.float32) + r
  np.testing.assert_array_equal(h, h_expected)
  reference = ref.layer_norm if norm == "LayerNorm" else ref.rms_norm
  np.testing.assert_allclose(np.float32(y), reference(h_expected), atol=3e-2)


def test_shapes_must_match():
  with pytest.raises(ValueError, match=r"x of shape \(2, 4\) to a residual of shape \(4,\)"):
    jaxnorm.add_layer_norm(jnp.ones((2, 4)), jnp.ones(4))
