"""BatchNorm folding: the folded model (the same model without the norms, with a bias on
each folded layer) gives the unfolded model's inference outputs, for Dense, Conv (NHWC),
grouped and depthwise Conv, with and without a bias, BatchNorm and FrozenBatchNorm."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm

LAYERS = {
  "dense": (lambda bias: nn.Dense(6, use_bias=bias), (5, 4)),
  "conv": (lambda bias: nn.Conv(6, (3, 3), use_bias=bias), (2, 7, 7, 4)),
  "grouped": (lambda bias: nn.Conv(6, (3, 3), feature_group_count=2, use_bias=bias), (2, 7, 7, 4)),
  "depthwise": (
    lambda bias: nn.Conv(4, (3, 3), feature_group_count=4, use_bias=bias),
    (2, 7, 7, 4),
  ),
}


class Block(nn.Module):
  layer: str
  bias: bool
  norm: str | None  # "batch", "frozen" or None (the folded model)

  @nn.compact
  def __call__(self, x):
    make, _ = LAYERS[self.layer]
    x = make(self.bias or self.norm is None)(x)
    if self.norm == "batch":
      x = jaxnorm.BatchNorm(use_running_average=True, epsilon=1e-3)(x)
    elif self.norm == "frozen":
      x = jaxnorm.FrozenBatchNorm(epsilon=1e-3)(x)
    return nn.relu(x)


@pytest.mark.parametrize("norm", ["batch", "frozen"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_folded_model_equals_the_unfolded_one(layer, bias, norm, rng):
  x = rng.normal(size=LAYERS[layer][1]).astype(np.float32)
  model = Block(layer, bias, norm)
  variables = model.init(jax.random.key(0), x)
  features = variables["batch_stats"]["BatchNorm_0"]["mean"].shape
  variables["batch_stats"]["BatchNorm_0"] = {  # random, non-trivial statistics
    "mean": jnp.asarray(rng.normal(0, 2, features), jnp.float32),
    "var": jnp.asarray(rng.uniform(0.1, 5, features), jnp.float32),
  }
  variables["params"]["BatchNorm_0"] = {
    "scale": jnp.asarray(rng.normal(1, 0.5, features), jnp.float32),
    "bias": jnp.asarray(rng.normal(0, 1, features), jnp.float32),
  }
  name = "Dense_0" if layer == "dense" else "Conv_0"
  folded = jaxnorm.fold_batch_norms(variables, {name: "BatchNorm_0"}, epsilon=1e-3)
  assert "batch_stats" not in folded and set(folded["params"]) == {name}
  plain = Block(layer, bias, None)
  assert jax.tree_util.tree_structure(plain.init(jax.random.key(0), x)) == (
    jax.tree_util.tree_structure(folded)
  )
  want = np.asarray(model.apply(variables, x))
  got = np.asarray(plain.apply(folded, x))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fold_errors():
  with pytest.raises(ValueError, match="output features"):
    jaxnorm.fold_batch_norm(
      {"kernel": jnp.ones((2, 3))}, {"batch_stats": {"mean": jnp.zeros(4), "var": jnp.ones(4)}}
    )
  with pytest.raises(ValueError, match="no BatchNorm statistics"):
    jaxnorm.fold_batch_norms(
      {"params": {"Dense_0": {"kernel": jnp.ones((2, 3))}}}, {"Dense_0": "bn"}
    )
