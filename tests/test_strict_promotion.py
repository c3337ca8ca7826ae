"""Strict dtype promotion (``jax_numpy_dtype_promotion="strict"``, as Equinox's test suite
and many codebases run): every norm of the registry, in every front end, forward and
gradient, on half-precision and integer inputs, gives bit for bit what the standard mode
gives (jaxnorm's float32 statistics of bfloat16 data are deliberate, not an implicit
promotion); before, each raised ``TypePromotionError``."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from tests import reference as ref
from tests.cases import CASES, FUNCTION_IDS, FUNCTIONS, IDS, LAYOUTS

eqx = pytest.importorskip("equinox")
import jaxnorm.equinox as jeqx  # noqa: E402

SHAPE = LAYOUTS["nhwc"][0]
DTYPES = [jnp.bfloat16, jnp.int8]  # (float16 takes the same path as bfloat16)


def _same_in_both_modes(fn):
  """``fn()`` under strict promotion equals (bit for bit, NaN included) its standard result."""
  with jax.numpy_dtype_promotion("standard"):
    expected = fn()
  with jax.numpy_dtype_promotion("strict"):
    got = fn()
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))
  return got


def _input(dtype, rng):
  x = rng.normal(size=SHAPE) * 3 + 1
  return jnp.asarray(np.round(x) if dtype == jnp.int8 else x, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pure_function_forward_and_gradient(case, dtype, rng):
  x = _input(dtype, rng)
  g = jnp.asarray(rng.normal(1, 0.3, 8), jnp.bfloat16)  # half-precision parameters
  mask = jnp.asarray(rng.random(SHAPE[:-1] + (1,)) < 0.7)
  y = _same_in_both_modes(lambda: case.call(x, g, g))
  _same_in_both_modes(lambda: case.fn(x, g, g, mask=mask, **case.kwargs))
  expected = case.reference(np.asarray(x, np.float64), np.asarray(g, np.float64),
                            np.asarray(g, np.float64))  # fmt: skip
  np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=5e-2, atol=5e-2)
  if dtype != jnp.int8:

    def loss(x, g):
      return case.call(x, g, g).astype(jnp.float32).sum()

    _same_in_both_modes(lambda: jax.jit(jax.grad(loss, argnums=(0, 1)))(x, g))


@pytest.mark.parametrize("case", FUNCTIONS, ids=FUNCTION_IDS)
def test_other_norms_pure_functions(case):
  """bfloat16 x with float32 parameters and conditioning: forward and gradient."""
  args = case.arrays(jnp.bfloat16)
  _same_in_both_modes(lambda: jax.jit(case.fn)(*args))

  def loss(*a):
    return case.fn(*a).astype(jnp.float32).sum()

  _same_in_both_modes(lambda: jax.jit(jax.grad(loss))(*args))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linen_and_nnx_modules(case, rng, dtype=jnp.bfloat16):
  x = _input(dtype, rng)

  def linen():
    module = case.linen(param_dtype=jnp.bfloat16)
    variables = module.init(jax.random.key(0), x)
    return module.apply(variables, x, mutable=["batch_stats"])

  def linen_grad():  # float32 parameters, bfloat16 data
    module = case.linen()
    variables = module.init(jax.random.key(0), x)
    return jax.grad(
      lambda p: (
        module.apply({**variables, "params": p}, x, mutable=["batch_stats"])[0]
        .astype(jnp.float32)
        .sum()
      )
    )(variables["params"])

  def nnx_call():
    module = case.nnx(8)
    return module(x), nnx.state(module)

  _same_in_both_modes(linen)
  _same_in_both_modes(nnx_call)
  if dtype != jnp.int8:
    _same_in_both_modes(linen_grad)


@pytest.mark.parametrize("case", [c for c in CASES if c.equinox], ids=lambda c: c.name)
def test_equinox_modules(case, rng):
  x = jnp.moveaxis(_input(jnp.bfloat16, rng), -1, 1)  # channels-first, Equinox's layout
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    if case.module == "BatchNorm":
      module, state = eqx.nn.make_with_state(jeqx.BatchNorm)(8, "batch", mode="batch")
    elif case.module == "GroupNorm":
      module, state = jeqx.GroupNorm(2, 8), None
    else:
      module, state = getattr(jeqx, case.module)(x.shape[1:]), None

  def call(x):
    if state is None:
      return jax.vmap(module)(x)
    fn = jax.vmap(module, in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    return fn(x, state)[0]

  _same_in_both_modes(lambda: call(x))
  _same_in_both_modes(lambda: jax.grad(lambda x: call(x).astype(jnp.float32).sum())(x))


def test_add_norm_renorm_frozen_folding_and_kernels(rng):
  x = _input(jnp.bfloat16, rng)
  g = jnp.asarray(rng.normal(1, 0.3, 8), jnp.bfloat16)
  zeros, ones = jnp.zeros(8), jnp.ones(8)
  _same_in_both_modes(lambda: jaxnorm.add_layer_norm(x, x, g, g, residual_dtype=jnp.float32))
  _same_in_both_modes(
    lambda: jax.grad(lambda x: jaxnorm.add_rms_norm(x, x, g)[0].astype(jnp.float32).sum())(x)
  )
  _same_in_both_modes(lambda: jaxnorm.normalize(x, (1, 2), scale=False))
  _same_in_both_modes(lambda: jaxnorm.moments(x, (0, 1, 2)))
  _same_in_both_modes(lambda: jaxnorm.frozen_batch_norm(x, g, g, zeros, ones))
  _same_in_both_modes(
    lambda: jaxnorm.batch_renorm_step(
      x, g, g, zeros, ones, jnp.asarray(3), use_running_average=False
    )
  )
  stats = {"batch_stats": {"mean": zeros, "var": ones}, "params": {"scale": g}}
  _same_in_both_modes(
    lambda: jaxnorm.fold_batch_norm({"kernel": jnp.ones((2, 8), g.dtype)}, stats, epsilon=1e-5)
  )
  w = jnp.asarray(rng.normal(size=(4, 8)), jnp.bfloat16)
  _same_in_both_modes(lambda: jaxnorm.weight_norm(w, g))
  _same_in_both_modes(lambda: jaxnorm.spectral_norm(w, jnp.ones((1, 8), jnp.float32)))
  # The fused row kernels (Pallas's interpreter on CPU), forward.
  _same_in_both_modes(lambda: jaxnorm.rms_norm(x, g, implementation="pallas"))


def test_the_reference_agrees_with_the_standard_mode_result(rng):
  """(The results compared above are right, not just equal: one against the reference.)"""
  x = _input(jnp.bfloat16, rng)
  with jax.numpy_dtype_promotion("strict"):
    y = jaxnorm.layer_norm(x, reduction_axes=(1, 2, 3))
  expected = ref.layer_norm(np.asarray(x, np.float64), None, None, (1, 2, 3), (1, 2, 3), eps=1e-6)
  np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=2e-2, atol=2e-2)
