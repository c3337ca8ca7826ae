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
      {"kernel": jnp.ones((2, 3))},
      {"batch_stats": {"mean": jnp.zeros(4), "var": jnp.ones(4)}},
      epsilon=1e-5,
    )
  with pytest.raises(ValueError, match="no BatchNorm statistics"):
    jaxnorm.fold_batch_norms(
      {"params": {"Dense_0": {"kernel": jnp.ones((2, 3))}}}, {"Dense_0": "bn"}, epsilon=1e-5
    )


class TwoBlocks(nn.Module):
  """Two Conv → BatchNorm pairs with different ε (1e-3 and 1e-1), as ported models have."""

  folded: bool = False

  @nn.compact
  def __call__(self, x):
    for i, eps in enumerate((1e-3, 1e-1)):
      x = nn.Conv(4, (3, 3), use_bias=self.folded, name=f"conv{i}")(x)
      if not self.folded:
        x = jaxnorm.BatchNorm(use_running_average=True, epsilon=eps, name=f"bn{i}")(x)
    return x


def test_each_pair_folds_with_its_own_epsilon(rng):
  x = rng.normal(size=(2, 9, 9, 4)).astype(np.float32)
  variables = TwoBlocks().init(jax.random.key(0), x)
  for i in range(2):  # variances about ε, so that every ε matters
    variables["batch_stats"][f"bn{i}"]["var"] = jnp.asarray(rng.uniform(1e-3, 1e-1, 4), jnp.float32)
  want = np.asarray(TwoBlocks().apply(variables, x))
  pairs = {"conv0": "bn0", "conv1": "bn1"}
  folded = jaxnorm.fold_batch_norms(variables, pairs, epsilon={"bn0": 1e-3, "bn1": 1e-1})
  got = np.asarray(TwoBlocks(folded=True).apply(folded, x))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  # One ε for both (what fold_batch_norms once took) is far off: the test can fail.
  one = jaxnorm.fold_batch_norms(variables, pairs, epsilon=1e-3)
  assert np.abs(TwoBlocks(folded=True).apply(one, x) - want).max() > 0.1 * np.abs(want).max()
  # Converted PyTorch layers carry their ε: they can be given as they are.
  layers = {
    f"bn{i}": jaxnorm.convert.from_torch("BatchNorm2d", {}, eps=eps, num_features=4)
    for i, eps in enumerate((1e-3, 1e-1))
  }
  by_layers = jaxnorm.fold_batch_norms(variables, pairs, epsilon=layers)
  np.testing.assert_array_equal(
    by_layers["params"]["conv1"]["bias"], folded["params"]["conv1"]["bias"]
  )
  # Or read from the model itself.
  assert jaxnorm.batch_norm_epsilons(TwoBlocks(), x) == {"bn0": 1e-3, "bn1": 1e-1}
  from_model = jaxnorm.fold_batch_norms(
    variables, pairs, epsilon=jaxnorm.batch_norm_epsilons(TwoBlocks(), x)
  )
  np.testing.assert_array_equal(
    from_model["params"]["conv1"]["bias"], folded["params"]["conv1"]["bias"]
  )
  with pytest.raises(ValueError, match="gives no value for the norm at 'bn1'"):
    jaxnorm.fold_batch_norms(variables, pairs, epsilon={"bn0": 1e-3})


def test_a_norm_without_running_statistics_is_not_folded():
  variables = {"params": {"Dense_0": {"kernel": jnp.ones((2, 3))},
                          "bn": {"scale": jnp.ones(3), "bias": jnp.zeros(3)}}}  # fmt: skip
  with pytest.raises(ValueError, match="no running statistics.*cannot be folded"):
    jaxnorm.fold_batch_norms(variables, {"Dense_0": "bn"}, epsilon=1e-5)


def test_float64_stays_float64():
  with jax.enable_x64(True):
    kernel = np.ones((2, 3))
    norm = {"batch_stats": {"mean": np.full(3, 1 / 3), "var": np.full(3, 1 / 7)}}
    folded = jaxnorm.fold_batch_norm({"kernel": kernel}, norm, epsilon=0.0)
    assert folded["kernel"].dtype == jnp.float64
    np.testing.assert_allclose(folded["bias"], -1 / 3 * np.sqrt(7), rtol=1e-15)
    layer = jaxnorm.convert.from_torch(
      "BatchNorm2d", {"weight": kernel[0], "bias": kernel[0], "running_mean": kernel[0],
                      "running_var": kernel[0]})  # fmt: skip
    assert layer.kwargs["param_dtype"] == jnp.float64
    assert layer.variables["batch_stats"]["var"].dtype == np.float64


def test_no_silent_default_epsilon():
  """Folding needs each norm's ε: a default 1e-5 folded a MobileNetV3 (ε = 1e-3) with its
  outputs off by 2-8. Without one, both functions refuse and say where ε comes from."""
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
  variables = TwoBlocks().init(jax.random.key(1), x)
  pairs = {"conv0": "bn0", "conv1": "bn1"}
  with pytest.raises(ValueError, match=r"needs each BatchNorm's epsilon.*batch_norm_epsilons"):
    jaxnorm.fold_batch_norms(variables, pairs)
  norm = {c: variables[c]["bn0"] for c in ("params", "batch_stats")}
  with pytest.raises(ValueError, match="needs the BatchNorm's epsilon"):
    jaxnorm.fold_batch_norm(variables["params"]["conv0"], norm)
