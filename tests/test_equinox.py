"""jaxnorm.equinox: the registry's Equinox norms against the float64 reference and against
``eqx.nn`` (drop-in: outputs, gradients, state, serialisation, the filtered transforms)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")  # the [equinox] extra; the test extra installs it

import jaxnorm.equinox as jeqx  # noqa: E402
from tests import reference as ref  # noqa: E402
from tests.cases import EQUINOX, LAYOUTS  # noqa: E402

SHAPE = LAYOUTS["nchw"][0]  # (batch, channels, H, W); W ≠ C so a wrong axis shows
EXAMPLE, C = SHAPE[1:], SHAPE[1]
EPS = 1e-5  # Equinox's default for every norm
ATOL = {jnp.float32: 2e-5, jnp.bfloat16: 6e-2}


def _vmapped(module, state=None, **kw):
  """The module over the batch, Equinox's convention (BatchNorm: ``axis_name="batch"``)."""
  if state is None:
    return jax.vmap(lambda x: module(x, **kw))
  return jax.vmap(
    lambda x, s: module(x, s, **kw), axis_name="batch", in_axes=(0, None), out_axes=(0, None)
  )


def _build(namespace, name, gamma, beta):
  """``namespace``'s class ``name`` for SHAPE with the given per-channel parameters (laid on
  the whole example for LayerNorm/RMSNorm, whose weights have the example's shape);
  returns ``(module, state or None)``."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # BatchNorm's mode="legacy" warning (not used here)
    if name == "BatchNorm":
      module, state = eqx.nn.make_with_state(getattr(namespace, name))(C, "batch", mode="batch")
    elif name == "GroupNorm":
      module, state = getattr(namespace, name)(2, C), None
    else:
      module, state = getattr(namespace, name)(EXAMPLE), None
  full = name in ("LayerNorm", "RMSNorm")
  lay = (lambda p: jnp.broadcast_to(p[:, None, None], EXAMPLE)) if full else (lambda p: p)
  module = eqx.tree_at(lambda m: (m.weight, m.bias), module, (lay(gamma), lay(beta)))
  return module, state


def _reference(name, x, gamma, beta, mask=None):
  example_axes = (1, 2, 3)
  full_g = np.broadcast_to(gamma[:, None, None], EXAMPLE)
  full_b = np.broadcast_to(beta[:, None, None], EXAMPLE)
  if name == "LayerNorm":
    return ref.layer_norm(x, full_g, full_b, example_axes, example_axes, eps=EPS, mask=mask)
  if name == "RMSNorm":
    return ref.rms_norm(x, full_g, full_b, axes=example_axes, eps=EPS, mask=mask)
  if name == "GroupNorm":
    return ref.group_norm(x, 2, gamma, beta, channel_axis=1, eps=EPS)
  return ref.batch_norm(x, gamma, beta, axis=1, eps=EPS, mask=mask)[0]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", EQUINOX, ids=[c.name for c in EQUINOX])
def test_matches_reference_and_equinox(case, dtype, rng):
  """Offset data (mean 100, std 2): in bfloat16 a mean rounded to the input's dtype (as
  Equinox's BatchNorm keeps it) is off by up to 0.25, an eighth of the std."""
  x = jnp.asarray(rng.normal(100.0, 2.0, SHAPE), dtype)
  gamma = rng.normal(1.0, 0.3, C).astype(np.float32)
  beta = rng.normal(0.0, 0.3, C).astype(np.float32)
  ours, state = _build(jeqx, case.module, gamma, beta)
  theirs, _ = _build(eqx.nn, case.module, gamma, beta)
  assert isinstance(ours, getattr(eqx.nn, case.module))
  y = _vmapped(ours, state)(x) if state is None else _vmapped(ours, state)(x, state)[0]
  y_eqx = _vmapped(theirs, state)(x) if state is None else _vmapped(theirs, state)(x, state)[0]
  assert y.dtype == y_eqx.dtype and y.shape == x.shape
  want = _reference(case.module, np.asarray(x.astype(jnp.float32)), gamma, beta)
  np.testing.assert_allclose(np.asarray(y, np.float64), want, atol=ATOL[dtype], rtol=0)
  if dtype == jnp.float32:
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_eqx), atol=2e-5)


@pytest.mark.parametrize("case", EQUINOX, ids=[c.name for c in EQUINOX])
def test_gradients_match_equinox(case, rng):
  """eqx.filter_grad through eqx.filter_jit: the parameters' and the input's gradients."""
  x = jnp.asarray(rng.normal(0.5, 2.0, SHAPE), jnp.float32)
  gamma = rng.normal(1.0, 0.3, C).astype(np.float32)
  beta = rng.normal(0.0, 0.3, C).astype(np.float32)
  weights = jnp.asarray(rng.normal(size=SHAPE), jnp.float32)
  grads = []
  for namespace in (jeqx, eqx.nn):
    module, state = _build(namespace, case.module, gamma, beta)

    @eqx.filter_jit
    @eqx.filter_grad
    def grad(args, state=state):
      module, x = args
      f = _vmapped(module, state)
      y = f(x) if state is None else f(x, state)[0]
      return jnp.sum(jnp.sin(y) * weights)

    grads.append(grad((module, x)))
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("case", EQUINOX, ids=[c.name for c in EQUINOX])
def test_serialised_leaves_load_both_ways(case, rng, tmp_path):
  gamma = rng.normal(1.0, 0.3, C).astype(np.float32)
  beta = rng.normal(0.0, 0.3, C).astype(np.float32)
  theirs, state = _build(eqx.nn, case.module, gamma, beta)
  ours, _ = _build(jeqx, case.module, np.ones(C, np.float32), np.zeros(C, np.float32))
  eqx.tree_serialise_leaves(tmp_path / "eqx.eqx", (theirs, state))
  loaded, loaded_state = eqx.tree_deserialise_leaves(tmp_path / "eqx.eqx", (ours, state))
  assert type(loaded) is type(ours)
  np.testing.assert_array_equal(np.asarray(loaded.weight), np.asarray(theirs.weight))
  eqx.tree_serialise_leaves(tmp_path / "ours.eqx", (loaded, loaded_state))
  back, _ = eqx.tree_deserialise_leaves(tmp_path / "ours.eqx", (theirs, state))
  np.testing.assert_array_equal(np.asarray(back.bias), np.asarray(theirs.bias))


def _bn(mode, **kw):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return eqx.nn.make_with_state(jeqx.BatchNorm)(C, "batch", mode=mode, momentum=0.5, **kw)


def test_batch_norm_batch_mode_running_statistics_and_inference(rng):
  """ "batch" mode: hidden ← m·hidden + (1 − m)·batch from (0, 1), the state Equinox builds
  (StateIndex fields, State); inference uses the debiased average of the batches alone,
  Σ(1 − m)·m^(t−i)·bᵢ/(1 − m^t) — Equinox divides hidden by 1 − m^t without taking out the
  start, a variance 1/7 too large after 3 steps at m = 0.5 (far beyond the tolerance)."""
  bn, state = _bn("batch")
  xs = [rng.normal(3.0 * t, 1.0 + t, SHAPE).astype(np.float32) for t in range(3)]
  hidden_mean, hidden_var = np.zeros(C), np.ones(C)
  for x in xs:
    _, state = _vmapped(bn, state)(jnp.asarray(x), state)
    hidden_mean = 0.5 * hidden_mean + 0.5 * x.mean((0, 2, 3))
    hidden_var = 0.5 * hidden_var + 0.5 * x.var((0, 2, 3))
  assert int(state.get(bn.batch_counter)) == 3
  mean, var = state.get(bn.batch_state_index)
  np.testing.assert_allclose(np.asarray(mean), hidden_mean, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(var), hidden_var, rtol=1e-5)
  x = jnp.asarray(xs[0])
  y, same = _vmapped(eqx.nn.inference_mode(bn), state)(x, state)
  assert same is state or jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), same, state))
  weights = np.array([0.5**2, 0.5, 1.0]) * 0.5 / (1 - 0.5**3)  # sum to 1
  m = sum(w * x.mean((0, 2, 3)) for w, x in zip(weights, xs, strict=True))
  v = sum(w * x.var((0, 2, 3)) for w, x in zip(weights, xs, strict=True))
  want = ref.batch_norm_eval(np.asarray(x), m, v, np.ones(C), np.zeros(C), axis=1, eps=EPS)
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
  equinox_var = hidden_var / (1 - 0.5**3)
  np.testing.assert_allclose(equinox_var - v, 0.5**3 / (1 - 0.5**3), rtol=1e-6)


def test_batch_norm_ema_mode_normalizes_with_the_updated_averages(rng):
  """ "ema" mode (Equinox's default): the first batch fills the averages; later ones blend
  (1 − m)·batch + m·running, and training normalizes with the blend."""
  bn, state = _bn("ema")
  x1, x2 = (rng.normal(2.0 * t, 1.0 + t, SHAPE).astype(np.float32) for t in (1, 2))
  _, state = _vmapped(bn, state)(jnp.asarray(x1), state)
  y, state = _vmapped(bn, state)(jnp.asarray(x2), state)
  mean = 0.5 * x1.mean((0, 2, 3)) + 0.5 * x2.mean((0, 2, 3))
  var = 0.5 * x1.var((0, 2, 3)) + 0.5 * x2.var((0, 2, 3))
  want = ref.batch_norm_eval(x2, mean, var, np.ones(C), np.zeros(C), axis=1, eps=EPS)
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


def test_batch_norm_masked_examples_count_by_their_valid_positions(rng):
  """Unequal valid counts per example: the statistics are those of every valid position of
  the batch (averaging per-example means, Equinox's rule, would weight them equally)."""
  bn, state = _bn("batch")
  x = rng.normal(0.0, 1.0, SHAPE).astype(np.float32) + np.arange(3.0)[:, None, None, None] * 4
  mask = np.ones(SHAPE, bool)
  mask[0, :, :, 1:] = False  # example 0 keeps 5 of 20 positions per channel
  y, _ = jax.vmap(
    lambda x, m, s: bn(x, s, mask=m), axis_name="batch", in_axes=(0, 0, None), out_axes=(0, None)
  )(jnp.asarray(x), jnp.asarray(mask), state)
  want = ref.batch_norm(x, np.ones(C), np.zeros(C), axis=1, eps=EPS, mask=mask)[0]
  np.testing.assert_allclose(np.asarray(y)[mask], want[mask], rtol=1e-5, atol=1e-5)


def test_layer_norm_mask(rng):
  x = rng.normal(1.0, 2.0, SHAPE).astype(np.float32)
  mask = rng.random(SHAPE) > 0.3
  ln = jeqx.LayerNorm(EXAMPLE)
  y = jax.vmap(lambda x, m: ln(x, mask=m))(jnp.asarray(x), jnp.asarray(mask))
  want = ref.layer_norm(x, None, None, (1, 2, 3), (1, 2, 3), eps=EPS, mask=mask)
  np.testing.assert_allclose(np.asarray(y), want, atol=2e-5)


def test_state_passes_through_and_errors_suggest_vmap():
  ln = jeqx.LayerNorm(EXAMPLE)
  _, state = _bn("batch")
  y, same = ln(jnp.ones(EXAMPLE), state)
  assert same is state
  with pytest.raises(ValueError, match=r"jax\.vmap\(layernorm\)"):
    ln(jnp.ones(SHAPE))
  with pytest.raises(ValueError, match=r"\(8, \.\.\.\)"):
    jeqx.GroupNorm(2, C)(jnp.ones((4, 5)))
  bn, state = _bn("batch")
  with pytest.raises(ValueError, match="axis_name='batch'"):
    bn(jnp.ones((3,)), state)


def test_filter_vmap_and_jit_over_a_model():
  """A small Equinox model with the norms inside, under eqx.filter_jit/filter_vmap."""
  key = jax.random.key(0)
  model = eqx.nn.Sequential([eqx.nn.Linear(6, 8, key=key), jeqx.LayerNorm(8), jeqx.RMSNorm(8)])
  x = jax.random.normal(key, (5, 6))
  y = eqx.filter_jit(eqx.filter_vmap(model))(x)
  h = np.asarray(jax.vmap(model.layers[0])(x), np.float64)
  want = ref.rms_norm(ref.layer_norm(h, eps=EPS), np.ones(8), np.zeros(8), eps=EPS)
  np.testing.assert_allclose(np.asarray(y), want, atol=2e-5)


# --- the BatchNorm family ---------------------------------------------------------------


def test_ghost_batches_over_the_mapped_axis(rng):
  """virtual_batch_size=2 over a batch of 4: each pair of consecutive examples normalized
  with its own statistics (the pairs' means differ by 8, far beyond the tolerance), masks
  counted, and the hidden averages follow the sub-batches' count-weighted statistics."""
  bn, state = _bn("batch", virtual_batch_size=2)
  x = rng.normal(0.0, 1.0, (4, *EXAMPLE)).astype(np.float32)
  x += np.array([0.0, 0.0, 8.0, 8.0])[:, None, None, None]
  mask = rng.random(x.shape) > 0.3
  y, state = jax.vmap(
    lambda x, m, s: bn(x, s, mask=m), axis_name="batch", in_axes=(0, 0, None), out_axes=(0, None)
  )(jnp.asarray(x), jnp.asarray(mask), state)
  want, mean, var = ref.ghost_batch_norm(
    np.moveaxis(x, 1, -1), 2, eps=EPS, mask=np.moveaxis(mask, 1, -1)
  )
  np.testing.assert_allclose(np.asarray(y)[mask], np.moveaxis(want, -1, 1)[mask], atol=2e-5)
  whole = ref.batch_norm(x, axis=1, eps=EPS, mask=mask)[0]
  assert np.abs(whole[mask] - np.moveaxis(want, -1, 1)[mask]).max() > 1.0
  hidden_mean, hidden_var = state.get(bn.batch_state_index)
  np.testing.assert_allclose(np.asarray(hidden_mean), 0.5 * mean, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(hidden_var), 0.5 + 0.5 * var, rtol=1e-5)


def test_ghost_batch_errors():
  with pytest.raises(ValueError, match="needs mode='batch'"):
    _bn("ema", virtual_batch_size=2)
  bn, state = _bn("batch", virtual_batch_size=3)
  with pytest.raises(ValueError, match="mapped axis 'batch' has 4 examples"):
    _vmapped(bn, state)(jnp.ones((4, *EXAMPLE)), state)


def test_batch_renorm_corrects_toward_the_running_statistics(rng):
  """Running statistics far from the batch's (mean 1 vs 4, variance 0.5 vs 9) so r and d
  clip at r_max = 1.5 and d_max = 0.5: the output is the reference's, not BatchNorm's;
  the state moves with momentum and counts the step; inference uses the running values."""
  brn, state = eqx.nn.make_with_state(jeqx.BatchRenorm)(
    C, "batch", momentum=0.5, r_max=1.5, d_max=0.5, warmup_steps=0,
    r_max_steps=None, d_max_steps=None,
  )  # fmt: skip
  gamma = rng.normal(1.0, 0.3, C).astype(np.float32)
  brn = eqx.tree_at(lambda m: m.weight, brn, jnp.asarray(gamma))
  running = (np.ones(C, np.float32), np.full(C, 0.5, np.float32))
  state = state.set(brn.state_index, (*map(jnp.asarray, running), jnp.array(0, jnp.int32)))
  x = rng.normal(4.0, 3.0, SHAPE).astype(np.float32)
  y, new = _vmapped(brn, state)(jnp.asarray(x), state)
  want, mean, var, r, d = ref.batch_renorm(x, *running, 1.5, 0.5, gamma, None, axis=1, eps=EPS)
  assert np.all(r == 1.5) and np.all(np.abs(d) == 0.5)  # both clipped
  np.testing.assert_allclose(np.asarray(y), want, atol=2e-5)
  assert np.abs(ref.batch_norm(x, gamma, axis=1, eps=EPS)[0] - want).max() > 0.3
  new_mean, new_var, steps = new.get(brn.state_index)
  np.testing.assert_allclose(np.asarray(new_mean), 0.5 * running[0] + 0.5 * mean, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(new_var), 0.5 * running[1] + 0.5 * var, rtol=1e-5)
  assert int(steps) == 1
  y_inf, same = _vmapped(eqx.nn.inference_mode(brn), new)(jnp.asarray(x), new)
  want_inf = ref.batch_norm_eval(x, new_mean, new_var, gamma, None, axis=1, eps=EPS)
  np.testing.assert_allclose(np.asarray(y_inf), want_inf, atol=2e-5)
  assert int(same.get(brn.state_index)[2]) == 1


def test_batch_renorm_schedule_and_errors():
  """Warm-up: plain BatchNorm (r = 1, d = 0) for the first steps, whatever the state."""
  brn, state = eqx.nn.make_with_state(jeqx.BatchRenorm)(C, "batch", warmup_steps=5)
  nine = jnp.full(C, 9.0, jnp.float32)
  state = state.set(brn.state_index, (nine, nine, jnp.array(0, jnp.int32)))
  x = np.random.default_rng(1).normal(0.0, 1.0, SHAPE).astype(np.float32)
  y, _ = _vmapped(brn, state)(jnp.asarray(x), state)
  np.testing.assert_allclose(np.asarray(y), ref.batch_norm(x, axis=1, eps=EPS)[0], atol=2e-5)
  with pytest.raises(ValueError, match="r_max must be >= 1"):
    jeqx.BatchRenorm(C, "batch", r_max=0.5)
  with pytest.raises(ValueError, match="momentum"):
    jeqx.BatchRenorm(C, "batch", momentum=1.5)


@pytest.mark.parametrize("mode", ["batch", "ema"])
def test_frozen_batch_norm_uses_the_running_statistics_and_trains_nothing(mode, rng):
  """A BatchNorm trained two steps, frozen: the output is the inference output (mode
  "batch": the debiased averages) in training mode too, no gradient reaches weight or bias,
  the state is unchanged; freeze_batch_norms swaps every BatchNorm of a model, Equinox's
  included, and a BatchNorm checkpoint loads into the frozen layer."""
  bn, state = _bn(mode)
  bn = eqx.tree_at(lambda m: m.weight, bn, jnp.asarray(rng.normal(1.0, 0.3, C), jnp.float32))
  for t in range(2):
    x = jnp.asarray(rng.normal(2.0 + t, 2.0, SHAPE), jnp.float32)
    _, state = _vmapped(bn, state)(x, state)
  frozen = jeqx.FrozenBatchNorm.from_batch_norm(bn)
  y, same = _vmapped(frozen, state)(x, state)
  y_inf, _ = _vmapped(eqx.nn.inference_mode(bn), state)(x, state)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_inf))
  assert np.abs(np.asarray(y) - np.asarray(_vmapped(bn, state)(x, state)[0])).max() > 0.05
  for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def loss(model):
    return jnp.sum(jnp.sin(_vmapped(model, state)(x, state)[0]))

  grads = eqx.filter_grad(loss)(frozen)
  assert not np.any(np.asarray(grads.weight)) and not np.any(np.asarray(grads.bias))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    theirs = eqx.nn.BatchNorm(C, "batch", mode=mode)
  model = jeqx.freeze_batch_norms({"ours": bn, "theirs": [theirs], "other": jeqx.LayerNorm(3)})
  assert type(model["ours"]) is type(model["theirs"][0]) is jeqx.FrozenBatchNorm
  assert type(model["other"]) is jeqx.LayerNorm
  with pytest.raises(TypeError, match="eqx.nn.BatchNorm"):
    jeqx.FrozenBatchNorm.from_batch_norm(jeqx.LayerNorm(3))
