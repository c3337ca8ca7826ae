"""jaxnorm.nnx in NNX programs: a flax.nnx model with its norms swapped (same outputs,
BatchStats, gradients and state: nnx.state/nnx.update, nnx.split/nnx.merge,
nnx.to_pure_dict, Orbax checkpoints), the transforms (nnx.jit, nnx.scan over stacked layers,
nnx.vmap with an axis name, nnx.remat, jax.shard_map over 8 devices), the Linen bridges,
and what jaxnorm adds beyond flax.nnx."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref


class Net(nnx.Module):
  """A small CNN whose norm classes are injected, to swap flax.nnx's for jaxnorm's."""

  def __init__(self, lib, *, rngs):
    self.conv1 = nnx.Conv(3, 8, (3, 3), rngs=rngs)
    self.bn = lib.BatchNorm(8, momentum=0.9, rngs=rngs)
    self.conv2 = nnx.Conv(8, 16, (3, 3), rngs=rngs)
    self.gn = lib.GroupNorm(16, 4, rngs=rngs)
    self.inorm = lib.InstanceNorm(16, rngs=rngs)
    self.ln = lib.LayerNorm(16, rngs=rngs)
    self.dense = nnx.Linear(16, 16, rngs=rngs)
    self.rms = lib.RMSNorm(16, rngs=rngs)
    self.out = nnx.Linear(16, 3, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.bn(self.conv1(x)))
    x = nnx.relu(self.gn(self.conv2(x)))
    x = nnx.relu(self.inorm(x)).mean((1, 2))
    return self.out(self.rms(self.dense(self.ln(x))))


def _pure(model):
  return jax.tree_util.tree_map(np.asarray, nnx.to_pure_dict(nnx.state(model)))


def _assert_trees_close(a, b, **tol):
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, **tol), a, b)


def test_model_swap_same_training_step_and_state(rng, tmp_path):
  x = jnp.asarray(rng.normal(size=(6, 8, 8, 3)), jnp.float32)
  ours, theirs = Net(jnnx, rngs=nnx.Rngs(0)), Net(nnx, rngs=nnx.Rngs(0))
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(ours), _pure(theirs))

  # A flax.nnx model's state loads into the jaxnorm model (nnx.update, and an Orbax
  # checkpoint of nnx.state restored onto the jaxnorm model's abstract state).
  nnx.update(theirs, nnx.state(Net(nnx, rngs=nnx.Rngs(7))))
  nnx.update(ours, nnx.state(theirs))
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(ours), _pure(theirs))
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "theirs", nnx.state(theirs))
  fresh = Net(jnnx, rngs=nnx.Rngs(1))
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Net(jnnx, rngs=nnx.Rngs(1))))
  with ocp.StandardCheckpointer() as ckpt:
    restored = ckpt.restore(tmp_path / "theirs", abstract)
  nnx.update(fresh, restored)
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(fresh), _pure(theirs))
  del graphdef

  @nnx.jit
  def step(model, x):
    def loss(model):
      return jnp.mean(model(x) ** 2)

    return nnx.value_and_grad(loss)(model)

  (l_ours, g_ours), (l_theirs, g_theirs) = step(ours, x), step(theirs, x)
  np.testing.assert_allclose(l_ours, l_theirs, rtol=1e-5)
  top = max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(g_theirs))
  _assert_trees_close(nnx.to_pure_dict(g_ours), nnx.to_pure_dict(g_theirs), atol=1e-4 * top, rtol=0)
  _assert_trees_close(
    _pure(ours)["bn"], _pure(theirs)["bn"], atol=1e-5, rtol=1e-4
  )  # updated BatchStats
  ours.eval()
  theirs.eval()
  np.testing.assert_allclose(ours(x), theirs(x), atol=1e-5, rtol=1e-4)


def test_split_merge_and_pure_dict_round_trips(rng):
  bn = jnnx.BatchNorm(4, rngs=nnx.Rngs(0))
  bn(jnp.asarray(rng.normal(1.0, 2.0, (8, 4)), jnp.float32))
  graphdef, state = nnx.split(bn)
  merged = nnx.merge(graphdef, state)
  assert type(merged) is jnnx.BatchNorm
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(merged), _pure(bn))
  pure = nnx.to_pure_dict(nnx.state(bn))
  assert set(pure) == {"mean", "var", "scale", "bias"}
  other = jnnx.BatchNorm(4, rngs=nnx.Rngs(1))
  state = nnx.state(other)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(other, state)
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(other), _pure(bn))


def _stacked(lib, n):
  @nnx.split_rngs(splits=n)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def create(rngs):
    return lib.LayerNorm(8, scale_init=nnx.initializers.normal(0.5), rngs=rngs)

  return create(nnx.Rngs(0))


def test_scan_over_stacked_layers(rng):
  x = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)

  def run(lib):
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def forward(layer, x):
      return jnp.tanh(layer(x))

    return forward(_stacked(lib, 3), x)

  np.testing.assert_allclose(run(jnnx), run(nnx), atol=1e-6)


def test_vmap_with_axis_name_gives_the_concatenated_statistics(rng):
  xs = jnp.asarray(rng.normal(1.0, 2.0, (4, 5, 8)), jnp.float32)  # 4 members of 5 rows
  ln = jnnx.LayerNorm(8, reduction_axes=(0, 1), feature_axes=-1, axis_name="i", rngs=nnx.Rngs(0))
  y = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0), axis_name="i")(ln, xs)
  expected = ref.layer_norm(np.asarray(xs).reshape(20, 8), reduction_axes=(0, 1))
  np.testing.assert_allclose(np.asarray(y).reshape(20, 8), expected, atol=2e-5)


def test_remat_keeps_outputs_and_grads(rng):
  x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
  bn = jnnx.BatchNorm(8, use_running_average=True, rngs=nnx.Rngs(0))

  def loss(model, x, remat):
    call = nnx.remat(lambda m, x: m(x)) if remat else (lambda m, x: m(x))
    return jnp.sum(jnp.sin(call(model, x)))

  g_plain = nnx.grad(loss, argnums=(0, 1))(bn, x, False)
  g_remat = nnx.grad(loss, argnums=(0, 1))(bn, x, True)
  _assert_trees_close(g_remat, g_plain, atol=1e-6)


def test_shard_map_batch_norm_equals_one_device(rng):
  n = len(jax.devices())
  mesh = jax.make_mesh((n,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  x = jnp.asarray(rng.normal(2.0, 3.0, (4 * n, 5)), jnp.float32)
  model = jnnx.BatchNorm(5, momentum=0.5, axis_name="d", rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)

  def step(state, x):
    m = nnx.merge(graphdef, state)
    y = m(x)
    return y, nnx.state(m)

  mapped = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("d")), out_specs=(P("d"), P())))
  with jax.set_mesh(mesh):
    y, new_state = mapped(state, jax.device_put(x, NamedSharding(mesh, P("d"))))
  expected_y, mean, var = ref.batch_norm(np.asarray(x))
  np.testing.assert_allclose(np.asarray(y), expected_y, atol=2e-5)
  stats = nnx.to_pure_dict(new_state)
  np.testing.assert_allclose(stats["mean"], 0.5 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.5 + 0.5 * var, rtol=1e-5)


def test_bridges_both_ways(rng):
  x = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
  # A jaxnorm Linen module inside NNX.
  wrapped = nnx.bridge.ToNNX(jaxnorm.BatchNorm(use_running_average=False), rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(wrapped, x)
  y = wrapped(x, mutable=["batch_stats"])  # as for flax.linen.BatchNorm
  np.testing.assert_allclose(np.asarray(y), ref.batch_norm(np.asarray(x))[0], atol=2e-5)
  np.testing.assert_allclose(wrapped.mean[...], 0.01 * np.asarray(x).mean(0), rtol=1e-5, atol=1e-7)
  # A jaxnorm NNX module inside Linen.
  linen = nnx.bridge.ToLinen(jnnx.LayerNorm, args=(4,))
  variables = linen.init(jax.random.key(0), x)
  np.testing.assert_allclose(
    np.asarray(linen.apply(variables, x)), ref.layer_norm(np.asarray(x)), atol=2e-5
  )


def test_what_jaxnorm_adds_in_nnx(rng):
  x = rng.normal(1e4, 1.0, (8, 6, 6, 16)).astype(np.float32)
  bn = jnnx.BatchNorm(16, rngs=nnx.Rngs(0))
  assert np.abs(np.asarray(bn(x)) - ref.batch_norm(x)[0]).max() < 1e-2  # accurate variance
  # A fully masked batch gives no NaN and keeps the running statistics.
  before = _pure(bn)
  y = bn(x, mask=np.zeros((8, 1, 1, 1), bool))
  assert np.all(np.isfinite(y))
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(bn), before)
  # An empty batch and a NaN batch keep them too.
  bn(np.zeros((0, 6, 6, 16), np.float32))
  bn(np.full((2, 6, 6, 16), np.nan, np.float32))
  jax.tree_util.tree_map(np.testing.assert_array_equal, _pure(bn), before)
  # Channels-first GroupNorm / InstanceNorm, BatchNorm statistics per time step.
  xc = rng.normal(size=(3, 8, 5, 4)).astype(np.float32)
  gn = jnnx.GroupNorm(8, 4, feature_axis=1, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(gn(xc), ref.group_norm(xc, 4, channel_axis=1), atol=2e-5)
  inorm = jnnx.InstanceNorm(8, feature_axes=1, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(inorm(xc), ref.instance_norm(xc, channel_axis=1), atol=2e-5)
  seq = rng.normal(size=(6, 5, 4)).astype(np.float32)
  per_step = jnnx.BatchNorm(4, reduction_axes=0, stats_shape=(5, 4), momentum=0.0,
                            rngs=nnx.Rngs(0))  # fmt: skip
  np.testing.assert_allclose(per_step(seq), ref.batch_norm(seq, axis=(1, 2))[0], atol=2e-5)
  assert per_step.mean[...].shape == (5, 4)
  np.testing.assert_allclose(per_step.mean[...], seq.mean(0), rtol=1e-5, atol=1e-6)
  # RMSNorm: bias, epsilon outside the root, zero-centred scale.
  xr = rng.normal(size=(3, 16)).astype(np.float32)
  rms = jnnx.RMSNorm(16, use_bias=True, epsilon_in_root=False, zero_centered_scale=True,
                     epsilon=1e-3, rngs=nnx.Rngs(0))  # fmt: skip
  np.testing.assert_array_equal(rms.scale[...], 0.0)
  rms.scale[...], rms.bias[...] = jnp.full(16, 0.5), jnp.full(16, 0.25)
  expected = ref.rms_norm(xr, np.full(16, 0.5), np.full(16, 0.25), eps=1e-3, eps_in_root=False,
                          zero_centered=True)  # fmt: skip
  np.testing.assert_allclose(rms(xr), expected, atol=2e-5)


def test_clear_errors_in_nnx():
  with pytest.raises(ValueError, match=r"num_groups=3 does not divide the 8 channels"):
    jnnx.GroupNorm(8, 3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"exactly one of num_groups and group_size"):
    jnnx.GroupNorm(8, 4, 2, rngs=nnx.Rngs(0))
  bn = jnnx.BatchNorm(4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"running statistics of shape \(4,\).*num_features"):
    bn(jnp.ones((3, 5)))
  with pytest.raises(ValueError, match=r"scale has shape \(4,\).*features of shape \(5,\)"):
    jnnx.LayerNorm(4, rngs=nnx.Rngs(0))(jnp.ones((3, 5)))
  with pytest.warns(jaxnorm.SingleValueWarning, match=r"one value per statistic"):
    bn(jnp.ones((1, 4)))
  with pytest.raises(ValueError, match=r"statistics of shape \(5, 4\); construct.*stats_shape"):
    jnnx.BatchNorm(4, reduction_axes=0, rngs=nnx.Rngs(0))(jnp.ones((6, 5, 4)))
  with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\]"):
    jnnx.BatchNorm(4, momentum=1.5, rngs=nnx.Rngs(0))(jnp.ones((3, 4)))
  with pytest.raises(ValueError, match=r"epsilon must be >= 0"):
    jnnx.LayerNorm(4, epsilon=-1.0, rngs=nnx.Rngs(0))(jnp.ones((3, 4)))
