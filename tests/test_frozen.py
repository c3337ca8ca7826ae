"""Frozen BatchNorm: equal to BatchNorm at inference, loads its variables, never updated,
and the optimizer labels that keep every BatchNorm parameter still (Linen and NNX)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

FIXED = dict(warmup_steps=0, r_max_steps=None, d_max_steps=None)  # limits from step 0


def _data(rng, shape=(16, 5), loc=2.0, scale=3.0):
  return rng.normal(loc, scale, shape).astype(np.float32)


class _Net(nn.Module):
  norm: type = jaxnorm.BatchNorm

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Dense(4)(x)
    x = self.norm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(1)(nn.relu(x))


def test_frozen_equals_inference_batch_norm_and_loads_its_variables(rng):
  x = _data(rng, (16, 3))
  net = _Net()
  variables = net.init(jax.random.key(0), x, train=True)
  for _ in range(3):  # train statistics away from their initial values
    _, upd = net.apply(variables, x * 2 + 1, train=True, mutable=["batch_stats"])
    variables = {**variables, **upd}
  frozen = _Net(norm=jaxnorm.FrozenBatchNorm)
  want = net.apply(variables, x, train=False)
  got = frozen.apply(variables, x, train=True)  # trains nothing, whatever the mode
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  assert jax.tree_util.tree_structure(frozen.init(jax.random.key(0), x, train=True)) == (
    jax.tree_util.tree_structure(variables)
  )
  # Against the reference, on the norm alone.
  bs, ps = variables["batch_stats"]["BatchNorm_0"], variables["params"]["BatchNorm_0"]
  h = rng.normal(size=(5, 4)).astype(np.float32)
  y = jaxnorm.frozen_batch_norm(h, ps["scale"], ps["bias"], bs["mean"], bs["var"])
  expected = ref.batch_norm_eval(h, bs["mean"], bs["var"], ps["scale"], ps["bias"])
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["frozen", "plain_eval"])
def test_frozen_parameters_get_zero_updates_from_an_optax_step(norm, rng):
  x, t = _data(rng, (16, 3)), rng.normal(size=(16, 1)).astype(np.float32)
  net = _Net(norm=jaxnorm.FrozenBatchNorm if norm == "frozen" else jaxnorm.BatchNorm)
  variables = net.init(jax.random.key(0), x, train=False)
  labels = jaxnorm.freeze_batch_norm(variables)
  assert labels["BatchNorm_0"] == {"scale": "frozen", "bias": "frozen"}
  tx = optax.multi_transform(
    {"trainable": optax.adamw(1e-2, weight_decay=0.1), "frozen": optax.set_to_zero()}, labels
  )
  params = variables["params"]
  opt_state = tx.init(params)

  def loss(p):
    return jnp.mean((net.apply({**variables, "params": p}, x, train=False) - t) ** 2)

  grads = jax.grad(loss)(params)
  if norm == "frozen":  # no gradient reaches a frozen norm's parameters at all
    for leaf in jax.tree_util.tree_leaves(grads["BatchNorm_0"]):
      np.testing.assert_array_equal(leaf, 0.0)
  updates, _ = tx.update(grads, opt_state, params)
  for leaf in jax.tree_util.tree_leaves(updates["BatchNorm_0"]):
    np.testing.assert_array_equal(leaf, 0.0)
  assert np.abs(updates["Dense_0"]["kernel"]).max() > 0  # the rest trains


def test_nnx_frozen_loads_batch_norm_state_and_never_updates(rng):
  x = _data(rng, (16, 3))
  bn = jnnx.BatchNorm(3, momentum=0.5, rngs=nnx.Rngs(0))
  bn(x)
  frozen = jnnx.FrozenBatchNorm(3, rngs=nnx.Rngs(1))
  nnx.update(frozen, nnx.state(bn))
  bn.eval()
  np.testing.assert_allclose(np.asarray(frozen(x)), np.asarray(bn(x)), rtol=1e-5, atol=1e-5)
  before = np.asarray(frozen.mean[...])
  grads = nnx.grad(lambda m: jnp.sum(m(x * 3)))(frozen)
  np.testing.assert_array_equal(np.asarray(frozen.mean[...]), before)
  np.testing.assert_array_equal(grads["scale"][...], 0.0)


def test_nnx_freeze_batch_norm_labels_with_an_nnx_optimizer(rng):
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(3, 4, rngs=rngs)
      self.bn = jnnx.BatchNorm(4, use_running_average=True, rngs=rngs)
      self.out = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x):
      return self.out(nnx.relu(self.bn(self.lin(x))))

  model = Net(nnx.Rngs(0))
  labels = jnnx.freeze_batch_norm(model)
  assert labels["bn"]["scale"] == "frozen" and labels["lin"]["kernel"] == "trainable"
  tx = optax.multi_transform(
    {"trainable": optax.adamw(1e-1, weight_decay=0.5), "frozen": optax.set_to_zero()}, labels
  )
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  before = {k: np.asarray(getattr(model.bn, k)[...]) for k in ("scale", "bias")}
  kernel = np.asarray(model.lin.kernel[...])
  x = _data(rng, (8, 3))
  optimizer.update(model, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model))
  for k, v in before.items():  # plain BatchNorm in inference mode: frozen by the labels alone
    np.testing.assert_array_equal(np.asarray(getattr(model.bn, k)[...]), v)
  assert np.abs(np.asarray(model.lin.kernel[...]) - kernel).max() > 0
