"""jaxnorm.equinox's weight wrappers against ``eqx.nn``'s (drop-in: fields, state, outputs,
gradients) and its modern norms against the float64 reference."""

import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")  # the [equinox] extra; the test extra installs it

import jaxnorm.equinox as jeqx  # noqa: E402
from tests import reference as ref  # noqa: E402

KEY = jax.random.key(0)
R = np.random.default_rng(5)


def _same_checkpoint(ours, theirs):
  """Equinox's checkpoint of ``theirs`` loads into ``ours`` leaf for leaf (and back)."""
  buffer = io.BytesIO()
  eqx.tree_serialise_leaves(buffer, theirs)
  buffer.seek(0)
  loaded = eqx.tree_deserialise_leaves(buffer, ours)
  arrays = [[a for a in jax.tree_util.tree_leaves(t) if isinstance(a, jax.Array)]
            for t in (loaded, theirs)]  # fmt: skip
  assert len(arrays[0]) == len(arrays[1]) > 1
  for a, b in zip(*arrays, strict=True):
    np.testing.assert_array_equal(a, b)


def _layers():
  return {
    "linear": (eqx.nn.Linear(6, 4, key=KEY), R.normal(size=(6,)).astype(np.float32)),
    "conv": (eqx.nn.Conv2d(3, 5, 3, key=KEY), R.normal(size=(3, 7, 7)).astype(np.float32)),
  }


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_weight_norm_is_equinox_s(kind):
  layer, x = _layers()[kind]
  ours, theirs = jeqx.WeightNorm(layer), eqx.nn.WeightNorm(layer)
  _same_checkpoint(ours, theirs)
  np.testing.assert_allclose(ours.g, theirs.g)
  # A moved magnitude, so g matters: outputs and gradients as Equinox's.
  ours, theirs = (eqx.tree_at(lambda m: m.g, m, m.g * 1.7) for m in (ours, theirs))
  np.testing.assert_allclose(ours(x), theirs(x), rtol=2e-5, atol=2e-5)
  loss = lambda m: jnp.sum(m(x) ** 2)  # noqa: E731
  g_ours, g_theirs = eqx.filter_grad(loss)(ours), eqx.filter_grad(loss)(theirs)
  np.testing.assert_allclose(g_ours.g, g_theirs.g, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_ours.layer.weight, g_theirs.layer.weight, rtol=1e-4, atol=1e-5)


def test_weight_norm_of_a_zero_row_has_no_nan():
  layer, x = _layers()["linear"]
  layer = eqx.tree_at(lambda lin: lin.weight, layer, layer.weight.at[1].set(0.0))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert np.isnan(eqx.nn.WeightNorm(layer)(x)[1])  # Equinox: 0/0
  ours = jeqx.WeightNorm(layer)
  y = ours(x)
  assert np.isfinite(y).all() and y[1] == layer.bias[1]
  grads = eqx.filter_grad(lambda m: jnp.sum(m(x)))(ours)
  assert np.isfinite(grads.layer.weight).all()


def _spectral(cls, layer):
  return eqx.nn.make_with_state(cls)(layer, "weight", num_power_iterations=2, key=KEY)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_spectral_norm_is_equinox_s(kind):
  layer, x = _layers()[kind]
  (ours, s_ours), (theirs, s_theirs) = (
    _spectral(jeqx.SpectralNorm, layer),
    _spectral(eqx.nn.SpectralNorm, layer),
  )
  _same_checkpoint(ours, theirs)
  for _ in range(3):  # training: the power iteration advances, state as Equinox's
    y_ours, s_ours = ours(x, s_ours)
    y_theirs, s_theirs = theirs(x, s_theirs)
    np.testing.assert_allclose(y_ours, y_theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(s_ours.get(ours.uv_index), s_theirs.get(theirs.uv_index), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  y_ours, s_after = ours(x, s_ours, inference=True)  # inference: the state is kept
  y_theirs, _ = theirs(x, s_theirs, inference=True)
  np.testing.assert_allclose(y_ours, y_theirs, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(s_after.get(ours.uv_index)[0], s_ours.get(ours.uv_index)[0])
  # σ is the largest singular value: the normalized weight has spectral norm 1.
  weight = layer.weight
  u, v = s_ours.get(ours.uv_index)
  m = np.asarray(weight, np.float64).reshape(weight.shape[0], -1)
  sigma = float(u @ m @ v)
  np.testing.assert_allclose(sigma, np.linalg.svd(m, compute_uv=False)[0], rtol=1e-4)
  grads = eqx.filter_grad(lambda m_, s: jnp.sum(m_(x, s)[0] ** 2))(ours, s_ours)
  grads_eqx = eqx.filter_grad(lambda m_, s: jnp.sum(m_(x, s)[0] ** 2))(theirs, s_theirs)
  np.testing.assert_allclose(grads.layer.weight, grads_eqx.layer.weight, rtol=1e-3, atol=1e-4)


def test_dyt_and_lrn():
  x = R.normal(2.0, 2.0, (6, 5, 4)).astype(np.float32)  # channels-first example
  dyt = jeqx.DyT(4, alpha_init_value=0.3)
  dyt = eqx.tree_at(lambda m: (m.weight, m.bias), dyt, (jnp.arange(4.0) + 1, jnp.full(4, 0.5)))
  np.testing.assert_allclose(
    dyt(x), ref.dyt(x, 0.3, np.arange(4.0) + 1, np.full(4, 0.5)), atol=1e-6
  )
  with pytest.raises(ValueError, match=r"trailing axes are \(3,\), got \(6, 5, 4\)"):
    jeqx.DyT(3)(x)
  lrn = jeqx.LocalResponseNorm(3, alpha=0.1)
  want = ref.local_response_norm(x[None], 3, 0.1, 0.75, 1.0, channel_axis=1)[0]
  np.testing.assert_allclose(lrn(x), want, rtol=1e-6)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_adaptive(rms):
  cls = jeqx.AdaRMSNorm if rms else jeqx.AdaLayerNorm
  ada = cls(6, 5, key=KEY)
  assert not np.any(ada.linear.weight) and not np.any(ada.linear.bias)  # AdaLN-Zero
  w = jnp.asarray(R.normal(0, 0.5, (18, 5)), jnp.float32)
  b = jnp.asarray(R.normal(0, 0.5, 18), jnp.float32)
  ada = eqx.tree_at(lambda m: (m.linear.weight, m.linear.bias), ada, (w, b))
  x = R.normal(1.0, 2.0, (3, 4, 6)).astype(np.float32)  # (batch, tokens, features)
  c = R.normal(size=(3, 5)).astype(np.float32)
  y, gate = jax.vmap(ada)(x, c)
  c64 = np.asarray(c, np.float64)
  h = c64 / (1 + np.exp(-c64)) @ np.asarray(w, np.float64).T + np.asarray(b)
  shift, scale, want_gate = np.split(h, 3, axis=-1)
  xhat = ref.rms_norm(x, eps=1e-6) if rms else ref.layer_norm(x, eps=1e-6)
  want = ref.modulate(xhat, shift[:, None], scale[:, None])
  np.testing.assert_allclose(y, want, atol=2e-5 * np.abs(want).max())
  np.testing.assert_allclose(gate, want_gate, rtol=1e-5, atol=1e-5)


def test_conditional_batch_norm():
  cbn, state = eqx.nn.make_with_state(jeqx.ConditionalBatchNorm)(3, 4, "batch", momentum=0.5)
  weight = jnp.asarray(R.normal(1, 0.5, (4, 3)), jnp.float32)
  bias = jnp.asarray(R.normal(0, 0.5, (4, 3)), jnp.float32)
  cbn = eqx.tree_at(lambda m: (m.weight, m.bias), cbn, (weight, bias))
  x = R.normal(2.0, 3.0, (6, 3, 5)).astype(np.float32)  # (batch, channels, length)
  labels = np.array([0, 3, 3, 1, 2, 0])
  run = jax.vmap(cbn, axis_name="batch", in_axes=(0, 0, None), out_axes=(0, None))
  y, state = run(x, labels, state)
  xhat, _, _ = ref.batch_norm(x, axis=1)
  want = xhat * np.asarray(weight)[labels][:, :, None] + np.asarray(bias)[labels][:, :, None]
  np.testing.assert_allclose(y, want, atol=2e-5 * np.abs(want).max())
  y_inf, _ = jax.vmap(
    lambda a, lab, s: cbn(a, lab, s, inference=True), axis_name="batch",
    in_axes=(0, 0, None), out_axes=(0, None),
  )(x, labels, state)  # fmt: skip
  # One "batch"-mode step: the debiased running averages are that batch's statistics.
  np.testing.assert_allclose(y_inf, y, atol=2e-5 * np.abs(want).max())
  assert np.abs(np.asarray(state.get(cbn.norm.batch_state_index)[0])).max() > 0.1


def test_dyt_with_one_alpha_per_feature_in_every_front_end():
  """``alpha_per_feature``: α of the features' shape (Linen, NNX, Equinox), as DyT ports
  that learn one per channel write it."""
  from flax import nnx

  import jaxnorm
  from jaxnorm import nnx as jnnx

  x = np.random.default_rng(5).normal(0, 2, (3, 4)).astype(np.float32)
  alpha = np.array([0.1, 0.5, 1.0, 2.0], np.float32)
  variables = jaxnorm.DyT(alpha_per_feature=True).init(jax.random.key(0), x)
  assert variables["params"]["alpha"].shape == (4,)
  variables["params"]["alpha"] = alpha
  want = ref.dyt(x, alpha)
  np.testing.assert_allclose(jaxnorm.DyT(alpha_per_feature=True).apply(variables, x), want,
                             atol=1e-6)  # fmt: skip
  module = jnnx.DyT(4, alpha_per_feature=True, rngs=nnx.Rngs(0))
  module.alpha[...] = alpha
  np.testing.assert_allclose(module(x), want, atol=1e-6)
  eqx_dyt = jeqx.DyT(4, alpha_per_feature=True)
  assert eqx_dyt.alpha.shape == (4,)
  eqx_dyt = eqx.tree_at(lambda m: m.alpha, eqx_dyt, jnp.asarray(alpha))
  np.testing.assert_allclose(jax.vmap(eqx_dyt)(x), want, atol=1e-6)
