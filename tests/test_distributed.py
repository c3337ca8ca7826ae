"""Exact statistics across devices: every norm with ``axis_name`` inside ``jax.shard_map``
and ``jax.pmap``, ``flax.linen.vmap``, and plain ``jax.jit`` over sharded arrays, against the
same norm on one device over the concatenated data (and the float64 reference), masks with
unequal counts and empty devices included, gradients included."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from tests import reference as ref
from tests.cases import CASES

N_DEV = 8


@pytest.fixture(scope="module")
def mesh():
  assert len(jax.devices()) == N_DEV, "tests/conftest.py gives the process 8 CPU devices"
  return jax.make_mesh((N_DEV,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))


def sharded(mesh, fn, in_specs, out_specs):
  """``fn`` under shard_map over ``mesh``, jit-compiled, taking host arrays."""
  mapped = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))

  def call(*args):
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs, strict=True)]
    with jax.set_mesh(mesh):
      return jax.tree_util.tree_map(np.asarray, mapped(*args))

  return call


# (name, sharded function, same function on one device, input shape, sharded axis)
NORMS = [
  (
    "batch",
    lambda x: jaxnorm.batch_norm(x, axis_name="d")[0],
    lambda x: jaxnorm.batch_norm(x)[0],
    (32, 6),
    0,
  ),
  (
    "batch_nhwc",
    lambda x: jaxnorm.batch_norm(x, axis_name="d")[0],
    lambda x: jaxnorm.batch_norm(x)[0],
    (16, 3, 3, 4),
    0,
  ),
  (
    "layer_tensor_parallel",
    lambda x: jaxnorm.layer_norm(x, axis_name="d"),
    lambda x: jaxnorm.layer_norm(x),
    (5, 32),
    1,
  ),
  (
    "rms_tensor_parallel",
    lambda x: jaxnorm.rms_norm(x, axis_name="d"),
    lambda x: jaxnorm.rms_norm(x),
    (5, 32),
    1,
  ),
  (
    "instance_spatial",
    lambda x: jaxnorm.instance_norm(x, axis_name="d"),
    jaxnorm.instance_norm,
    (2, 16, 3, 4),
    1,
  ),
  (
    "group_spatial",
    lambda x: jaxnorm.group_norm(x, num_groups=2, axis_name="d"),
    functools.partial(jaxnorm.group_norm, num_groups=2),
    (2, 16, 3, 4),
    1,
  ),
  (
    "normalize",
    lambda x: jaxnorm.normalize(x, (0, 1), axis_name="d"),
    lambda x: jaxnorm.normalize(x, (0, 1)),
    (16, 3, 2),
    0,
  ),
]


def test_every_norm_of_the_registry_is_sharded():
  assert {case.name for case in CASES} <= {n[0].split("_")[0] for n in NORMS}


@pytest.mark.parametrize("name,fn,single,shape,axis", NORMS, ids=[n[0] for n in NORMS])
def test_shard_map_equals_one_device(mesh, name, fn, single, shape, axis, rng):
  x = (rng.normal(3.0, 2.0, shape)).astype(np.float32)
  spec = P(*([None] * axis + ["d"]))
  y = sharded(mesh, fn, (spec,), spec)(x)
  np.testing.assert_allclose(y, np.asarray(single(x)), atol=2e-5)
  cot = rng.normal(size=shape).astype(np.float32)

  def loss_sharded(x):
    return jnp.sum(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec)(x) * cot)

  with jax.set_mesh(mesh):
    g = np.asarray(jax.jit(jax.grad(loss_sharded))(jax.device_put(x, NamedSharding(mesh, spec))))
  g1 = jax.grad(lambda x: jnp.sum(single(x) * cot))(x)
  np.testing.assert_allclose(g, np.asarray(g1), atol=2e-5)


def test_masks_with_unequal_counts_and_an_empty_device(mesh, rng):
  x = rng.normal(1.0, 3.0, (N_DEV * 4, 5)).astype(np.float32)
  counts = [4, 1, 0, 3, 2, 4, 0, 1]  # valid rows per device; two devices have none
  mask = np.zeros((N_DEV * 4, 1), bool)
  for d, c in enumerate(counts):
    mask[d * 4 : d * 4 + c] = True

  def fn(x, m):
    y, stats = jaxnorm.batch_norm(x, mask=m, axis_name="d")
    return y, stats.mean, stats.var, stats.count

  y, mean, var, count = sharded(mesh, fn, (P("d"), P("d")), (P("d"), P(), P(), P()))(x, mask)
  expected_y, expected_mean, expected_var = ref.batch_norm(x, mask=mask)
  np.testing.assert_allclose(mean, expected_mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(var, expected_var, rtol=1e-5)
  np.testing.assert_array_equal(count, sum(counts))
  np.testing.assert_allclose(y, expected_y, atol=2e-5)
  # Flax averages each device's mean, which is wrong as soon as counts differ (and NaN for
  # an empty device); the count-weighted combination is what the reference computes.
  per_device = [x[d * 4 : d * 4 + c].mean(0) for d, c in enumerate(counts) if c]
  assert np.abs(np.mean(per_device, 0) - expected_mean).max() > 0.1

  cot = rng.normal(size=x.shape).astype(np.float32)

  def loss(x):
    mapped = jax.shard_map(
      fn, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=(P("d"), P(), P(), P())
    )
    return jnp.sum(mapped(x, jax.device_put(mask, NamedSharding(mesh, P("d"))))[0] * cot)

  with jax.set_mesh(mesh):
    g = np.asarray(jax.jit(jax.grad(loss))(jax.device_put(x, NamedSharding(mesh, P("d")))))
  g1 = jax.grad(lambda x: jnp.sum(jaxnorm.batch_norm(x, mask=mask)[0] * cot))(x)
  np.testing.assert_allclose(g, np.asarray(g1), atol=2e-5)


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "two_psums"])
@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_named_axis_statistics_far_off_centre(mesh, rng, gather, platform, monkeypatch, request):
  """Statistics combined by name at 1e4 ± 1, in one gathered psum and in two psums, in
  the CPU's and a TPU's form alike: each device's shifted sums hand over their mean
  unrounded (a + d), and the combination is exact (rounded means, as XLA:CPU's two passes
  handed over before RESULTS item 66, left 4.8e-4 of the variance: 240 times the bound)."""
  if not gather:
    monkeypatch.setattr(jaxnorm._engine.collectives, "_GATHER_MEMBERS", 2)
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: platform)
  jax.clear_caches()  # (the same shapes traced with the other branch or combine)
  request.addfinalizer(jax.clear_caches)
  x = rng.normal(1e4, 1.0, (N_DEV * 8, 6)).astype(np.float32)

  def fn(x):
    stats = jaxnorm.moments(x, 0, axis_name="d")
    return stats.mean, stats.var

  mean, var = sharded(mesh, fn, (P("d"),), (P(), P()))(x)
  _, expected_mean, expected_var = ref.batch_norm(x.astype(np.float64))
  np.testing.assert_allclose(var, expected_var, rtol=2e-6)
  np.testing.assert_allclose(mean, expected_mean, rtol=1e-7)


def test_all_devices_empty_keeps_running_statistics(mesh, rng):
  bn = jaxnorm.BatchNorm(use_running_average=False, axis_name="d", momentum=0.5)
  x = rng.normal(size=(N_DEV * 2, 3)).astype(np.float32)
  variables = bn.init(jax.random.key(0), x)
  stats = {"mean": jnp.full(3, 2.0), "var": jnp.full(3, 3.0)}

  def fn(x, m, s):
    y, upd = bn.apply({**variables, "batch_stats": s}, x, mask=m, mutable=["batch_stats"])
    return y, upd["batch_stats"]

  y, new = sharded(mesh, fn, (P("d"), P("d"), P()), (P("d"), P()))(
    x, np.zeros((N_DEV * 2, 1), bool), stats
  )
  assert np.all(np.isfinite(y))
  np.testing.assert_array_equal(new["mean"], 2.0)
  np.testing.assert_array_equal(new["var"], 3.0)


def test_module_running_statistics_updated_once_and_identically(mesh, rng):
  x = rng.normal(2.0, 1.5, (N_DEV * 3, 4, 5)).astype(np.float32)
  synced = jaxnorm.BatchNorm(use_running_average=False, axis_name="d", momentum=0.7)
  variables = synced.init(jax.random.key(0), x)

  def fn(x):
    return synced.apply(variables, x, mutable=["batch_stats"])

  # out_specs P() for the statistics: shard_map checks they are the same on every device.
  y, upd = sharded(mesh, fn, (P("d"),), (P("d"), P()))(x)
  single = jaxnorm.BatchNorm(use_running_average=False, momentum=0.7)
  y1, upd1 = single.apply(variables, x, mutable=["batch_stats"])
  np.testing.assert_allclose(y, y1, atol=2e-5)
  jax.tree_util.tree_map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), upd, upd1
  )
  _, mean, var = ref.batch_norm(x)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.3 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(upd["batch_stats"]["var"], 0.7 + 0.3 * var, rtol=1e-5)


def test_pmap_and_axis_index_groups(rng):
  x = rng.normal(0.5, 2.0, (N_DEV, 4, 3)).astype(np.float32)
  y = jax.pmap(lambda x: jaxnorm.batch_norm(x, axis_name="i")[0], axis_name="i")(x)
  np.testing.assert_allclose(
    np.asarray(y).reshape(-1, 3), ref.batch_norm(x.reshape(-1, 3))[0], atol=2e-5
  )
  groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
  y = jax.pmap(
    lambda x: jaxnorm.batch_norm(x, axis_name="i", axis_index_groups=groups)[0], axis_name="i"
  )(x)
  y = np.asarray(y)
  np.testing.assert_allclose(
    y[:4].reshape(-1, 3), ref.batch_norm(x[:4].reshape(-1, 3))[0], atol=2e-5
  )
  np.testing.assert_allclose(
    y[4:].reshape(-1, 3), ref.batch_norm(x[4:].reshape(-1, 3))[0], atol=2e-5
  )


@pytest.mark.parametrize("groups", [None, 4], ids=["whole_axis", "groups_of_8"])
def test_vmap_over_many_members_masks_and_groups(rng, groups):
  """Under vmap every example is a member: beyond 16 members the statistics combine in two
  psums instead of one gather, and axis_index_groups (refused by lax.psum under vmap) are
  summed group by group. Both exact with unequal counts, an empty member and |mean| >> std."""
  n = 32
  x = rng.normal(1e3, 1.0, (n, 3, 5)).astype(np.float32)
  mask = rng.random((n, 3, 1)) < 0.6
  mask[5] = False  # a member with no valid element
  index_groups = None if groups is None else [list(range(i, i + 8)) for i in range(0, n, 8)]

  def one(r, m):
    y, stats = jaxnorm.batch_norm(
      r[None], mask=m[None], axis_name="b", axis_index_groups=index_groups
    )
    return y[0], stats.mean, stats.var, stats.count

  y, mean, var, count = map(np.asarray, jax.vmap(one, axis_name="b")(x, mask))
  spans = [range(n)] if groups is None else [range(i, i + 8) for i in range(0, n, 8)]
  for span in spans:
    rows = list(span)
    expected_y, expected_mean, expected_var = ref.batch_norm(x[rows], mask=mask[rows])
    valid = np.broadcast_to(mask[rows], x[rows].shape)
    np.testing.assert_allclose(y[rows][valid], expected_y[valid], atol=2e-4)
    np.testing.assert_allclose(mean[rows], expected_mean[None].repeat(len(rows), 0), rtol=1e-6)
    np.testing.assert_allclose(var[rows], expected_var[None].repeat(len(rows), 0), rtol=1e-3)
    np.testing.assert_array_equal(count[rows], valid.sum() / 5)
  if groups is not None:  # the groups' statistics differ from the whole axis's
    assert np.abs(var[0] - var[8]).max() > 0.05


def test_flax_vmap_with_axis_name(rng):
  x = rng.normal(1.0, 2.0, (4, 6, 3)).astype(np.float32)
  vmapped = nn.vmap(
    jaxnorm.BatchNorm,
    in_axes=0,
    out_axes=0,
    variable_axes={"params": None, "batch_stats": None},
    split_rngs={"params": False},
    axis_name="batch",
  )
  module = vmapped(use_running_average=False, axis_name="batch")
  variables = module.init(jax.random.key(0), x)
  y, upd = module.apply(variables, x, mutable=["batch_stats"])
  expected_y, mean, var = ref.batch_norm(x.reshape(-1, 3))
  np.testing.assert_allclose(np.asarray(y).reshape(-1, 3), expected_y, atol=2e-5)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.01 * mean, rtol=1e-5, atol=1e-7)


def test_jit_over_named_sharding_needs_no_axis_name(mesh, rng):
  x = rng.normal(4.0, 2.0, (N_DEV * 4, 6)).astype(np.float32)
  cot = rng.normal(size=x.shape).astype(np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("d")))

  def loss(x):
    return jnp.sum(jaxnorm.batch_norm(x)[0] * cot)

  with jax.set_mesh(mesh):
    y = jax.jit(lambda x: jaxnorm.batch_norm(x)[0])(xs)
    g = jax.jit(jax.grad(loss))(xs)
  assert y.sharding.spec == P("d", None)
  np.testing.assert_allclose(np.asarray(y), ref.batch_norm(x)[0], atol=2e-5)
  np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(loss)(x)), atol=2e-5)


def test_data_parallel_example_matches_one_device(capsys):
  import json
  import os
  import sys

  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
  import data_parallel

  result = data_parallel.main(["--steps", "6"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
  assert result["devices"] == N_DEV and result["losses_match"]
  assert result["max_loss_difference"] < 1e-5
  assert result["final_loss"] < result["initial_loss"]


def _collectives(lib, mesh, differentiate):
  """(all-reduce, all-gather) ops in the compiled HLO of a shard_map BatchNorm step."""
  x = jnp.ones((8 * N_DEV, 16))
  bn = lib.BatchNorm(use_running_average=False, axis_name="d")
  variables = bn.init(jax.random.key(0), x[:8])

  def forward(params, x):
    y, upd = bn.apply({**variables, "params": params}, x, mutable=["batch_stats"])
    return jnp.sum(y**2), upd

  def step(params, x):
    if differentiate:  # w.r.t. the input too, as inside a network
      return jax.value_and_grad(forward, argnums=(0, 1), has_aux=True)(params, x)
    return forward(params, x)

  mapped = jax.jit(
    jax.shard_map(step, mesh=mesh, in_specs=(P(), P("d")), out_specs=P(), check_vma=False)
  )
  args = (
    jax.device_put(variables["params"], NamedSharding(mesh, P())),
    jax.device_put(x, NamedSharding(mesh, P("d"))),
  )
  with jax.set_mesh(mesh):
    hlo = mapped.lower(*args).compile().as_text()
  return tuple(len(re.findall(rf" {op}(?:-start)?\(", hlo)) for op in ("all-reduce", "all-gather"))


def test_one_collective_per_direction(mesh):
  """Exact statistics in one collective forward (each device's count, mean and M2, combined
  with Chan's formula) and one backward: no more than Flax's approximate pmean."""
  forward = _collectives(jaxnorm, mesh, False)
  step = _collectives(jaxnorm, mesh, True)
  assert sum(forward) == 1, forward
  assert sum(step) == 2, step
  assert sum(step) <= sum(_collectives(nn, mesh, True))


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_gspmd_statistics_stay_exact_far_off_centre(rng, axis_type):
  """The batch sharded under plain jit, data at 1e4 ± 1: each shard's sums shifted by an
  element of its own, merged around one shift (E[x²] − E[x]² would be off by order 1
  here; shards' means rounded at 1e4 were 7e-5-1.7e-4 of the variance off), in one
  collective of the shards' four sums stacked (XLA:CPU gathered four apart before), and
  nothing of x's size."""
  mesh = jax.make_mesh((N_DEV,), ("d",), axis_types=(getattr(jax.sharding.AxisType, axis_type),))
  x = rng.normal(1e4, 1.0, (N_DEV * 8, 6)).astype(np.float32)
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.0)
  variables = bn.init(jax.random.key(0), x)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    y, upd = jax.jit(lambda v, x: bn.apply(v, x, mutable=["batch_stats"]))(variables, xs)
  expected_y, mean, var = ref.batch_norm(x.astype(np.float64))
  # (x − μ in float32 at 1e4 is ~5e-4 off: y's own rounding, the same on one device)
  np.testing.assert_allclose(np.asarray(y), expected_y, atol=3e-3)
  np.testing.assert_allclose(upd["batch_stats"]["var"], var, rtol=2e-6)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], mean, rtol=1e-6)
  with jax.set_mesh(mesh):
    hlo = jax.jit(lambda x: jaxnorm.moments(x, 0)).lower(xs).compile().as_text()
  # (an all-gather, or under automatic sharding an all-reduce of each device's block)
  pattern = r"= (f32\[[\d,]*\])\S* (all-gather|all-reduce|collective-permute|all-to-all)"
  collectives = [shape for shape, _ in re.findall(pattern + r"(?:-start)?\(", hlo)]
  assert collectives == [f"f32[4,{N_DEV},6]"], collectives


@pytest.mark.parametrize(
  "shape,axes,spec",
  [((4, 8 * N_DEV), (1,), P(None, "d")), ((2, 2 * N_DEV, 3, 5), (1, 2), P(None, "d"))],
  ids=["rows-features-sharded", "map-h-sharded"],
)
def test_uncut_gspmd_statistics_stay_exact_far_off_centre(rng, monkeypatch, shape, axes, spec):
  """Uncut, as TPUs take the per-sample statistics and GPUs rows under automatic sharding
  (``sharding.mesh_blocks``, RESULTS items 81 and 83): a reduced axis sharded, GSPMD
  partitions the one merged reduction and combines the shards' partial sums with its own
  combiner. Data at 1e4 ± 1, every statistic within float32 rounding of the float64
  reference."""
  from jaxnorm._engine import maths

  monkeypatch.setattr(maths, "mesh_blocks", lambda x, axes: 1)
  mesh = jax.make_mesh((N_DEV,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  x = rng.normal(1e4, 1.0, shape).astype(np.float32)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    m = jax.jit(lambda x: jaxnorm.moments(x, axes))(xs)
    text = jax.jit(lambda x: jaxnorm.moments(x, axes)).lower(xs).compile().as_text()
  assert re.search(r" (all-gather|all-reduce)(-start)?\(", text)  # (the shards' sums combined)
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(np.asarray(m.mean), x64.mean(axes), rtol=1e-7)
  np.testing.assert_allclose(np.asarray(m.var), x64.var(axes), rtol=5e-6)


def _assert_batch_statistics_exact(x, xs, axes, w):
  """jaxnorm's moments of ``xs`` (``x`` laid out on the mesh in context) over ``axes``,
  and the gradient of its normalized output weighted by ``w``, against the float64
  reference of ``x``: the mean and variance within float32 rounding, the gradient as
  BatchNorm's (Batch Renorm's with r = γ = 1, d = 0)."""
  m = jax.jit(lambda x: jaxnorm.moments(x, axes))(xs)
  grad = jax.jit(
    jax.grad(lambda x: jnp.sum(jaxnorm.normalize(x, axes) * jnp.asarray(w, jnp.float32)))
  )(xs)
  mean, var, _ = ref.stats(x, axes)
  np.testing.assert_allclose(np.asarray(m.mean), mean.squeeze(axes), rtol=1e-7)
  np.testing.assert_allclose(np.asarray(m.var), var.squeeze(axes), rtol=5e-6)
  one, zero = np.ones(x.shape[-1]), np.zeros(x.shape[-1])
  want = ref.batch_renorm_grads(x, w, one, zero, one)[0]
  np.testing.assert_allclose(np.asarray(grad), want, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "one-by-one"])
def test_blocks_merged_either_way_stay_exact_far_off_centre(rng, monkeypatch, at_once):
  """BatchNorm's statistics over a sharded batch, cut into the mesh's blocks, merged by one
  reduction with the merge as its combiner (TPUs, ``sharding.blocks_merged_at_once``,
  RESULTS item 84) or one block after another (GPUs, XLA:CPU): data at 1e4 ± 1, the
  mean and variance within float32 rounding of the float64 reference
  (``E[x²] − E[x]²`` in float32 is off by far more than the variance there), and the
  gradient of the normalized output matching the reference's."""
  from jaxnorm._engine import maths

  monkeypatch.setattr(maths, "blocks_merged_at_once", lambda x: at_once)
  jax.clear_caches()
  mesh = jax.make_mesh((N_DEV,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  x = rng.normal(1e4, 1.0, (2 * N_DEV, 3, 3, 5)).astype(np.float32)
  axes = (0, 1, 2)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    text = jax.jit(lambda x: jaxnorm.moments(x, axes)).lower(xs).compile().as_text()
    _assert_batch_statistics_exact(x, xs, axes, rng.normal(size=x.shape))
  jax.clear_caches()
  # (the blocks' four sums gathered whole: an all-reduce of each device's slot)
  pattern = r"= (f32\[[\d,]*\])\S* (?:all-gather|all-reduce)(?:-start)?\("
  assert re.findall(pattern, text) == [f"f32[4,{N_DEV},5]"], re.findall(pattern, text)


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "one-by-one"])
@pytest.mark.parametrize("spec", [P("a", "b"), P(None, "a", "b")], ids=["batch-and-h", "h-and-w"])
def test_statistics_over_several_sharded_axes_stay_exact_far_off_centre(
  rng, monkeypatch, spec, at_once
):
  """BatchNorm's statistics where explicit sharding shards two reduced axes (a 2 × 4
  mesh: batch and H, or H and W): cut into each axis's shards (``sharding.typed_blocks``,
  RESULTS item 90), every block on one device, its sums combined in as few collectives as
  Flax's sums take (cut along the batch alone, GSPMD gathered the four sums apart: 5
  all-gathers forward against Flax's 2 all-reduces, 8 with H and W sharded). Data at
  1e4 ± 1 drifting by 0.5 along H, merged either way: the mean and variance within
  float32 rounding of the float64 reference, and the normalized output's gradient."""
  from jaxnorm._engine import maths

  monkeypatch.setattr(maths, "blocks_merged_at_once", lambda x: at_once)
  jax.clear_caches()
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  x = rng.normal(1e4, 1.0, (4, 8, 4, 5)) + 0.5 * np.arange(8)[:, None, None]
  x = x.astype(np.float32)
  axes = (0, 1, 2)
  w = rng.normal(size=x.shape)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    _assert_batch_statistics_exact(x, xs, axes, w)
    texts = [
      jax.jit(
        lambda x, lib=lib: lib.BatchNorm(use_running_average=False).init_with_output(
          jax.random.key(0), x
        )[0]
      )
      .lower(xs)
      .compile()
      .as_text()
      for lib in (jaxnorm, nn)
    ]
  jax.clear_caches()
  ours, flax = (len(re.findall(r" (?:all-gather|all-reduce)(?:-start)?\(", t)) for t in texts)
  assert 0 < ours <= flax and "collective-permute" not in texts[0], (ours, flax)


def test_gpu_statistics_explicitly_sharded_over_the_batch_stay_exact(rng, monkeypatch):
  """XLA:GPU's route under explicit sharding with the batch sharded (traced for GPUs on 8
  CPU devices): shifts sliced per sample from the unsharded axes, each device's sums
  merged over its samples and the blocks over the devices (RESULTS item 90). Data at
  1e4 ± 1 drifting by 40 over the batch: mean, variance and the normalized output's
  gradient as the float64 reference's."""
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "gpu")
  jax.clear_caches()
  mesh = jax.make_mesh((N_DEV,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  shape = (2 * N_DEV, 3, 3, 5)
  x = rng.normal(1e4, 1.0, shape) + np.linspace(0, 40, shape[0])[:, None, None, None]
  x = x.astype(np.float32)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    _assert_batch_statistics_exact(x, xs, (0, 1, 2), rng.normal(size=shape))
  jax.clear_caches()
