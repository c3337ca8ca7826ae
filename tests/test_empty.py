"""Size-0 dimensions anywhere (batch, reduced or feature axes): an empty output of the right
shape and dtype, zero (finite) gradients, statistics of count 0, and BatchNorm running
statistics left untouched when no element was seen. Eager and under ``jit``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests.cases import CASES, FUNCTIONS, IDS

# (N, T, C) with one size-0 axis: the batch, a reduced axis, the feature axis.
SHAPES = [(0, 3, 4), (2, 0, 4), (2, 3, 0)]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pure_functions_on_empty_inputs(case, shape, jit):
  x = jnp.zeros(shape)
  gamma, beta = jnp.ones(shape[-1]), jnp.zeros(shape[-1])
  fn = jax.jit(case.call) if jit else case.call
  y = fn(x, gamma, beta)
  assert y.shape == shape and y.dtype == jnp.float32

  def loss(x, g, b):
    return jnp.sum(fn(x, g, b) ** 2)

  grads = jax.grad(loss, argnums=(0, 1, 2))(x, gamma, beta)
  for g, like in zip(grads, (x, gamma, beta), strict=True):
    assert g.shape == like.shape
    np.testing.assert_array_equal(g, 0.0)  # a sum over nothing


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", [c for c in FUNCTIONS if c.batched], ids=lambda c: c.name)
def test_other_norms_on_an_empty_batch(case, jit):
  """Every per-sample array (x, conditioning, labels) with no sample: an empty output of
  the full call's other dimensions and dtype, and zero gradients of the right shapes."""
  args, full = case.arrays(batch=0), case.arrays()
  fn = jax.jit(case.fn) if jit else case.fn
  y, want = fn(*args), jax.eval_shape(case.fn, *full)
  assert y.shape == (0, *want.shape[1:]) and y.dtype == want.dtype
  wrt = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
  grads = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=wrt)(*args)
  for i, g in zip(wrt, grads, strict=True):
    assert g.shape == args[i].shape
    np.testing.assert_array_equal(g, 0.0)  # a sum over nothing


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_modules_on_empty_inputs(case, shape):
  module = case.linen()
  x = jnp.zeros(shape)
  y, variables = module.init_with_output(jax.random.key(0), x)
  assert y.shape == shape
  y = module.apply(variables, x, mutable=["batch_stats"])[0]
  assert y.shape == shape


@pytest.mark.parametrize("mask", [False, True])
def test_moments_of_empty_groups(mask):
  x = jnp.zeros((3, 0))
  m = jaxnorm.moments(x, -1, mask=jnp.ones((3, 0), bool) if mask else None)
  for s in m:
    assert s.shape == (3,)
    np.testing.assert_array_equal(s, 0.0)
  empty = jaxnorm.moments(jnp.zeros((0, 5)), 0)
  np.testing.assert_array_equal(empty.count, 0.0)
  assert jaxnorm.moments(jnp.zeros((0, 5)), 1).mean.shape == (0,)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_empty_batch_leaves_running_statistics_untouched(jit, rng):
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.5)
  x = jnp.asarray(rng.normal(2.0, 3.0, (8, 4)), jnp.float32)
  variables = bn.init(jax.random.key(0), x)
  _, upd = bn.apply(variables, x, mutable=["batch_stats"])
  variables = {**variables, **upd}

  def step(variables, x):
    return bn.apply(variables, x, mutable=["batch_stats"])

  step = jax.jit(step) if jit else step
  y, after = step(variables, jnp.zeros((0, 4)))
  assert y.shape == (0, 4)
  jax.tree_util.tree_map(np.testing.assert_array_equal, after, upd)
  # Inference and a training step on a (3, 0) input (no features at all).
  bn0 = jaxnorm.BatchNorm()
  y, v0 = bn0.init_with_output(jax.random.key(0), jnp.zeros((3, 0)), use_running_average=False)
  assert y.shape == (3, 0) and v0["batch_stats"]["mean"].shape == (0,)
  assert bn0.apply(v0, jnp.zeros((3, 0)), use_running_average=True).shape == (3, 0)


def test_the_reported_reproductions():
  """The four calls of the report, which raised obscure errors."""
  assert jaxnorm.layer_norm(jnp.zeros((0, 4))).shape == (0, 4)
  bn = jaxnorm.BatchNorm(use_running_average=False)
  assert bn.init_with_output(jax.random.key(0), jnp.zeros((3, 0)))[0].shape == (3, 0)
  gn = jaxnorm.GroupNorm(num_groups=2)
  assert gn.init_with_output(jax.random.key(0), jnp.zeros((0, 2, 2, 4)))[0].shape == (0, 2, 2, 4)
  assert jaxnorm.moments(jnp.zeros((3, 0)), -1).mean.shape == (3,)
