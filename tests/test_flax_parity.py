"""Differential tests: each jaxnorm module against its flax.linen namesake.

Same constructor arguments, same init variables (tree, shapes, dtypes, values), same
outputs, same updated batch_stats and same gradients on ordinary data; Flax checkpoints
load unchanged.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

import jaxnorm
from tests.cases import NAMES

RANDOM_INIT = dict(scale_init=nn.initializers.normal(0.5), bias_init=nn.initializers.normal(0.5))

CONFIGS = [
  # (name, kwargs, input shape, input dtype)
  ("BatchNorm", dict(use_running_average=False), (6, 5, 5, 8), jnp.float32),
  ("BatchNorm", dict(use_running_average=False, momentum=0.9, axis=1), (6, 8, 5, 5), jnp.float32),
  ("BatchNorm", dict(use_running_average=False, axis=(1, 2)), (6, 4, 8), jnp.float32),
  (
    "BatchNorm",
    dict(use_running_average=False, use_bias=False, **RANDOM_INIT),
    (16, 8),
    jnp.float32,
  ),
  ("BatchNorm", dict(use_running_average=False, dtype=jnp.bfloat16), (6, 5, 8), jnp.float32),
  ("BatchNorm", dict(use_running_average=False), (6, 5, 8), jnp.bfloat16),
  (
    "BatchNorm",
    dict(use_running_average=False, force_float32_reductions=False, param_dtype=jnp.bfloat16),
    (6, 5, 8),
    jnp.float32,
  ),
  ("LayerNorm", {}, (4, 7, 16), jnp.float32),
  ("LayerNorm", dict(**RANDOM_INIT), (4, 7, 16), jnp.float32),
  ("LayerNorm", dict(reduction_axes=(1, 2, 3), feature_axes=(-1,)), (3, 4, 4, 8), jnp.float32),
  ("LayerNorm", dict(reduction_axes=(1, 2), feature_axes=(1, 2)), (3, 4, 8), jnp.float32),
  ("LayerNorm", dict(use_scale=False, epsilon=1e-3), (4, 16), jnp.float32),
  ("LayerNorm", dict(param_dtype=jnp.bfloat16), (4, 16), jnp.bfloat16),
  ("LayerNorm", dict(dtype=jnp.float16), (4, 16), jnp.float32),
  ("RMSNorm", {}, (4, 7, 16), jnp.float32),
  ("RMSNorm", dict(scale_init=nn.initializers.normal(0.5)), (4, 16), jnp.float32),
  ("RMSNorm", dict(reduction_axes=(1, 2), feature_axes=-1), (3, 5, 16), jnp.float32),
  ("RMSNorm", {}, (4, 16), jnp.bfloat16),
  ("GroupNorm", dict(num_groups=4), (3, 5, 5, 8), jnp.float32),
  ("GroupNorm", dict(num_groups=None, group_size=2, **RANDOM_INIT), (3, 5, 5, 8), jnp.float32),
  ("GroupNorm", dict(num_groups=8), (3, 6, 16), jnp.float32),
  ("GroupNorm", dict(num_groups=2, reduction_axes=(-1,)), (3, 5, 8), jnp.float32),
  ("GroupNorm", dict(num_groups=1), (3, 4, 4, 8), jnp.bfloat16),
  ("InstanceNorm", {}, (3, 5, 5, 8), jnp.float32),
  ("InstanceNorm", dict(feature_axes=1, **RANDOM_INIT), (3, 8, 5, 5), jnp.float32),
  ("InstanceNorm", dict(use_bias=False), (3, 7, 8), jnp.float32),
]
_leaves = jax.tree_util.tree_leaves
IDS = [f"{n}-{i}" for i, (n, *_) in enumerate(CONFIGS)]


def test_every_norm_of_the_registry_has_configs():
  assert {c[0] for c in CONFIGS} == set(NAMES)


def _tol(*dtypes):
  low = any(jnp.dtype(d).itemsize < 4 for d in dtypes if d is not None)
  return dict(atol=3e-2, rtol=3e-2) if low else dict(atol=2e-5, rtol=2e-5)


def _apply(module, variables, x, is_bn):
  if is_bn:
    return module.apply(variables, x, mutable=["batch_stats"])
  return module.apply(variables, x), {}


@pytest.mark.parametrize("name,kwargs,shape,dtype", CONFIGS, ids=IDS)
def test_same_variables_outputs_stats_and_grads(name, kwargs, shape, dtype, rng):
  ours, theirs = getattr(jaxnorm, name)(**kwargs), getattr(nn, name)(**kwargs)
  x = jnp.asarray(rng.normal(0.7, 1.3, shape), dtype)
  key = jax.random.key(3)
  v_ours, v_theirs = ours.init(key, x), theirs.init(key, x)
  # Same variable tree, shapes, dtypes and (same RNG use) values.
  assert jax.tree_util.tree_structure(v_ours) == jax.tree_util.tree_structure(v_theirs)
  for a, b in zip(_leaves(v_ours), _leaves(v_theirs), strict=True):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))

  is_bn = name == "BatchNorm"
  tol = _tol(dtype, kwargs.get("dtype"), kwargs.get("param_dtype"))
  (y_ours, s_ours), (y_theirs, s_theirs) = (
    _apply(ours, v_theirs, x, is_bn),
    _apply(theirs, v_theirs, x, is_bn),
  )
  assert y_ours.dtype == y_theirs.dtype and y_ours.shape == y_theirs.shape
  np.testing.assert_allclose(
    np.asarray(y_ours, np.float32), np.asarray(y_theirs, np.float32), **tol
  )
  stats_init = _leaves(v_theirs.get("batch_stats", {}))
  for a, b, a0 in zip(_leaves(s_ours), _leaves(s_theirs), stats_init, strict=True):
    # The running statistics keep their declared dtype (Flax's drift from bfloat16 to
    # float32 after an update with force_float32_reductions=False is not copied).
    assert a.dtype == a0.dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)

  cot = jnp.asarray(rng.normal(size=shape), jnp.float32)

  def loss(module, params, x):
    y, _ = _apply(module, {**v_theirs, "params": params}, x, is_bn)
    return jnp.sum(y.astype(jnp.float32) * cot)

  # Compiled: Flax's backward op by op dominated this file's time.
  g_ours, g_theirs = (
    jax.jit(jax.grad(functools.partial(loss, m), argnums=(0, 1)))(v_theirs["params"], x)
    for m in (ours, theirs)
  )
  for a, b in zip(_leaves(g_ours), _leaves(g_theirs), strict=True):
    assert a.dtype == b.dtype
    scale = max(1.0, float(jnp.abs(b.astype(jnp.float32)).max()))
    np.testing.assert_allclose(
      np.asarray(a, np.float32) / scale, np.asarray(b, np.float32) / scale, **tol
    )


def test_batchnorm_eval_mode_matches_flax(rng):
  x = jnp.asarray(rng.normal(2.0, 3.0, (8, 4, 4, 6)), jnp.float32)
  kw = dict(momentum=0.8)
  ours, theirs = jaxnorm.BatchNorm(**kw), nn.BatchNorm(**kw)
  variables = theirs.init(jax.random.key(0), x, use_running_average=False)
  for _ in range(3):  # a few Flax training steps to get non-trivial running statistics
    _, upd = theirs.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
    variables = {**variables, **upd}
  y_ours = ours.apply(variables, x, use_running_average=True)
  y_theirs = theirs.apply(variables, x, use_running_average=True)
  np.testing.assert_allclose(np.asarray(y_ours), np.asarray(y_theirs), atol=2e-5, rtol=2e-5)


class _Net(nn.Module):
  """A small CNN whose norm classes are injected, to swap Flax's for jaxnorm's."""

  lib: object

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(8, (3, 3))(x)
    x = self.lib.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.relu(x)
    x = nn.Conv(16, (3, 3))(x)
    x = self.lib.GroupNorm(num_groups=4)(x)
    x = nn.relu(x)
    x = nn.relu(self.lib.InstanceNorm()(x))  # (the spatial mean of IN's output alone is β)
    x = x.mean((1, 2))
    x = self.lib.LayerNorm()(x)
    x = self.lib.RMSNorm()(nn.Dense(16)(x))
    return nn.Dense(3)(x)


def test_model_swap_and_checkpoint_roundtrip(rng):
  x = jnp.asarray(rng.normal(size=(6, 8, 8, 3)), jnp.float32)
  flax_net, our_net = _Net(nn), _Net(jaxnorm)
  key = jax.random.key(0)
  v_flax = flax_net.init(key, x, train=False)
  v_ours = our_net.init(key, x, train=False)
  jax.tree_util.tree_map(np.testing.assert_array_equal, v_ours, v_flax)

  # A checkpoint written from the Flax model loads into the jaxnorm model unchanged.
  restored = serialization.from_bytes(v_ours, serialization.to_bytes(v_flax))
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored, v_flax)

  @functools.partial(jax.jit, static_argnums=0)
  def step(net, variables):
    def loss(params):
      out, upd = net.apply({**variables, "params": params}, x, train=True, mutable=["batch_stats"])
      return jnp.mean(out**2), upd

    (value, upd), grads = jax.value_and_grad(loss, has_aux=True)(variables["params"])
    return value, upd, grads

  # Full float32 matmuls: on GPUs the default (TF32) rounds the convolutions' inputs to 10
  # bits, which turns the two libraries' last-bit differences into 1e-2 ones downstream.
  with jax.default_matmul_precision("float32"):
    l_f, u_f, g_f = step(flax_net, restored)
    l_o, u_o, g_o = step(our_net, restored)
  np.testing.assert_allclose(l_o, l_f, rtol=1e-5)
  jax.tree_util.tree_map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), u_o, u_f
  )
  # Gradients relative to the largest one (the conv bias before BatchNorm has a true
  # gradient of 0, so both libraries return rounding noise there).
  top = max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(g_f))
  jax.tree_util.tree_map(
    lambda a, b: np.testing.assert_allclose(a / top, b / top, atol=1e-4), g_o, g_f
  )
  with jax.default_matmul_precision("float32"):
    y_f = flax_net.apply({**restored, **u_f}, x, train=False)
    y_o = our_net.apply({**restored, **u_o}, x, train=False)
  np.testing.assert_allclose(y_o, y_f, atol=1e-5, rtol=1e-4)
