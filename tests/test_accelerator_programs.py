"""The programs users train with on TPUs and GPUs (issue 43): Flax's program with exact
statistics (``jaxnorm._engine.accelerators``), sharded programs that export, cache and
compile ahead of time, and — where libtpu is installed (CI installs it for this file:
``.ci/run``) — TPU programs compiled without a TPU, counted against Flax's."""

import json
import os
import re
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from tests import hlo, models, programs
from tests import reference as ref
from tests.devices import h100_mesh, tpu_devices

NORMS = [  # (name, module factory, shape, reduced axes, ε)
  ("batch", lambda m: m.BatchNorm(use_running_average=False), (16, 4, 4, 8), (0, 1, 2), 1e-5),
  ("layer", lambda m: m.LayerNorm(), (4, 8, 32), (2,), 1e-6),
  ("layer_hwc", lambda m: m.LayerNorm(reduction_axes=(1, 2, 3)), (4, 4, 4, 8), (1, 2, 3), 1e-6),
  ("instance", lambda m: m.InstanceNorm(), (4, 6, 6, 8), (1, 2), 1e-6),
  ("group", lambda m: m.GroupNorm(num_groups=4), (4, 6, 6, 16), None, 1e-6),
]


def _forward(module, x):
  variables = module.init(jax.random.key(0), x)
  mutable = ["batch_stats"] if "batch_stats" in variables else False

  def forward(params, x):
    out = module.apply({**variables, "params": params}, x, mutable=mutable)
    return out[0] if mutable else out

  return forward, variables["params"]


def _reference(name, x, axes, eps):
  x = np.asarray(x, np.float64)
  if name == "group":
    g = x.reshape(x.shape[:-1] + (4, x.shape[-1] // 4))
    dims = (1, 2, 4)
    y = (g - g.mean(dims, keepdims=True)) / np.sqrt(g.var(dims, keepdims=True) + eps)
    return y.reshape(x.shape)
  return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)


@pytest.fixture
def accelerator_branch(monkeypatch, request):
  """Programs lowered for XLA:CPU take the branch they take on TPUs and GPUs."""
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "tpu")
  jax.clear_caches()
  request.addfinalizer(jax.clear_caches)


@pytest.mark.parametrize("name,make,shape,axes,eps", NORMS, ids=[n[0] for n in NORMS])
def test_accelerator_branch_is_exact_far_off_centre(name, make, shape, axes, eps, rng):
  """Data at 1e4 ± 1, the branch TPUs and GPUs take: the output within float32's rounding
  of x − μ at 1e4 (Flax's E[x²] − E[x]² is off by order 1 there), and the gradient equal to
  XLA:CPU's kernel's on centred data."""
  x = rng.normal(1e4, 1.0, shape).astype(np.float32)
  centred = rng.normal(0.0, 1.0, shape).astype(np.float32)
  forward, params = _forward(make(jaxnorm), x)
  loss = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.sin(forward(p, x))), (0, 1)))
  expected = loss(params, centred)
  y_cpu = np.asarray(jax.jit(forward)(params, x))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "tpu")
    jax.clear_caches()
    y = np.asarray(jax.jit(forward)(params, x))
    got = loss(params, centred)
  jax.clear_caches()
  reference = _reference(name, x, axes, eps)
  np.testing.assert_allclose(y, reference, atol=3e-3)  # (x − μ in float32 at 1e4: 5e-4)
  np.testing.assert_allclose(y, y_cpu, atol=3e-3)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_accelerator_branch_statistics_exact_far_off_centre(rng, accelerator_branch):
  """BatchNorm's running statistics from the accelerators' merged shifted sums at 1e4 ± 1:
  the variance 2e-6 relative off at most, where E[x²] − E[x]² is off by order 1."""
  x = rng.normal(1e4, 1.0, (64, 6)).astype(np.float32)
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.0)
  variables = bn.init(jax.random.key(0), x)
  _, upd = jax.jit(lambda v, x: bn.apply(v, x, mutable=["batch_stats"]))(variables, x)
  _, mean, var = ref.batch_norm(x.astype(np.float64))
  np.testing.assert_allclose(upd["batch_stats"]["var"], var, rtol=2e-6)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], mean, rtol=1e-7)


@pytest.mark.parametrize(
  "norm",
  [
    lambda x: jaxnorm.layer_norm(x),
    lambda x: jaxnorm.batch_norm(x)[0],
    lambda x: jaxnorm.group_norm(x.reshape(2, 3, 4), num_groups=2),
  ],
  ids=["layer", "batch", "group"],
)
def test_accelerator_branch_second_order_and_strict_promotion(norm, rng, monkeypatch):
  """Hessians through the accelerators' statistics (a reduction JAX cannot differentiate,
  behind a rule that is itself differentiable) equal XLA:CPU's kernel's, also with
  ``jax_numpy_dtype_promotion="strict"``."""
  x = rng.normal(3.0, 2.0, (6, 4)).astype(np.float32)

  def hessian():
    with jax.numpy_dtype_promotion("strict"):
      return jax.hessian(lambda x: jnp.sum(jnp.sin(norm(x))))(x)

  expected = hessian()
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "tpu")
  jax.clear_caches()
  try:
    got = hessian()
  finally:
    jax.clear_caches()
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)
  assert np.abs(expected).max() > 0.1  # (a non-trivial second derivative)


@pytest.fixture
def tpu_branch(monkeypatch):
  """Programs lowered for XLA:CPU take the branch they take on TPUs."""
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "tpu")
  jax.clear_caches()
  yield
  jax.clear_caches()


@pytest.mark.parametrize("data", ["off_centre", "skewed_head"])
def test_tpu_add_layer_norm_statistics_exact(data, rng, tpu_branch):
  """Add & LayerNorm on XLA:TPU's branch: plain sums around the mean of each row's first
  128 elements (``rough_row_mean``, from x and the residual). At 1e4 ± 1, where Flax's
  E[h²] − E[h]² is off by order 1, and on rows whose first 128 elements sit 6 above the
  rest (the shift 1.5 standard deviations off the mean, near its bound sqrt(512/128 − 1)):
  the output and h as the float64 reference's within float32's rounding of h − μ."""
  x = rng.normal(0.0, 1.0, (8, 512)).astype(np.float32)
  residual = rng.normal(1e4, 1.0, (8, 512)).astype(np.float32)
  if data == "skewed_head":
    residual[:, :128] += 6.0
  y, h = jax.jit(jaxnorm.add_layer_norm)(x, residual)
  h_ref = x.astype(np.float64) + residual
  np.testing.assert_allclose(h, h_ref, rtol=1e-7)
  # (the reference from h as the program rounds it: float32 at 1e4 is 1e-3 apart)
  np.testing.assert_allclose(y, ref.layer_norm(np.asarray(h)), atol=2e-3)
  about = jaxnorm._engine.tpu.rough_row_mean(x, residual, (1,), jnp.float32)
  mean, var = jaxnorm._engine.tpu.moments_about(h, about, (1,), None, jnp.float32)
  np.testing.assert_allclose(mean[:, 0], np.asarray(h, np.float64).mean(1), rtol=1e-7)
  np.testing.assert_allclose(var[:, 0], np.asarray(h, np.float64).var(1), rtol=2e-5)
  fast = np.mean(np.square(h), 1) - np.square(np.mean(h, 1))  # (what the shift prevents)
  assert np.abs(fast - np.asarray(h, np.float64).var(1)).max() > 0.1


def test_tpu_add_layer_norm_derivatives(rng, tpu_branch):
  """The gradient (into x and the residual, with h's cotangent) and the Hessian of Add &
  LayerNorm on XLA:TPU's branch equal XLA:CPU's kernel's."""
  x = rng.normal(3.0, 2.0, (2, 512)).astype(np.float32)
  residual = rng.normal(-1.0, 1.0, (2, 512)).astype(np.float32)

  def loss(x, residual):
    y, h = jaxnorm.add_layer_norm(x, residual)
    return jnp.sum(jnp.sin(y)) + jnp.sum(jnp.cos(h))

  def both():
    return jax.jit(jax.grad(loss, (0, 1)))(x, residual), jax.jit(jax.hessian(loss))(x, residual)

  got = both()
  with pytest.MonkeyPatch.context() as cpu:
    cpu.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "cpu")
    jax.clear_caches()
    expected = both()
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
  assert np.abs(expected[1]).max() > 0.1  # (a non-trivial second derivative)


@pytest.mark.parametrize("form", ["global", "per_sample", "chunks"])
@pytest.mark.parametrize("groups", [None, (3, 4)], ids=["channels", "groups"])
def test_gpu_column_statistics_exact_far_off_centre(rng, groups, form):
  """XLA:GPU's column statistics (plain sums shifted by two elements of each group, where a
  variadic column reduction would write its operands out; over the batch and on a mesh,
  per index of the first reduced axis, merged over it; long columns with few kept
  indices in chunks, each around its own shifts, merged) at 1e4 ± 1, drifting by 50
  along the rows (the chunks' shifts far apart): mean and variance as the float64
  reference's."""
  shape = (2, 32, 32, 8) if form == "chunks" else (16, 6, 6, 8)
  drift = np.linspace(0, 50, shape[1])[:, None, None]
  x = (rng.normal(1e4, 1.0, shape) + drift).astype(np.float32)
  axes = (0, 1, 2) if groups is None and form != "chunks" else (1, 2)
  per_outer = form == "per_sample"
  if form == "chunks":
    assert jaxnorm._engine.gpu.column_chunks(x.shape, axes) == 4
  mean, var = jax.jit(
    lambda x: jaxnorm._engine.maths.moments_of(
      jaxnorm._engine.gpu.two_shifts(x, axes, x.dtype, per_outer, groups), None
    )
  )(x)
  x64 = x.astype(np.float64)
  if groups is not None:
    x64 = x64.reshape(*shape[:3], 4, 2)
    axes = (1, 2, 4)
  m, v = x64.mean(axes, keepdims=True), x64.var(axes, keepdims=True)
  if groups is not None:
    m, v = (np.repeat(t[..., 0], 2, axis=-1) for t in (m, v))
  np.testing.assert_allclose(mean, m.reshape(mean.shape), rtol=1e-7)
  # (float32 sums of 576-2048 terms: ~3e-6; E[x²] − E[x]² is off by order 1 here)
  np.testing.assert_allclose(var, v.reshape(var.shape), rtol=1e-5)


def test_gpu_column_statistics_of_channel_groups_alone(rng):
  """XLA:GPU's column statistics where no axis but the channel groups' is reduced (a
  GroupNorm over (batch, channels)): each element is its own shift, the groups merged
  exactly at 1e4 ± 1."""
  x = rng.normal(1e4, 1.0, (16, 8)).astype(np.float32)
  mean, var = jax.jit(
    lambda x: jaxnorm._engine.maths.moments_of(
      jaxnorm._engine.gpu.two_shifts(x, (), x.dtype, groups=(1, 4)), None
    )
  )(x)
  x64 = x.astype(np.float64).reshape(16, 4, 2)
  m, v = (np.repeat(t, 2, axis=-1) for t in (x64.mean(-1), x64.var(-1)))
  np.testing.assert_allclose(mean, m, rtol=1e-7)
  np.testing.assert_allclose(var, v, rtol=1e-4)


def _batch_norm(m):
  return m.BatchNorm(use_running_average=False)


LAYOUTS = [  # (name, module factory, shape, partition spec over a (4, 2) mesh)
  ("batch", _batch_norm, (16, 4, 4, 8), P("a")),
  ("batch_features", _batch_norm, (8, 4, 4, 8), P(None, None, None, "a")),
  ("layer_features", lambda m: m.LayerNorm(), (4, 8, 16), P(None, None, "a")),
  ("layer_batch_sequence", lambda m: m.LayerNorm(), (4, 8, 16), P("a", "b")),
  ("rms_batch_sequence", lambda m: m.RMSNorm(), (4, 8, 16), P("a", "b")),
  ("group_batch_h", lambda m: m.GroupNorm(num_groups=4), (4, 8, 4, 16), P("b", "a")),
]


def _step(module, x):
  """Forward+backward of ``module`` (gradients of the parameters and the input)."""
  variables = module.init(jax.random.key(0), x)
  mutable = ["batch_stats"] if "batch_stats" in variables else False

  def step(params, x):
    def loss(params, x):
      out = module.apply({**variables, "params": params}, x, mutable=mutable)
      return jnp.sum(jnp.sin(out[0] if mutable else out))

    return jax.grad(loss, (0, 1))(params, x)

  return step, variables["params"]


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("name,make,shape,spec", LAYOUTS, ids=[n[0] for n in LAYOUTS])
def test_sharded_programs_export_and_match(name, make, shape, spec, axis_type, rng):
  """Every layout's forward+backward under GSPMD: ``jax.export`` for CPU, TPU and CUDA
  works (the custom-partitioned statistics made it fail with host callbacks), and the
  exported call equals the unexported one; the gradient matches one device's."""
  mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(axis_type,) * 2)
  x = rng.normal(3.0, 2.0, shape).astype(np.float32)
  step, params = _step(make(jaxnorm), x)
  single = jax.jit(step)(params, x)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    ps = jax.device_put(params, NamedSharding(mesh, P()))
    exported = jax.export.export(jax.jit(step), platforms=("cpu", "tpu", "cuda"))(ps, xs)
    text = exported.mlir_module()
    called = jax.export.deserialize(exported.serialize()).call(ps, xs)
    direct = jax.jit(step)(ps, xs)
  assert "CustomSPMDPartitioning" not in text and "callback" not in text
  for a, b, c in zip(*map(jax.tree.leaves, (called, direct, single)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-4)  # (sum order)


_CACHE_PROBE = textwrap.dedent(
  """
  import json, sys
  import jax
  import numpy as np
  jax.config.update("jax_num_cpu_devices", 8)
  jax.config.update("jax_compilation_cache_dir", sys.argv[1])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  events = []
  jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
  from jax.sharding import NamedSharding, PartitionSpec as P
  import jaxnorm
  mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  bn = jaxnorm.BatchNorm(use_running_average=False)
  x = np.ones((16, 4, 4, 8), np.float32)
  v = bn.init(jax.random.key(0), x)
  step = jax.jit(lambda v, x: bn.apply(v, x, mutable=["batch_stats"]))
  step(v, jax.device_put(x, NamedSharding(mesh, P("d"))))
  print(json.dumps([e for e in events if "compilation_cache" in e]))
  """
)


def test_sharded_program_hits_the_persistent_cache_in_a_second_process(tmp_path):
  """A sharded BatchNorm step compiled in one process is read from the persistent
  compilation cache in the next (the custom-partitioned op's key changed every process)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  runs = []
  for _ in range(2):
    out = subprocess.run(
      [sys.executable, "-c", _CACHE_PROBE, str(tmp_path)],
      env=env,
      capture_output=True,
      text=True,
      check=True,
    )
    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
  assert not any("cache_hits" in e for e in runs[0]), runs[0]
  assert any("cache_hits" in e for e in runs[1]), runs[1]
  assert not any("cache_miss" in e for e in runs[1]), runs[1]


# -- TPU programs, compiled without a TPU (libtpu) -----------------------------------------


TPU_NORMS = [  # (programs kind, shape): ``programs.module``'s BatchNorm, LayerNorm, ...
  ("batch_train", (32, 16, 16, 128)),
  ("layer", (8, 256, 768)),
  ("rms", (8, 256, 768)),
  ("group", (8, 16, 16, 256)),
  ("instance", (8, 16, 16, 128)),
  ("add_layer", (8, 256, 768)),  # (Add & LayerNorm: its statistics around a rough mean)
]
_SMALL_GROUPS = pytest.mark.xfail(
  strict=True,
  reason="GroupNorm on a small map (8x16x16x256): forward Flax's kernel count, 1.04x its "
  "bytes in bfloat16 (the per-channel sums' regrouping moves three small arrays padded to "
  "TPU tiles, Flax's two), 1.02x in float32; float32 forward+backward 43 kernels against "
  "33 and 39 (XLA:TPU's async slices of one more full-size array; RESULTS items 47, 60)",
)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(
  "kind,shape",
  [pytest.param(*c, id=c[0], marks=_SMALL_GROUPS if c[0] == "group" else ()) for c in TPU_NORMS],
)
def test_tpu_programs_cost_what_flax_costs(kind, shape, dtype):
  """Compiled for a TPU v5e (``tests/programs.py``'s programs, counted by ``tests/hlo.py``):
  jaxnorm's forward and forward+backward move no more bytes than Flax's default
  (approximate) program and launch no more kernels than Flax's default program or its
  ``use_fast_variance=False`` one (exact statistics); the tangent in Σ(x − μ)·ẋ took one
  small kernel more (RESULTS item 51). Add & LayerNorm's forward may read x once more
  (the point's allowance for exact statistics: its rough mean's slices, 1.03× at 768 wide);
  forward+backward it too is within Flax's bytes (it read h once more, 1.03×, item 52)."""
  devices = tpu_devices()
  mesh = Mesh(np.array(devices[:1]), ("d",))
  compiled, nbytes = programs.compiled(kind, shape, dtype, NamedSharding(mesh, P()))
  for program in ("forward", "fwd+bwd"):
    k, b = hlo.measure(compiled[("jaxnorm", program)], nbytes, "tpu")
    kf, bf = hlo.measure(compiled[("flax", program)], nbytes, "tpu")
    two_pass = compiled.get(("flax2", program), compiled[("flax", program)])
    k2, _ = hlo.measure(two_pass, nbytes, "tpu")
    allowance = 1.0 if kind == "add_layer" and program == "forward" else 0.0
    assert b <= 1.005 * bf + allowance, (program, b / bf)
    assert k <= max(k2, kf), (program, k, kf, k2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_tpu_batch_renorm_costs_batch_norm_and_its_step_counter(dtype):
  """Batch Renorm's training step compiled for a TPU v5e, against Flax's BatchNorm's (Flax
  has no Batch Renorm) and against Batch Renorm written by hand on Flax's statistics
  (``programs.renorm_by_hand``, what a Flax user pays for it): Flax
  BatchNorm's bytes forward and forward+backward, at most two kernels more than its
  program (the step counter's copy to the scalar unit, the small kernel of ``r`` and
  ``d``; 11 against 3 before RESULTS item 53, 6 before item 58), and no more kernels or
  bytes than the hand-written form (17 kernels forward, 21 forward+backward)."""
  devices = tpu_devices()
  replicated = NamedSharding(Mesh(np.array(devices[:1]), ("d",)), P())
  dt = jnp.dtype(dtype)
  x = jax.ShapeDtypeStruct((32, 16, 16, 64), dt, sharding=replicated)
  nbytes = x.size * dt.itemsize
  got = {}
  for name, module in (
    ("jaxnorm", jaxnorm.BatchRenorm(use_running_average=False, dtype=dt)),
    ("flax", nn.BatchNorm(use_running_average=False, dtype=dt)),
  ):
    variables = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
      jax.eval_shape(module.init, jax.random.key(0), x),
    )

    def forward(variables, x, m=module):
      return m.apply(variables, x, mutable=["batch_stats"])[0]

    def fwd_bwd(variables, x, m=module):
      return jax.vjp(lambda v, x: forward(v, x, m), variables, x)[1](x)

    got[name] = [
      hlo.measure(jax.jit(f).lower(variables, x).compile(), nbytes, "tpu")
      for f in (forward, fwd_bwd)
    ]
    if name == "jaxnorm":
      hand = (variables["params"], {"batch_stats": variables["batch_stats"]})
      got["by hand"] = [
        hlo.measure(jax.jit(f).lower(hand, x).compile(), nbytes, "tpu")
        for f in (
          programs.renorm_by_hand,
          lambda p, x: jax.vjp(programs.renorm_by_hand, p, x)[1](x),
        )
      ]
  (k, b), (_, b2) = got["jaxnorm"]
  (kf, bf), (_, bf2) = got["flax"]
  assert b <= 1.005 * bf and b2 <= 1.005 * bf2, (b / bf, b2 / bf2)
  assert k <= kf + 2, (k, kf)
  for (kj, bj), (kh, bh) in zip(got["jaxnorm"], got["by hand"], strict=True):
    assert kj <= kh and bj <= 1.005 * bh, (got["jaxnorm"], got["by hand"])


# Today's ratios to Flax's default program, rounded up (RESULTS items 79 and 84).
# (GPT-2 small's steps are in accelerator_programs.py --steps: compiled for a v5e they cost
# this suite 5 minutes of CI's two cores; the Transformer stack takes the same route.)
STEP_BOUNDS = {"ResNet50": (1.13, 1.03), "TransformerStack": (1.05, 1.025)}


@pytest.mark.parametrize("model", list(STEP_BOUNDS))
def test_tpu_training_steps_cost_less_than_flaxs_exact_program(model):
  """Whole training steps (``tests/models.py``'s ResNet-50 and Pre-LN Transformer stack) on
  one v5e chip: fewer kernels and bytes than Flax's exact program
  (``use_fast_variance=False``), and within today's ratios to its default one. With the
  statistics and r·γ kept in the kept-dims shape, XLA:TPU split the per-channel
  arithmetic off each sum (ResNet-50 625 kernels against the exact program's 602 and
  Flax's 474; the Transformer 339 against 302, RESULTS item 79)."""
  mesh = Mesh(np.array(tpu_devices()[:1]), ("d",))
  libs = {"jaxnorm": jaxnorm, "flax": nn, "exact": models.flax_exact()}
  got = {k: v[:2] for k, v in models.step_costs(model, libs, mesh, "tpu").items()}
  (k, b), (kf, bf), (ke, be) = got["jaxnorm"], got["flax"], got["exact"]
  kernels, moved = STEP_BOUNDS[model]
  assert k <= ke and b <= be, got
  assert k <= kernels * kf and b <= moved * bf, (k / kf, b / bf)


# Per-sample norms whose reduced axis the layout shards: under automatic sharding on TPUs
# their statistics are not cut into the mesh's blocks (mesh_blocks), and GSPMD gathers each
# of the four sums apart (RESULTS item 81).
GATHERED_APART = {"layer_features", "group_batch_h"}


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
@pytest.mark.parametrize("name,make,shape,spec", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_tpu_sharded_programs_compile_ahead_of_time(name, make, shape, spec, axis_type):
  """Each layout's forward and forward+backward compiled for a 4-chip TPU v5e slice
  without chips (what large runs do before they get them; the custom-partitioned op had
  no TPU emitter): no all-gather of x, and no more collectives than Flax's (where a minor
  dimension was sharded, a sharded D or H, XLA:TPU once gathered the four sums apart: 4
  collectives against Flax's 1, until the blocks' sums were stacked into one gather). Under
  automatic sharding the per-sample norms over a sharded reduced axis are not cut into
  blocks on TPUs (their data-parallel programs are then Flax's), and take at most three
  small all-gathers more; under explicit sharding the type says, and they are cut."""
  devices = tpu_devices()
  types = (getattr(AxisType, axis_type),) * 2
  mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("a", "b"), axis_types=types)
  spec = P(*(("a" if e == "a" else "b" if e == "b" else None) for e in spec))
  x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
  counts = {}
  for lib in (jaxnorm, nn):
    module = make(lib)
    variables = jax.eval_shape(lambda m=module: m.init(jax.random.key(0), jnp.zeros(shape)))
    params = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P())),
      variables["params"],
    )
    step, _ = _step(module, np.zeros(shape, np.float32))
    compiled = jax.jit(step).lower(params, x).compile()
    counts[lib.__name__] = hlo.count(compiled.as_text())
    if lib is jaxnorm:
      size = ",".join(map(str, shape))
      assert not re.search(rf"f32\[{size}\]\S* all-gather", compiled.as_text())
  ours, flax = counts["jaxnorm"], counts["flax.linen"]
  extra = 3 if axis_type == "Auto" and name in GATHERED_APART else 0
  assert sum(ours.values()) <= sum(flax.values()) + extra, counts


WHOLE_ON_EACH = [  # (programs kind, shape, spec on a 2 × 2 mesh): no reduced axis sharded
  ("layer", (8, 512, 1024), P("d")),
  ("layer", (16, 1024, 4096), P(("d", "d2"))),
  ("instance", (8, 32, 32, 256), P("d")),
  ("batch_train", (64, 28, 28, 64), P(None, None, None, "d")),
]
_BATCH_AXIS_CUT = pytest.mark.xfail(
  strict=True,
  reason="automatic sharding: BatchNorm's batch statistics are cut into the mesh's blocks "
  "(the type does not say whether the batch is sharded, and data parallelism shards it), "
  "which costs XLA:TPU 20.02|x| forward against Flax's 14.00 where the features are "
  "sharded instead (RESULTS items 67 and 81); explicit sharding takes Flax's program",
)


@pytest.mark.parametrize(
  "kind,shape,spec,axis_type",
  [
    pytest.param(
      *c,
      axis_type,
      id=f"{c[0]}-{c[2]}-{axis_type}",
      marks=_BATCH_AXIS_CUT if c[0] == "batch_train" and axis_type == "Auto" else (),
    )
    for c in WHOLE_ON_EACH
    for axis_type in ("Explicit", "Auto")
  ],
)
def test_tpu_per_device_costs_flaxs_where_the_reduced_axes_are_whole(kind, shape, spec, axis_type):
  """Each device's program where no reduced axis is sharded moves Flax's bytes with at
  most one kernel more. Under explicit sharding the type says which axes are sharded: the
  statistics are cut into the mesh's blocks only where one of theirs is (with the blocks:
  LayerNorm 1.29× forward and 19 kernels against 3, BatchNorm over sharded features
  1.43×; RESULTS item 68). Under automatic sharding (the marked BatchNorm case aside) the
  statistics per sample are not cut on TPUs (LayerNorm batch-sharded 10.16|x| and 28
  kernels against Flax's 7.01 and 3 with the cut, InstanceNorm 7.23|x| and 18; item 81)."""
  devices = tpu_devices()
  types = (getattr(AxisType, axis_type),) * 2
  mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("d", "d2"), axis_types=types)
  progs, _ = programs.compiled(kind, shape, "float32", NamedSharding(mesh, spec))
  for pass_ in ("forward", "fwd+bwd"):
    (k, b), (kf, bf) = (hlo.measure(progs[(lib, pass_)], 1, "tpu") for lib in ("jaxnorm", "flax"))
    assert b <= 1.005 * bf and k <= kf + 1, (pass_, k, kf, b / bf)


@pytest.mark.parametrize("spec", [P("d", "d2"), P(None, "d", "d2")], ids=str)
def test_tpu_batch_norm_over_several_explicitly_sharded_axes(spec):
  """BatchNorm training (64 × 28 × 28 × 64) on a 2 × 2 v5e under explicit sharding with two
  reduced axes sharded (batch and H, or H and W): cut into each axis's shards
  (``sharding.typed_blocks``), Flax's collectives per device and at most twice its
  kernels forward, two more forward+backward. Cut along the first reduced axis alone,
  GSPMD gathered each of the four sums apart: 26 kernels and 5 collectives forward
  against Flax's 4 and 1 (batch and H), 15 and 4 (H and W; RESULTS item 90)."""
  types = (AxisType.Explicit,) * 2
  mesh = Mesh(np.array(tpu_devices()[:4]).reshape(2, 2), ("d", "d2"), axis_types=types)
  progs, _ = programs.compiled(
    "batch_train", (64, 28, 28, 64), "float32", NamedSharding(mesh, spec)
  )
  for pass_, extra in (("forward", 4), ("fwd+bwd", 2)):
    (k, b), (kf, bf) = (hlo.measure(progs[(lib, pass_)], 1, "tpu") for lib in ("jaxnorm", "flax"))
    ours, flax = (
      sum(hlo.count(progs[(lib, pass_)].as_text()).values()) for lib in ("jaxnorm", "flax")
    )
    assert ours <= flax and k <= kf + extra and b <= 1.005 * bf, (pass_, k, kf, ours, flax)


# Whole data-parallel steps over 4 v5e chips under automatic sharding, jaxnorm / Flax's
# default program today (RESULTS item 81), rounded up: (kernels, bytes).
SHARDED_STEP_BOUNDS = {
  "TransformerStack": (1.01, 1.015),
  "UNetStack": (1.0, 1.0),
  "ResNet50": (1.29, 1.027),  # (BatchNorm's blocks, merged at once: 1.71 and 1.033 unrolled)
}


@pytest.mark.parametrize("model", list(SHARDED_STEP_BOUNDS))
def test_tpu_data_parallel_steps_cost_flaxs_per_device(model):
  """Training steps of ``tests/models.py``'s Pre-LN Transformer, GroupNorm UNet and
  ResNet-50, the batch sharded over 4 v5e chips (automatic sharding,
  ``ShapeDtypeStruct``s with their shardings): each device's kernels and bytes within
  today's ratios to Flax's, and Flax's collectives. With the per-sample statistics cut
  into the mesh's blocks: 401 kernels against 305 and 1.088× the bytes, and 653 against
  450 (RESULTS item 81); with BatchNorm's blocks merged one by one, ResNet-50 1,450
  against 797 (item 84); with their gather's bounds checked (``jnp.take``'s default
  fill), 1,089 kernels and 1.034× the bytes, 90 all-reduces and 15 all-gathers against
  Flax's 99 all-reduces (item 89)."""
  mesh = Mesh(np.array(tpu_devices()[:4]), ("d",))
  got = models.step_costs(model, {"jaxnorm": jaxnorm, "flax": nn}, mesh, "tpu", P("d"))
  (k, b, c), (kf, bf, cf) = got["jaxnorm"], got["flax"]
  kernels, moved = SHARDED_STEP_BOUNDS[model]
  assert k <= kernels * kf and b <= moved * bf, (k / kf, b / bf)
  assert c == cf, (c, cf)


# -- H100 programs, compiled without a GPU (the CUDA plugin) ----------------------------------


H100_NORMS = [  # (programs kind, shape): rows, maps and Add & Norm users train with
  ("layer", (16, 512, 768)),
  ("rms", (4, 1024, 4096)),
  ("layer", (4, 1024, 4096)),
  ("batch_train", (32, 56, 56, 64)),
  ("group", (32, 56, 56, 64)),
  ("instance", (32, 56, 56, 64)),
  ("add_rms", (16, 512, 768)),
]


def _h100_programs(kind, shape, dtype):
  """jaxnorm's and Flax's programs of ``kind`` compiled for one H100."""
  replicated = NamedSharding(h100_mesh(), P())
  return programs.compiled(kind, shape, dtype, replicated, libs=("jaxnorm", "flax"))


H100_EXTRA_KERNELS = {  # (kind, width, dtype): kernels beyond Flax's, forward+backward
  ("layer", 4096, "bfloat16"): 1,
  # (float32 maps: the shifts' two slices; bytes equal Flax's. One kernel fewer while every
  # platform's form was traced: XLA:GPU grouped the derivative's sums otherwise, item 65)
  ("batch_train", 64, "float32"): 2,
  # (the merge of the per-sample sums over the batch: RESULTS item 70)
  ("batch_train", 64, "bfloat16"): 1,
  ("instance", 64, "float32"): 1,
  ("instance", 64, "bfloat16"): 1,
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kind,shape", H100_NORMS, ids=[f"{k}-{s[-1]}" for k, s in H100_NORMS])
def test_h100_programs_cost_what_flax_costs(kind, shape, dtype):
  """Compiled for an H100 (``tests/programs.py``'s programs, ``hlo``'s bytes model): the
  forward+backward moves no more bytes than Flax's and launches no more kernels (one more
  for LayerNorm over 4,096-wide bfloat16 rows, XLA:GPU's split of its derivative), and the
  forward moves no more bytes (BatchNorm training and LayerNorm over a map take more
  kernels forward: the shifts' slices, a known limit). One small kernel more than Flax's
  forward+backward where XLA:GPU splits the derivative's reductions: LayerNorm over
  4,096-wide bfloat16 rows, and InstanceNorm on a ResNet map; two for float32 BatchNorm
  training there and one for bfloat16 (its per-sample sums merged, RESULTS item 70;
  bytes within Flax's). Until these, the H100 programs had no test: a change to
  the statistics could cost the GPU programs and pass every test."""
  compiled, nbytes = _h100_programs(kind, shape, dtype)
  for program in ("forward", "fwd+bwd"):
    k, b = hlo.kernels_and_bytes(compiled[("jaxnorm", program)].as_text())
    kf, bf = hlo.kernels_and_bytes(compiled[("flax", program)].as_text())
    assert b <= 1.005 * bf, (program, b / nbytes, bf / nbytes)
    if program == "fwd+bwd":
      assert k <= kf + H100_EXTRA_KERNELS.get((kind, shape[-1], dtype), 0), (program, k, kf)


H100_MAPS = [  # (kind, shape, dtype): per-sample statistics XLA:GPU read more than once
  ("group", (2, 64, 64, 320), "bfloat16"),  # (a diffusion UNet's first level: chunks)
  ("instance", (4, 32, 32, 128), "float32"),  # (chunks)
  ("group", (8, 16, 16, 64), "float32"),  # (the UNet stack's map: both sums in one reduction)
]


@pytest.mark.parametrize(
  "kind,shape,dtype", H100_MAPS, ids=[f"{k}-{s[1]}-{d}" for k, s, d in H100_MAPS]
)
def test_h100_per_sample_statistics_read_x_once(kind, shape, dtype):
  """GroupNorm and InstanceNorm compiled for an H100 where XLA:GPU wrote the shifted
  ``x − a`` out or read x twice (RESULTS item 85): forward and forward+backward move
  Flax's bytes (within 1 %), with no more kernels than Flax's exact program. Long columns
  with few kept indices in chunks (``gpu.column_chunks``; without them 3.66× and 2.33×
  Flax's bytes forward), both shifted sums in one reduction (as two, 1.33× at 8 × 16 ×
  16 × 64)."""
  replicated = NamedSharding(h100_mesh(), P())
  compiled, _ = programs.compiled(kind, shape, dtype, replicated)
  for program in ("forward", "fwd+bwd"):
    (k, b), (_, bf), (ke, _) = (
      hlo.kernels_and_bytes(compiled[(lib, program)].as_text())
      for lib in ("jaxnorm", "flax", "flax2")  # (flax2: Flax's exact, two-pass program)
    )
    assert b <= 1.01 * bf, (program, b / bf)
    assert k <= ke, (program, k, ke)


H100_GROUP_MERGES = [  # (shape, merges): GroupNorm's float32 statistics on one H100
  ((8, 16, 16, 64), 0),  # (few kept indices: each group's shifts, no merge)
  ((2, 64, 64, 320), 1),  # (long columns: in chunks, merged over them)
  ((32, 32, 32, 512), 1),  # (many kept indices: each channel's shifts, merged over groups)
]


@pytest.mark.parametrize(
  "shape,merges", H100_GROUP_MERGES, ids=[str(s[-1]) for s, _ in H100_GROUP_MERGES]
)
def test_h100_group_norm_merges_no_channels_where_few(shape, merges):
  """XLA:GPU's GroupNorm off a mesh with few kept indices: sums shifted by two elements of
  each channel group, no merge over a group's channels (a reduction with its own
  combiner, a tuple-shaped reduce), with which a 10-GroupNorm UNet's inference program
  took 1.52-1.59× Flax's lower + compile time against 1.35-1.42× (RESULTS item 87);
  with many, each channel's shifts, merged (each group's took 8 kernels forward at 32 ×
  32 × 32 × 512 against Flax's 6 and its exact program's 7). Exactness far off centre:
  ``test_gpu_column_statistics_exact_far_off_centre``."""
  replicated = NamedSharding(h100_mesh(), P())
  compiled, _ = programs.compiled("group", shape, "float32", replicated)
  for program in ("forward", "fwd+bwd"):
    text = compiled[("jaxnorm", program)].as_text()
    found = re.findall(r"= \((?:[a-z0-9]+\[[^]]*\]\{[^}]*\}, )+[^)]*\) reduce\(", text)
    assert len(found) == merges, program
  k, ke = (
    hlo.kernels_and_bytes(compiled[(lib, "forward")].as_text())[0] for lib in ("jaxnorm", "flax2")
  )
  assert k <= ke, (k, ke)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_h100_row_norm_forward_is_one_kernel(kind, dtype):
  """XLA:GPU's undifferentiated row norms: the statistics in two passes over each row,
  which XLA:GPU turns with the output into one kernel reading x once, 2|x| (Flax's
  LayerNorm: 3 kernels and 3|x|; the merged shifted sums there: 3 and 3|x|, which Flax's
  bound above lets pass — ``router.merged_moments``' GPU branch, the decisions table)."""
  compiled, nbytes = _h100_programs(kind, (16, 512, 768), dtype)
  k, b = hlo.kernels_and_bytes(compiled[("jaxnorm", "forward")].as_text())
  assert (k, round(b / nbytes, 2)) == (1, 2.0)


@pytest.mark.parametrize("width", [16384, 32768])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_h100_long_rows_take_flaxs_kernels(dtype, width):
  """LayerNorm's forward over rows longer than ``gpu.FUSED_ROW`` (8,192) elements: the
  merged sums, Flax's kernels (or fewer) and bytes. The two passes' one kernel took 1.44×
  Flax's device time at 4,096 × 16,384 bfloat16 on an H200, and from 32,768 elements
  XLA:GPU splits it into 7 kernels moving 4.04|x| against Flax's 5 and 3.04 (RESULTS
  item 72)."""
  compiled, nbytes = _h100_programs("layer", (1, 256, width), dtype)
  k, b = hlo.kernels_and_bytes(compiled[("jaxnorm", "forward")].as_text())
  kf, bf = hlo.kernels_and_bytes(compiled[("flax", "forward")].as_text())
  assert 1 < k <= kf and b <= 1.02 * bf, (k, kf, b / nbytes, bf / nbytes)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_h100_batch_norm_on_a_small_map_costs_flaxs_bytes(dtype):
  """BatchNorm training on a small map (a ResNet's last stages), compiled for an H100:
  the statistics per index of the batch move Flax's bytes within 3 % forward and 1 %
  forward+backward. With one pair of shifts for the whole batch XLA:GPU wrote ``x − a``
  out there: 7.01|x| (float32) and 11.01|x| (bfloat16) forward against Flax's 3.00,
  15.02 and 24.03 against 11.01 and 16.02 forward+backward (RESULTS item 70)."""
  compiled, _ = _h100_programs("batch_train", (8, 14, 14, 512), dtype)
  for program, bound in (("forward", 1.03), ("fwd+bwd", 1.01)):
    _, b = hlo.kernels_and_bytes(compiled[("jaxnorm", program)].as_text())
    _, bf = hlo.kernels_and_bytes(compiled[("flax", program)].as_text())
    assert b <= bound * bf, (program, b / bf)


@pytest.mark.parametrize("shape", [(128, 7, 7, 2048), (256, 14, 14, 1024)])
def test_h100_batch_norm_on_a_large_batch_shifts_the_whole_batch(shape):
  """BatchNorm training over batches above ``gpu.PER_SAMPLE_BATCH`` (64): one pair of
  shifts for the batch, Flax's forward bytes within 1 %. Per sample there, 3.49|x| against
  Flax's 3.08 at 128 × 7 × 7 × 2048 bfloat16 and 3.15 against 3.02 at 256 × 14 × 14 ×
  1024, and on an H200 1.58× and 1.24× Flax's forward time (against 1.05× and 1.02× with
  one pair; RESULTS item 73)."""
  compiled, _ = _h100_programs("batch_train", shape, "bfloat16")
  _, b = hlo.kernels_and_bytes(compiled[("jaxnorm", "forward")].as_text())
  _, bf = hlo.kernels_and_bytes(compiled[("flax", "forward")].as_text())
  assert b <= 1.01 * bf, b / bf


@pytest.mark.parametrize("spec", [P("d"), P(None, None, "d"), P("d", "d2")], ids=str)
def test_h100s_layer_norm_costs_flaxs_per_device_on_a_mesh(spec):
  """LayerNorm over 8 × 512 × 1024 on 4 H100s (2 × 2, automatic sharding), the batch, the
  features or batch and sequence sharded: each device's forward and forward+backward move
  Flax's bytes within 1 % (the shards' four sums, gathered, beside Flax's two) and the step
  takes Flax's collectives. Cut into the mesh's blocks, the rows moved 3.04|x| forward
  against 3.00 with the batch sharded, 3.17 against 3.02 with the features (RESULTS item
  83; XLA:GPU combines the four sums' gathers without them)."""
  mesh = h100_mesh((2, 2), ("d", "d2"))
  progs, _ = programs.compiled("layer", (8, 512, 1024), "float32", NamedSharding(mesh, spec))
  for pass_ in ("forward", "fwd+bwd"):
    (_, b), (_, bf) = (hlo.measure(progs[(lib, pass_)], 1, "gpu") for lib in ("jaxnorm", "flax"))
    assert b <= 1.01 * bf, (pass_, b / bf)
    ours, flax = (
      sum(hlo.count(progs[(lib, pass_)].as_text()).values()) for lib in ("jaxnorm", "flax")
    )
    assert ours <= flax, (pass_, ours, flax)


@pytest.mark.parametrize(
  "kind,shape,dtype",
  [
    ("batch_train", (64, 28, 28, 64), "float32"),
    ("batch_train", (64, 28, 28, 64), "bfloat16"),
    ("instance", (8, 32, 32, 256), "float32"),
  ],
)
def test_h100s_explicitly_batch_sharded_norms_cost_flaxs(kind, shape, dtype):
  """Norms over 4 H100s under explicit sharding with the batch sharded
  (``jax.make_mesh``'s default axis type, data parallel): each device's forward and
  forward+backward move no more than Flax's bytes (1 % aside) with no more collectives.
  BatchNorm: the type says the batch is sharded, and its shifts are sliced per sample
  from the unsharded axes (``router._differentiated``), where the merged sums' variadic
  column reduction XLA:GPU writes out took 2.3× Flax's bytes forward (bfloat16 4.6×).
  InstanceNorm: the type says no reduced axis is sharded, so each device's statistics
  are chosen for the shard it holds (``sharding.crosses_devices``, ``local_shape``), where
  the mesh's form took 3.44|x| against 3.00 and 6 kernels against 2 (RESULTS item 90)."""
  mesh = Mesh(np.array(h100_mesh((4,)).devices), ("d",), axis_types=(AxisType.Explicit,))
  progs, _ = programs.compiled(kind, shape, dtype, NamedSharding(mesh, P("d")))
  for pass_ in ("forward", "fwd+bwd"):
    (_, b), (_, bf) = (hlo.measure(progs[(lib, pass_)], 1, "gpu") for lib in ("jaxnorm", "flax"))
    ours, flax = (
      sum(hlo.count(progs[(lib, pass_)].as_text()).values()) for lib in ("jaxnorm", "flax")
    )
    assert b <= 1.01 * bf and ours <= flax, (pass_, b / bf, ours, flax)


def test_h100s_batch_norm_jitted_with_in_shardings_on_host_arrays(monkeypatch):
  """Flax's ``lm1b`` way: ``jax.jit(step, in_shardings=...)`` called on host arrays, no
  mesh in the types or the context, on a GPU host (traced for GPUs), the batch sharded
  over 4 H100s. BatchNorm's forward takes one collective as Flax's (of the small
  per-sample sums), the step's gradients no more than Flax's, no collective-permute.
  With one pair of shifts for the whole batch: 3 all-reduces and a permute forward
  against Flax's 1, 5 and a permute for the step against 2 (RESULTS item 70)."""
  mesh = h100_mesh((4,), ("data",))
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: "gpu")
  jax.clear_caches()
  x = jax.ShapeDtypeStruct((32, 8, 8, 16), jnp.float32)
  counts = {}
  for lib in (jaxnorm, nn):
    module = lib.BatchNorm(use_running_average=False)
    variables = module.init(jax.random.key(0), jnp.zeros(x.shape))
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), variables["params"])
    replicated = jax.tree.map(lambda _: NamedSharding(mesh, P()), variables["params"])

    def forward(p, x, module=module, variables=variables):
      return module.apply({**variables, "params": p}, x, mutable=["batch_stats"])

    def loss(p, x, forward=forward):
      return jnp.sum(jnp.sin(forward(p, x)[0]))

    for name, fn in (("forward", forward), ("step", jax.value_and_grad(loss))):
      jitted = jax.jit(fn, in_shardings=(replicated, NamedSharding(mesh, P("data"))))
      text = jitted.trace(params, x).lower().compile().as_text()
      counts[lib.__name__, name] = hlo.count(text)
  jax.clear_caches()
  ours, flax = (
    {name: counts[lib, name] for name in ("forward", "step")} for lib in ("jaxnorm", "flax.linen")
  )
  for name in ("forward", "step"):
    assert ours[name]["collective-permute"] == 0, ours
  assert sum(ours["forward"].values()) <= sum(flax["forward"].values()), (ours, flax)
  gradients = sum(ours["step"].values()) - sum(ours["forward"].values())
  assert gradients <= sum(flax["step"].values()) - sum(flax["forward"].values()), (ours, flax)


# Whole training steps compiled for H100s, jaxnorm / Flax's default program today, rounded
# up (RESULTS item 84, results/accelerators/h100_steps.md): (kernels, bytes) on one H100
# and per device with the batch sharded over 4.
H100_STEP_BOUNDS = {  # (kernels, bytes) × Flax's: today's, so a change that costs fails
  ("ResNet50", 1): (1.16, 1.01),  # (1.18 with the merged count: RESULTS item 88)
  ("ResNet50", 4): (1.035, 1.005),  # (1.021 with the blocks' gather checked: item 89)
  ("ResNetStack", 1): (1.08, 1.005),  # (1.109 with the merged count)
  ("UNetStack", 1): (0.97, 1.005),  # (1.0068× the bytes with channels merged: item 87)
  ("UNetStack", 4): (0.98, 1.015),
  ("GPT2Small", 1): (1.0, 0.995),
  ("GPT2Small", 4): (1.0, 0.99),
}


@pytest.mark.parametrize("model,chips", list(H100_STEP_BOUNDS), ids=lambda v: str(v))
def test_h100_training_steps_cost_flaxs(model, chips):
  """The training steps issue 53 names (``tests/models.py``'s ResNet-50, GroupNorm UNet
  and GPT-2 small; the ResNet stage on one H100, within point 4's 1.1× Flax's kernels
  since RESULTS item 88) compiled for one H100 and data parallel over four (automatic
  sharding, ``ShapeDtypeStruct``s with their shardings): each device's kernels and bytes
  (``hlo``'s model) within today's ratios to Flax's, and Flax's collectives (with the
  BatchNorm blocks' gather checked, ResNet-50 took 53 all-reduces and 49 small
  all-gathers against 102 all-reduces: RESULTS item 89)."""
  mesh = h100_mesh((chips,), ("d",))
  batch = P("d") if chips > 1 else None
  got = models.step_costs(model, {"jaxnorm": jaxnorm, "flax": nn}, mesh, "gpu", batch)
  (k, b, c), (kf, bf, cf) = got["jaxnorm"], got["flax"]
  kernels, moved = H100_STEP_BOUNDS[model, chips]
  assert k <= kernels * kf and b <= moved * bf, (k / kf, b / bf)
  assert c == cf, (c, cf)
