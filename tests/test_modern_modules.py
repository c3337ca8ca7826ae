"""The modern norms' Linen and NNX modules: variables as documented, outputs equal to the
float64 reference with non-trivial parameters, the two front ends equal to each other,
AdaLN-Zero's zero start, conditional BatchNorm's running statistics and modes, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

R = np.random.default_rng(3)
X = R.normal(1.5, 2.0, (4, 5, 6)).astype(np.float32)  # (B, T, D)
COND = R.normal(0, 1, (4, 7)).astype(np.float32)
LABELS = np.array([0, 2, 2, 1])


def _silu(v):
  return v / (1 + np.exp(-v))


def _ada_reference(x, cond, kernel, bias, rms, gate=True):
  """AdaLN(-Zero) from the formulas: SiLU(c)·W + b split in (shift, scale, gate)."""
  h = _silu(np.asarray(cond, np.float64)) @ np.asarray(kernel, np.float64) + np.asarray(bias)
  parts = np.split(h, 3 if gate else 2, axis=-1)
  xhat = ref.rms_norm(x) if rms else ref.layer_norm(x)
  y = ref.modulate(xhat, parts[0][:, None, :], parts[1][:, None, :])
  return (y, parts[2]) if gate else y


def _random_params(variables, seed=0):
  """Every parameter replaced by a random one (a zero kernel would hide a wrong formula)."""
  leaves, tree = jax.tree_util.tree_flatten(variables["params"])
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  new = [
    jax.random.normal(k, leaf.shape, leaf.dtype) * 0.5 + 0.3
    for k, leaf in zip(keys, leaves, strict=True)
  ]
  return {**variables, "params": jax.tree_util.tree_unflatten(tree, new)}


@pytest.mark.parametrize("rms", [False, True], ids=["ada_layer", "ada_rms"])
def test_adaptive_linen_and_nnx_match_reference(rms):
  linen_cls, nnx_cls = (
    (jaxnorm.AdaRMSNorm, jnnx.AdaRMSNorm) if rms else (jaxnorm.AdaLayerNorm, jnnx.AdaLayerNorm)
  )
  variables = _random_params(linen_cls().init(jax.random.key(0), X, COND))
  p = variables["params"]
  assert p["kernel"].shape == (7, 18) and p["bias"].shape == (18,)
  y, gate = jax.jit(linen_cls().apply)(variables, X, COND)
  want_y, want_gate = _ada_reference(X, COND, p["kernel"], p["bias"], rms)
  np.testing.assert_allclose(y, want_y, atol=2e-5 * np.abs(want_y).max())
  np.testing.assert_allclose(gate, want_gate, rtol=1e-5, atol=1e-5)
  module = nnx_cls(6, 7, rngs=nnx.Rngs(0))
  module.kernel[...], module.bias[...] = p["kernel"], p["bias"]
  y2, gate2 = module(X, COND)
  np.testing.assert_allclose(y2, y, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(gate2, gate, rtol=1e-6, atol=1e-6)


def test_adaln_zero_starts_as_the_plain_norm_with_the_branch_gated_off():
  ada = jaxnorm.AdaLayerNorm()
  variables = ada.init(jax.random.key(0), X, COND)
  assert not any(np.any(v) for v in jax.tree_util.tree_leaves(variables))  # zero-initialised
  y, gate = ada.apply(variables, X, COND)
  np.testing.assert_allclose(y, ref.layer_norm(X), atol=1e-5)
  h = jaxnorm.gated_residual(X, jnp.tanh(y) * 100, gate)
  np.testing.assert_array_equal(h, X)  # the block is the identity at the start
  # ... and trains: the kernel's gradient is non-zero through the gate.
  loss = lambda v: jnp.sum(jaxnorm.gated_residual(X, y, ada.apply(v, X, COND)[1]) ** 2)  # noqa: E731
  assert np.abs(jax.grad(loss)(variables)["params"]["kernel"]).max() > 0.1


def test_adaptive_without_gate_returns_y_only():
  ada = jaxnorm.AdaLayerNorm(use_gate=False, activation=None)
  variables = _random_params(ada.init(jax.random.key(0), X, COND))
  y = ada.apply(variables, X, COND)
  p = variables["params"]
  h = np.asarray(COND, np.float64) @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"])
  shift, scale = np.split(h, 2, axis=-1)
  want = ref.modulate(ref.layer_norm(X), shift[:, None], scale[:, None])
  np.testing.assert_allclose(y, want, atol=2e-5 * np.abs(want).max())


def test_adaptive_errors_name_the_shapes():
  module = jnnx.AdaLayerNorm(6, 7, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"kernel must have shape \(condition features, 3·8\)"):
    module(np.ones((4, 5, 8), np.float32), COND)
  with pytest.raises(ValueError, match="batch of 2 but the input 4"):
    module(X, COND[:2])


def test_dyt_linen_and_nnx_match_reference():
  layer = jaxnorm.DyT(alpha_init_value=0.8)
  variables = layer.init(jax.random.key(0), X)
  assert float(variables["params"]["alpha"]) == pytest.approx(0.8)
  variables = _random_params(variables)
  p = variables["params"]
  y = layer.apply(variables, X)
  np.testing.assert_allclose(y, ref.dyt(X, p["alpha"], p["scale"], p["bias"]), atol=1e-6)
  module = jnnx.DyT(6, rngs=nnx.Rngs(0))
  module.alpha[...], module.scale[...], module.bias[...] = p["alpha"], p["scale"], p["bias"]
  np.testing.assert_allclose(module(X), y, rtol=1e-6)
  assert jnnx.DyT(6, use_bias=False, rngs=nnx.Rngs(0)).bias is None


def test_local_response_norm_modules():
  want = ref.local_response_norm(X, 3, 1e-2, 0.75, 1.0)
  y = jaxnorm.LocalResponseNorm(3, alpha=1e-2).apply({}, X)
  np.testing.assert_allclose(y, want, rtol=1e-6)
  np.testing.assert_allclose(jnnx.LocalResponseNorm(3, alpha=1e-2)(X), want, rtol=1e-6)


def _cbn_reference(x, labels, scale, bias):
  return ref.conditional_batch_norm(x.reshape(-1, 6), np.repeat(labels, 5), scale, bias)


def test_conditional_batch_norm_linen():
  x = X.reshape(-1, 6)[:8]
  labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
  cbn = jaxnorm.ConditionalBatchNorm(num_classes=3, momentum=0.8)
  variables = cbn.init(jax.random.key(0), x, labels, use_running_average=False)
  np.testing.assert_array_equal(variables["batch_stats"]["mean"], 0)  # init: no update
  variables = _random_params(variables)
  p = variables["params"]
  y, updates = cbn.apply(variables, x, labels, use_running_average=False, mutable=["batch_stats"])
  want, mean, var = ref.conditional_batch_norm(x, labels, p["scale"], p["bias"])
  np.testing.assert_allclose(y, want, atol=2e-5 * np.abs(want).max())
  np.testing.assert_allclose(updates["batch_stats"]["mean"], 0.2 * mean, rtol=1e-5)
  np.testing.assert_allclose(updates["batch_stats"]["var"], 0.8 + 0.2 * var, rtol=1e-5)
  # Inference: the running statistics, each sample's class.
  stats = {"mean": np.full(6, 1.0, np.float32), "var": np.full(6, 4.0, np.float32)}
  y = cbn.apply({**variables, "batch_stats": stats}, x, labels, use_running_average=True)
  xhat = (x - 1.0) / np.sqrt(4.0 + 1e-5)
  want = xhat * np.asarray(p["scale"])[labels] + np.asarray(p["bias"])[labels]
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_conditional_batch_norm_nnx_modes_and_state():
  x = X.reshape(-1, 6)[:8]
  labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
  cbn = jnnx.ConditionalBatchNorm(6, 3, momentum=0.8, rngs=nnx.Rngs(0))
  assert cbn.scale.shape == (3, 6) and cbn.mean.shape == (6,)
  cbn(x, labels)  # training by default, as flax.nnx.BatchNorm
  _, mean, var = ref.batch_norm(x)
  np.testing.assert_allclose(cbn.mean[...], 0.2 * mean, rtol=1e-5)
  before = np.asarray(cbn.mean[...])
  cbn.eval()
  cbn(x, labels)
  np.testing.assert_array_equal(cbn.mean[...], before)  # inference leaves them alone
  assert nnx.view(cbn, use_running_average=False).use_running_average is False
  with pytest.raises(ValueError, match="construct it with the size of that axis"):
    cbn(X.reshape(-1, 3), np.zeros(40, int))
  unset = jnnx.ConditionalBatchNorm(6, 3, use_running_average=None, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="BatchNorm needs use_running_average"):
    unset(x, labels)  # (it trained silently before: None counted as False)


def test_modules_train_under_jit():
  """A gradient step through every module in one jitted NNX model."""

  class Block(nnx.Module):
    def __init__(self, rngs):
      self.dyt = jnnx.DyT(6, rngs=rngs)
      self.ada = jnnx.AdaRMSNorm(6, 7, kernel_init=nnx.initializers.normal(0.1), rngs=rngs)
      self.cbn = jnnx.ConditionalBatchNorm(6, 3, rngs=rngs)

    def __call__(self, x, c, labels):
      y, gate = self.ada(self.dyt(x), c)
      h = jaxnorm.gated_residual(x, y, gate)
      return self.cbn(h.reshape(-1, 6), jnp.repeat(labels, 5))

  model = Block(nnx.Rngs(0))

  @nnx.jit
  def loss_grad(model):
    return nnx.grad(lambda m: jnp.sum(m(X, COND, LABELS) ** 2))(model)

  grads = loss_grad(model)
  for name in ("dyt", "ada", "cbn"):
    leaves = jax.tree_util.tree_leaves(nnx.state(grads, nnx.Param)[name])
    assert all(np.isfinite(g).all() for g in leaves) and any(np.abs(g).max() > 0 for g in leaves)


def test_conditional_batch_norm_keeps_pytorch_s_running_variance():
  """``unbiased_running_var`` as BatchNorm's: the running variance was the biased one,
  2.2e-3 off PyTorch's convention at n = 160 (here n = 10: 11% of the batch variance)."""
  x = np.random.default_rng(3).normal(1.0, 2.0, (10, 6)).astype(np.float32)
  labels = jnp.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
  expected = 0.8 * 1.0 + 0.2 * x.astype(np.float64).var(0, ddof=1)
  linen = jaxnorm.ConditionalBatchNorm(3, momentum=0.8, unbiased_running_var=True,
                                       use_running_average=False)  # fmt: skip
  variables = linen.init(jax.random.key(0), x, labels)
  _, updated = linen.apply(variables, x, labels, mutable=["batch_stats"])
  np.testing.assert_allclose(updated["batch_stats"]["var"], expected, rtol=1e-5)
  module = jnnx.ConditionalBatchNorm(6, 3, momentum=0.8, unbiased_running_var=True,
                                     rngs=nnx.Rngs(0))  # fmt: skip
  module(jnp.asarray(x), labels)
  np.testing.assert_allclose(module.var[...], expected, rtol=1e-5)
  assert not np.allclose(expected, 0.8 + 0.2 * x.astype(np.float64).var(0), rtol=1e-2)
