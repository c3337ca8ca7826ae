"""Weight normalization and spectral normalization: the pure functions against the float64
reference, the Linen wrappers against Flax's (drop-in), the NNX wrappers against the Linen
ones in training (google/flax#5576: Flax's NNX wrappers overwrite the raw weights) and
WeightNorm's trainable scales (#5577). Flax's own tests of these classes run with jaxnorm
patched in through ``tools/flax_tests.py`` (CI)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

RNG = np.random.default_rng(7)


def _weights(shape, dtype=np.float32, scale=3.0):
  return (RNG.normal(size=shape) * scale).astype(dtype)


# ---- the pure functions ---------------------------------------------------------------


@pytest.mark.parametrize(
  "shape, feature_axes",
  [((6, 4), -1), ((6, 4), 0), ((3, 3, 2, 5), -1), ((3, 3, 2, 5), (2, 3)), ((6, 4), None)],
)
def test_weight_norm_matches_reference(shape, feature_axes):
  w = _weights(shape)
  axes = () if feature_axes is None else tuple(np.atleast_1d(feature_axes))
  g = _weights(tuple(shape[a] for a in axes), scale=1.0)
  y = jaxnorm.weight_norm(w, g, feature_axes=feature_axes)
  want = ref.weight_norm(w, g, axes)
  np.testing.assert_allclose(np.asarray(y), want, rtol=2e-6, atol=1e-7)
  assert y.dtype == jnp.float32


def test_weight_norm_sums_half_precision_in_float32():
  """A float16 kernel of 600 entries of 16 has Σv² = 153,600, past float16's 65,504: summed
  in float16 (Flax) the norm is inf and the kernel zero; the right entry is 1/sqrt(600)."""
  w = np.full((600, 3), 16.0, np.float16)
  y = jaxnorm.weight_norm(w, np.ones(3, np.float16))
  assert y.dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(y, np.float64), ref.weight_norm(w, np.ones(3)), rtol=1e-3)


def test_weight_norm_gradients_match_the_formula():
  """d/dv and d/dg of <G, g·v/‖v‖> (the reparameterization is trained in v and g):
  dg = Σ G·v̂, dv = g/‖v‖ (G − v̂ Σ G·v̂), per output feature."""
  v, g, gy = _weights((5, 3)), _weights((3,), scale=1.0), _weights((5, 3), scale=1.0)
  dv, dg = jax.grad(lambda v, g: jnp.sum(jaxnorm.weight_norm(v, g) * gy), (0, 1))(v, g)
  v64 = v.astype(np.float64)
  norm = np.sqrt((v64**2).sum(0))
  vhat = v64 / norm
  proj = (gy * vhat).sum(0)
  np.testing.assert_allclose(np.asarray(dg), proj, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(dv), g / norm * (gy - vhat * proj), rtol=1e-5, atol=1e-7)


def test_spectral_norm_one_step_matches_reference():
  w, u = _weights((7, 4)), _weights((1, 4), scale=1.0)
  w_bar, u_new, sigma = jaxnorm.spectral_norm(w, u)
  want_w, want_u, want_sigma, _ = ref.spectral_norm(w, u, n_steps=1)
  np.testing.assert_allclose(float(sigma), want_sigma, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(u_new), want_u, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(w_bar), want_w, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_spectral_norm_converges_to_the_largest_singular_value(dtype):
  """Many steps give σ = the largest singular value of the weight as given (bfloat16 values
  included: the iteration runs in float32 at full matmul precision, so σ is exact to float32,
  where a bfloat16 iteration would be off by ~1e-2)."""
  w = np.asarray(_weights((3, 3, 2, 5)).astype(dtype))
  w_bar, _, sigma = jaxnorm.spectral_norm(w, np.ones((1, 5), np.float32), n_steps=200)
  top = np.linalg.svd(np.asarray(w, np.float64).reshape(-1, 5), compute_uv=False)[0]
  np.testing.assert_allclose(float(sigma), top, rtol=1e-5)
  assert w_bar.dtype == jnp.float32  # Flax's rule: the promotion of the weight and u
  np.testing.assert_allclose(
    np.linalg.svd(np.asarray(w_bar, np.float64).reshape(-1, 5), compute_uv=False)[0], 1.0, rtol=1e-5
  )


def test_spectral_norm_gradient_holds_u_and_v_constant():
  """d<G, W/σ>/dW = G/σ − <G, W>/σ² · v uᵀ with u, v held constant (the paper's gradient). One
  step from a poor u: differentiating through the iteration would differ by far more."""
  w, u, gy = _weights((6, 4)), _weights((1, 4), scale=1.0), _weights((6, 4), scale=1.0)
  dw = jax.grad(lambda w: jnp.sum(jaxnorm.spectral_norm(w, u)[0] * gy))(w)
  _, u1, sigma, v1 = ref.spectral_norm(w, u, n_steps=1)
  want = gy / sigma - (gy * w).sum() / sigma**2 * (v1.T @ u1)
  np.testing.assert_allclose(np.asarray(dw), want, rtol=1e-5, atol=1e-6)


def test_pure_functions_jit_and_vmap_over_an_ensemble():
  w, u = _weights((3, 6, 4)), _weights((3, 1, 4), scale=1.0)
  w_bar, _, sigma = jax.jit(jax.vmap(lambda w, u: jaxnorm.spectral_norm(w, u, n_steps=2)))(w, u)
  for i in range(3):
    np.testing.assert_allclose(float(sigma[i]), ref.spectral_norm(w[i], u[i], 2)[2], rtol=1e-6)
  y = jax.jit(jax.vmap(jaxnorm.weight_norm))(w, np.ones((3, 4), np.float32))
  np.testing.assert_allclose(np.asarray(y[1]), ref.weight_norm(w[1]), rtol=2e-6)


@pytest.mark.parametrize(
  "call, match",
  [
    (lambda: jaxnorm.spectral_norm(np.ones(4), np.ones((1, 4))), "needs a matrix"),
    (lambda: jaxnorm.spectral_norm(np.ones((3, 4)), np.ones((4,))), r"u must have shape \(1, 4\)"),
    (lambda: jaxnorm.spectral_norm(np.ones((3, 4)), np.ones((1, 4)), n_steps=0), "at least 1"),
    (lambda: jaxnorm.weight_norm(np.ones((3, 4)), np.ones(3)), r"scale must have .* \(4,\)"),
  ],
)
def test_errors_say_what_was_expected(call, match):
  with pytest.raises(ValueError, match=match):
    call()


# ---- Linen: drop-in for Flax's ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["spectral", "weight"])
@pytest.mark.parametrize(
  "layer, shape", [(lambda: nn.Dense(5), (3, 6)), (lambda: nn.Conv(4, (3, 3)), (2, 6, 6, 3))]
)
def test_linen_same_variables_and_outputs_as_flax(kind, layer, shape):
  x = jnp.asarray(_weights(shape, scale=1.0))
  if kind == "spectral":
    ours, theirs = jaxnorm.SpectralNorm(layer(), n_steps=2), nn.SpectralNorm(layer(), n_steps=2)
  else:
    ours = jaxnorm.WeightNorm(layer(), variable_filter=None)
    theirs = nn.WeightNorm(layer(), variable_filter=None)
  kw = {"update_stats": True} if kind == "spectral" else {}
  v_ours = ours.init(jax.random.key(0), x, **{k: False for k in kw})
  v_theirs = theirs.init(jax.random.key(0), x, **{k: False for k in kw})
  assert jax.tree.map(jnp.shape, v_ours) == jax.tree.map(jnp.shape, v_theirs)
  for a, b in zip(jax.tree.leaves(v_ours), jax.tree.leaves(v_theirs), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  out_ours = ours.apply(v_theirs, x, mutable=True, **kw)
  out_theirs = theirs.apply(v_theirs, x, mutable=True, **kw)
  for a, b in zip(jax.tree.leaves(out_ours), jax.tree.leaves(out_theirs), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_linen_spectral_norm_output_matches_reference_and_updates_only_in_training():
  x = jnp.asarray(_weights((3, 6), scale=1.0))
  layer = jaxnorm.SpectralNorm(nn.Dense(4))
  variables = layer.init(jax.random.key(1), x, update_stats=False)
  params, stats = variables["params"]["layer_instance"], variables["batch_stats"]
  w_bar, u, sigma, _ = ref.spectral_norm(params["kernel"], stats["layer_instance/kernel/u"])
  y, upd = layer.apply(variables, x, update_stats=True, mutable=["batch_stats"])
  np.testing.assert_allclose(
    np.asarray(y), np.asarray(x) @ w_bar + np.asarray(params["bias"]), rtol=1e-5, atol=1e-6
  )  # (atol: outputs are O(1); one near 0 once missed rtol alone by float32 rounding)
  np.testing.assert_allclose(upd["batch_stats"]["layer_instance/kernel/sigma"], sigma, rtol=1e-6)
  _, upd = layer.apply(variables, x, update_stats=False, mutable=["batch_stats"])
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), upd["batch_stats"], stats))


class _DenseBN(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.BatchNorm(use_running_average=False, momentum=0.5)(nn.Dense(3)(x))


def test_linen_wrappers_leave_the_wrapped_running_statistics_alone():
  """Flax maps every collection, so WeightNorm(variable_filter=None) weight-normalizes a
  wrapped BatchNorm's running mean and var (and adds scales for them): only params here."""
  x = jnp.asarray(_weights((8, 5), scale=1.0)) + 4.0
  layer = jaxnorm.WeightNorm(_DenseBN(), variable_filter=None)
  variables = layer.init(jax.random.key(0), x)
  assert sorted(k for k in variables["params"] if "/" in k) == [
    "layer_instance/BatchNorm_0/bias/scale",
    "layer_instance/BatchNorm_0/scale/scale",
    "layer_instance/Dense_0/bias/scale",
    "layer_instance/Dense_0/kernel/scale",
  ]
  _, upd = layer.apply(variables, x, mutable=["batch_stats"])
  p = variables["params"]["layer_instance"]
  h = np.asarray(x, np.float64) @ ref.weight_norm(p["Dense_0"]["kernel"]) + ref.weight_norm(
    p["Dense_0"]["bias"], np.ones(3)
  )
  mean = upd["batch_stats"]["layer_instance"]["BatchNorm_0"]["mean"]
  np.testing.assert_allclose(np.asarray(mean), 0.5 * h.mean(0), rtol=1e-5)


def test_linen_spectral_norm_returns_no_normalized_params_as_updates():
  """Flax's SpectralNorm maps (and returns) the params as mutable: apply(..., mutable=True)
  hands back the normalized kernel, which a training loop merging updates would keep."""
  layer = jaxnorm.SpectralNorm(nn.Dense(3))
  x = jnp.ones((2, 5))
  variables = layer.init(jax.random.key(0), x, update_stats=False)
  _, upd = layer.apply(variables, x, update_stats=True, mutable=True)
  same = jax.tree.map(lambda a, b: bool((a == b).all()), upd["params"], variables["params"])
  assert jax.tree.all(same)


# ---- NNX: the raw weights are kept, and training follows the Linen wrappers -------------


def test_nnx_wrappers_keep_the_raw_weights():
  """google/flax#5576: Flax's NNX wrappers write the normalized weight into the layer."""
  x = jnp.asarray(_weights((3, 6), scale=1.0))
  for wrapper in (jnnx.SpectralNorm, jnnx.WeightNorm):
    linear = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
    kernel = np.asarray(linear.kernel[...])
    layer = wrapper(linear, rngs=nnx.Rngs(1))
    layer(x)
    layer(x)
    np.testing.assert_array_equal(np.asarray(linear.kernel[...]), kernel)


def _linen_twin(kind):
  return (
    jaxnorm.SpectralNorm(nn.Dense(4))
    if kind == "spectral"
    else jaxnorm.WeightNorm(nn.Dense(4), scale_init=nn.initializers.constant(2.0))
  )


def _nnx_twin(kind, linen_vars):
  linear = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
  p = linen_vars["params"]["layer_instance"]
  linear.kernel[...], linear.bias[...] = p["kernel"], p["bias"]
  if kind == "spectral":
    layer = jnnx.SpectralNorm(linear, rngs=nnx.Rngs(1))
    layer.batch_stats[("kernel", "u")][...] = linen_vars["batch_stats"]["layer_instance/kernel/u"]
  else:
    layer = jnnx.WeightNorm(linear, scale_init=nnx.initializers.constant(2.0), rngs=nnx.Rngs(1))
  return layer


@pytest.mark.parametrize("kind", ["spectral", "weight"])
def test_nnx_training_follows_the_linen_wrapper(kind):
  """Five SGD steps in each front end from the same weights give the same raw weights,
  scales and u: the reparameterization is trained, not the normalized weight."""
  x, t = jnp.asarray(_weights((8, 6), scale=1.0)), jnp.asarray(_weights((8, 4), scale=1.0))
  twin = _linen_twin(kind)
  kw = {"update_stats": True} if kind == "spectral" else {}
  variables = twin.init(jax.random.key(3), x, **{k: False for k in kw})
  layer = _nnx_twin(kind, variables)

  @jax.jit
  def linen_step(variables):
    def loss(params):
      y, upd = twin.apply({**variables, "params": params}, x, mutable=["batch_stats"], **kw)
      return jnp.mean((y - t) ** 2), upd

    grads, upd = jax.grad(loss, has_aux=True)(variables["params"])
    params = jax.tree.map(lambda p, g: p - 0.5 * g, variables["params"], grads)
    return {**variables, **upd, "params": params}

  @nnx.jit
  def nnx_step(layer):
    grads = nnx.grad(lambda m: jnp.mean((m(x) - t) ** 2))(layer)
    params = nnx.state(layer, nnx.Param)
    nnx.update(layer, jax.tree.map(lambda p, g: p - 0.5 * g, params, grads))

  for _ in range(5):
    variables = linen_step(variables)
    nnx_step(layer)
  p = variables["params"]
  inner = layer.layer_instance
  np.testing.assert_allclose(inner.kernel[...], p["layer_instance"]["kernel"], rtol=2e-5, atol=1e-6)
  if kind == "spectral":
    np.testing.assert_allclose(
      layer.batch_stats[("kernel", "u")][...],
      variables["batch_stats"]["layer_instance/kernel/u"],
      rtol=2e-5,
      atol=1e-6,
    )
  else:
    scale = layer.scales[("kernel",)][...]
    np.testing.assert_allclose(scale, p["layer_instance/kernel/scale"], rtol=2e-5)
    assert np.abs(scale - 2.0).max() > 1e-3  # the scales trained (google/flax#5577)


def test_nnx_weight_norm_scales_are_params_and_flax_state_loads():
  flax_layer = nnx.WeightNorm(nnx.Linear(6, 4, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
  ours = jnnx.WeightNorm(nnx.Linear(6, 4, rngs=nnx.Rngs(5)), rngs=nnx.Rngs(6))
  assert isinstance(ours.scales[("kernel",)], nnx.Param)
  flax_layer.scales[("kernel",)] = flax_layer.scales[("kernel",)] * 3.0
  nnx.update(ours, nnx.state(flax_layer))  # a checkpoint of Flax's class restores into ours
  np.testing.assert_array_equal(ours.scales[("kernel",)][...], np.full(4, 3.0, np.float32))
  np.testing.assert_array_equal(
    ours.layer_instance.kernel[...], flax_layer.layer_instance.kernel[...]
  )


def test_nnx_spectral_norm_eval_freezes_u():
  layer = jnnx.SpectralNorm(nnx.Linear(6, 4, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
  x = jnp.asarray(_weights((3, 6), scale=1.0))
  u0 = np.asarray(layer.batch_stats[("kernel", "u")][...])
  layer.eval()
  layer(x)
  np.testing.assert_array_equal(layer.batch_stats[("kernel", "u")][...], u0)
  layer.train()
  layer(x)
  assert np.abs(layer.batch_stats[("kernel", "u")][...] - u0).max() > 1e-3
