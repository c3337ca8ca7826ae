"""What the norms cost under GSPMD (plain ``jit`` over sharded inputs, automatic and
explicit sharding, 8 virtual CPU devices): collectives in the compiled forward and
forward+backward against Flax's in the same test, and conditionals in compiled inference
programs."""

import contextlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from tests import hlo
from tests.devices import tracing_for

SEQ, CNN = (8, 16, 32), (8, 4, 4, 16)
COLLECTIVES = hlo.COLLECTIVES
CASES = [  # (name, constructor per library, shape, layout)
  ("batch", lambda m: m.BatchNorm(use_running_average=False), CNN, P("data")),
  ("batch_eval", lambda m: m.BatchNorm(use_running_average=True), CNN, P("data")),
  ("layer", lambda m: m.LayerNorm(), SEQ, P("data")),
  ("layer_tp", lambda m: m.LayerNorm(), SEQ, P(None, None, "data")),
  ("rms", lambda m: m.RMSNorm(), SEQ, P("data")),
  ("rms_tp", lambda m: m.RMSNorm(), SEQ, P(None, None, "data")),
  ("group", lambda m: m.GroupNorm(num_groups=4), CNN, P("data")),
  ("instance", lambda m: m.InstanceNorm(), CNN, P("data")),
]


def _bytes_moved(text):
  """The bytes of every collective's result in a compiled program (float32/int32 only here)."""
  total = 0
  for line in text.splitlines():
    m = re.search(rf"= (.*?) (?:{'|'.join(COLLECTIVES)})(?:-start)?\(", line)
    if m:
      for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1)):
        total += 4 * int(np.prod([int(d) for d in dims.split(",") if d]))
  return total


def _loss(module, variables):
  """``loss(params, x)``: Σ sin of ``module``'s output (its running statistics mutable)."""
  mutable = ["batch_stats"] if "batch_stats" in variables else False

  def loss(params, x):
    out = module.apply({**variables, "params": params}, x, mutable=mutable)
    return jnp.sum(jnp.sin(out[0] if mutable else out))

  return loss


def _programs(module, x):
  """The compiled forward and forward+backward (w.r.t. parameters and input) of ``module``."""
  variables = module.init(jax.random.key(0), x)
  mutable = ["batch_stats"] if "batch_stats" in variables else False

  def forward(v, x):
    return module.apply(v, x, mutable=mutable)

  def step(v, x):
    return jax.grad(_loss(module, v), argnums=(0, 1))(v["params"], x)

  return [jax.jit(f).lower(variables, x).compile().as_text() for f in (forward, step)]


@pytest.mark.parametrize("mode", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize(
  "name,make,shape,spec",
  [pytest.param(*c, id=c[0]) for c in CASES],
)
def test_no_more_collectives_than_flax_under_gspmd(name, make, shape, spec, mode):
  """Collectives of jaxnorm's programs against Flax's: a merged reduction combines each
  shard's four partial sums in one collective (``jaxnorm._engine.maths.merged_over``:
  stacked, much smaller than x; XLA:CPU gathered them one by one before), and nothing of
  x's size."""
  mesh = jax.make_mesh((8,), ("data",), axis_types=(mode,))
  x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    ours, theirs = _programs(make(jaxnorm), xs), _programs(make(nn), xs)
  for program, a, b in zip(("forward", "forward+backward"), ours, theirs, strict=True):
    got, flax = hlo.count(a, COLLECTIVES), hlo.count(b, COLLECTIVES)
    assert got["collective-permute"] == 0, (program, got)
    gathered = re.findall(r"= f32\[([\d,]*)\]\S* all-gather(?:-start)?\(", a)
    sizes = [int(np.prod([int(d) for d in g.split(",") if d])) for g in gathered]
    # (the stacked sums: 4 per row and shard, x's size only where a shard holds 4 features)
    assert ",".join(map(str, x.shape)) not in gathered and max(sizes, default=0) <= x.size
    if mode == AxisType.Explicit and sum(got.values()) > sum(flax.values()):
      # RMSNorm over a sharded D: Flax's derivative all-gathers x whole, jaxnorm's
      # all-reduces one sum per row (one collective more, a small fraction of the bytes).
      assert 4 * _bytes_moved(a) <= _bytes_moved(b), (program, got, flax)
    else:
      assert sum(got.values()) <= sum(flax.values()), (program, got, flax)


def _legacy(mesh):
  """``with mesh:``, which JAX deprecates (a warning from jax 0.10) but users still write."""
  import contextlib
  import warnings

  stack = contextlib.ExitStack()
  stack.enter_context(warnings.catch_warnings())
  warnings.simplefilter("ignore", DeprecationWarning)
  stack.enter_context(mesh)
  return stack


@pytest.mark.parametrize("context", ["set_mesh", "legacy"])
@pytest.mark.parametrize(
  "name,make,shape,spec", [pytest.param(*c, id=c[0]) for c in CASES if c[0] != "batch_eval"]
)
def test_a_step_jitted_with_in_shardings_under_a_mesh_takes_flaxs_collectives(
  name, make, shape, spec, context
):
  """``jax.jit(step, in_shardings=...)`` on host arrays inside ``jax.set_mesh`` or the
  legacy ``with mesh:``: the step traces unsharded types, and the norms took the
  single-device program, whose checked variance GSPMD split with a conditional and more
  all-reduces than Flax's (inside ``set_mesh`` BatchNorm 3 against 2, LayerNorm, RMSNorm,
  GroupNorm 2 against 1; BatchNorm 5 and a collective-permute under ``with mesh:``). The
  context's mesh now counts as the input's (``platform.mesh_of``): Flax's collectives, no
  conditional."""
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  counts = []
  for lib in (jaxnorm, nn):
    module = make(lib)
    variables = module.init(jax.random.key(0), x)
    step = jax.value_and_grad(_loss(module, variables))
    replicated = jax.tree.map(lambda _: NamedSharding(mesh, P()), variables["params"])
    with jax.set_mesh(mesh) if context == "set_mesh" else _legacy(mesh):
      fn = jax.jit(step, in_shardings=(replicated, NamedSharding(mesh, spec)))
      text = fn.lower(variables["params"], x).compile().as_text()
    counts.append(hlo.count(text, (*COLLECTIVES, "conditional")))
  ours, flax = counts
  assert ours["conditional"] == 0 and sum(ours.values()) <= sum(flax.values()), (ours, flax)


@pytest.mark.parametrize("name,make,shape,spec", [pytest.param(*c, id=c[0]) for c in CASES])
def test_explicit_sharding_outside_set_mesh(name, make, shape, spec):
  """Inputs ``device_put`` onto an explicit mesh (``jax.make_mesh``'s default axis type),
  the step run outside ``jax.set_mesh``, as Flax's norms allow: BatchNorm's training
  ``init`` raised there ("Using PartitionSpec when you are not under a mesh context", from
  the reshard of its stacked sums). Every norm now runs forward and backward with the
  values of the same input on one device."""
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
  x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  module = make(jaxnorm)

  def run(x):
    variables = module.init(jax.random.key(0), x)
    loss = _loss(module, variables)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(variables["params"], x)

  sharded, local = run(jax.device_put(x, NamedSharding(mesh, spec))), run(jnp.asarray(x))
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(local), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "make",
  [
    lambda: jaxnorm.GroupNorm(num_groups=4),
    lambda: jaxnorm.LayerNorm(),
    lambda: jaxnorm.RMSNorm(),
    lambda: jaxnorm.BatchNorm(use_running_average=True),
  ],
  ids=["group", "layer", "rms", "batch_eval"],
)
def test_inference_programs_have_no_conditional(make):
  x = jnp.asarray(np.random.default_rng(0).normal(size=CNN).astype(np.float32))
  module = make()
  variables = module.init(jax.random.key(0), x)
  text = jax.jit(module.apply).lower(variables, x).compile().as_text()
  assert hlo.count(text, ("conditional",)) == {"conditional": 0}


@pytest.mark.parametrize(
  "make",
  [
    lambda: jaxnorm.InstanceNorm(),
    lambda: jaxnorm.BatchNorm(use_running_average=False),
    lambda: jaxnorm.LayerNorm(reduction_axes=(1, 2, 3)),
  ],
  ids=["instance", "batch_train", "layer_hwc"],
)
def test_accelerator_programs_have_no_conditional(make):
  """Lowered for GPUs and TPUs (no device needed), the forward takes the shifted sums, no
  ``lax.cond``; XLA:CPU keeps its checked sums' conditional (the fastest forward there),
  which shows that the count below sees a conditional where there is one."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=CNN).astype(np.float32))
  module = make()
  variables = module.init(jax.random.key(0), x)
  forward = jax.jit(lambda v, x: module.apply(v, x, mutable=["batch_stats"]))

  def conditionals(platform, lowered_for):  # (a lax.cond's predicate, turned into an index)
    with tracing_for(platform):
      traced = forward.trace(variables, x)
    text = traced.lower(lowering_platforms=(lowered_for,)).as_text()
    return text.count("(tensor<i1>) -> tensor<i32>")

  assert conditionals("cpu", "cpu") == 1
  assert conditionals("gpu", "cuda") == conditionals("gpu", "rocm") == 0
  assert conditionals("tpu", "tpu") == 0


@pytest.mark.parametrize("mode", ["device_put", "set_mesh", "in_shardings"])
@pytest.mark.parametrize("name", ["batch", "layer", "group"])
def test_nnx_jit_takes_flaxs_collectives(name, mode):
  """``nnx.jit`` (issue 53, point 3) of jaxnorm.nnx's norms, forward and a
  ``value_and_grad`` step, batch sharded over 8 devices: inputs put on the mesh, the same
  inside ``jax.set_mesh``, or host arrays with ``in_shardings`` inside ``jax.set_mesh``:
  Flax's collectives and no conditional. (Host arrays with ``in_shardings`` and no mesh
  in sight take the host platform's form: on XLA:CPU BatchNorm's step then takes 4
  all-reduces and a permute against 2, a known limit; RESULTS item 76.)"""
  from flax import nnx

  from jaxnorm import nnx as jnnx

  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  shape = SEQ if name == "layer" else CNN
  x = np.random.default_rng(0).normal(2.0, 1.0, shape).astype(np.float32)
  data = NamedSharding(mesh, P("data"))

  def make(lib):
    rngs = nnx.Rngs(0)
    if name == "batch":
      return lib.BatchNorm(shape[-1], rngs=rngs)
    if name == "group":
      return lib.GroupNorm(shape[-1], num_groups=4, rngs=rngs)
    return lib.LayerNorm(shape[-1], rngs=rngs)

  def step(model, x):
    return nnx.value_and_grad(lambda model: jnp.sum(jnp.sin(model(x))))(model)

  counts = {}
  for lib in (jnnx, nnx):
    for fn in (lambda m, x: m(x), step):
      with jax.set_mesh(mesh) if mode != "device_put" else contextlib.nullcontext():
        if mode == "in_shardings":
          lowered = nnx.jit(fn, in_shardings=(None, data)).lower(make(lib), x)
        else:
          lowered = nnx.jit(fn).lower(make(lib), jax.device_put(x, data))
        text = lowered.compile().as_text()
      counts.setdefault(lib.__name__, []).append(hlo.count(text, (*COLLECTIVES, "conditional")))
  ours, flax = counts["jaxnorm.nnx"], counts["flax.nnx"]
  assert ours == flax, (ours, flax)
