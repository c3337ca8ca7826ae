"""The routing of the statistics (``docs/development.md``'s table): platform × mask × mesh ×
differentiation → the algorithm, read from the traced program; each norm traced in one
platform's form only; ``lax.platform_dependent`` called by the platform switch alone."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from tests import reference
from tests.devices import tracing_for

PACKAGE = pathlib.Path(jaxnorm.__file__).parent

# What each algorithm leaves in the jaxpr: XLA:CPU's checked sums a lax.cond, the merged
# shifted sums a reduce with its own combiner, XLA:CPU's kernel its fusion barriers.
MARKS = {
  "checked": lambda t: " cond[" in t,
  "merged": lambda t: re.search(r"\breduce\[", t) is not None,
  "barrier": lambda t: "optimization_barrier" in t,
}

# (norm, platform, masked, on a mesh, differentiated) -> the marks the program carries.
# Columns: BatchNorm over (N, H, W), InstanceNorm over (H, W); rows: LayerNorm over the last axis.
# fmt: off
ROUTES = [
  # XLA:CPU, one device: checked Σx ∥ Σx² forward, sums shifted by two elements under
  # differentiation, two passes over rows; its fusion barriers in every derivative.
  ("batch", "cpu", False, False, False, {"checked", "barrier"}),
  ("batch", "cpu", False, False, True, {"barrier"}),
  ("layer", "cpu", False, False, False, set()),
  ("layer", "cpu", False, False, True, {"barrier"}),
  # On a mesh, every platform: the merged shifted sums (GSPMD partitions them exactly).
  ("batch", "cpu", False, True, False, {"merged"}),
  ("batch", "cpu", False, True, True, {"merged"}),
  ("layer", "cpu", False, True, True, {"merged"}),
  # TPUs: the merged sums.
  ("batch", "tpu", False, False, False, {"merged"}),
  ("batch", "tpu", False, False, True, {"merged"}),
  ("layer", "tpu", False, False, False, {"merged"}),
  ("layer", "tpu", False, False, True, {"merged"}),
  # GPUs: column sums shifted by two elements (over batches of up to 64 per sample, the
  # samples merged: RESULTS items 70, 73); rows in two passes forward (one kernel), merged under
  # differentiation; on a mesh the columns merged over the first axis.
  ("batch", "gpu", False, False, False, {"merged"}),
  ("batch", "gpu", False, False, True, {"merged"}),
  ("instance", "gpu", False, False, False, set()),
  ("instance", "gpu", False, False, True, set()),
  ("batch", "gpu", False, True, True, {"merged"}),
  ("layer", "gpu", False, False, False, set()),
  ("layer", "gpu", False, False, True, {"merged"}),
  # Masks, every platform: two passes over the valid elements (and the CPU kernel's rule).
  *((n, p, True, False, d, {"barrier"} if p == "cpu" and d else set())
    for n in ("batch", "layer") for p in ("cpu", "gpu", "tpu") for d in (False, True)),
]
# fmt: on


def _norm(name, x, mask):
  if name == "batch":
    return jaxnorm.batch_norm(x, mask=mask)[0]
  if name == "instance":
    return jaxnorm.instance_norm(x, mask=mask)
  return jaxnorm.layer_norm(x, mask=mask)


def _jaxpr(name, platform, masked, mesh, differentiated, monkeypatch):
  monkeypatch.setattr(jaxnorm._engine.platform, "traced_for", lambda x=None: platform)
  jax.clear_caches()  # (JAX keeps what was traced for another platform)
  x = np.random.default_rng(0).normal(2.0, 1.0, (8, 4, 4, 16)).astype(np.float32)
  mask = None if not masked else x > 1.0
  if mesh is not None:
    x = jax.device_put(x, NamedSharding(mesh, P("d")))

  def fn(x):
    return jnp.sum(jnp.sin(_norm(name, x, mask)))

  try:
    return str(jax.make_jaxpr(jax.grad(fn) if differentiated else fn)(x))
  finally:
    jax.clear_caches()


@pytest.mark.parametrize(
  "name,platform,masked,on_mesh,differentiated,marks",
  ROUTES,
  ids=[
    f"{n}-{p}-{'mask' if m else 'nomask'}-{'mesh' if o else 'one'}-{'grad' if d else 'fwd'}"
    for n, p, m, o, d, _ in ROUTES
  ],
)
def test_route(name, platform, masked, on_mesh, differentiated, marks, monkeypatch):
  """Each route takes its algorithm, traced in its platform's form alone (no
  ``platform_index``: no other platform's form is in the program)."""
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,)) if on_mesh else None
  text = _jaxpr(name, platform, masked, mesh, differentiated, monkeypatch)
  assert "platform_index" not in text
  assert {mark for mark, found in MARKS.items() if found(text)} == marks


def test_platform_dependent_only_in_the_switch():
  """``lax.platform_dependent`` (which traces every branch) is called in
  ``jaxnorm/_engine/platform.py`` alone: every other choice of a platform goes through its
  :func:`~jaxnorm._engine.platform.switch`, which the tests patch."""
  callers = sorted(
    p.relative_to(PACKAGE).as_posix()
    for p in PACKAGE.rglob("*.py")
    if "platform_dependent(" in p.read_text(encoding="utf-8")
  )
  assert callers == ["_engine/platform.py"]


def test_traced_for_reads_the_mesh_then_the_default_backend():
  """The platform a program is traced for: the default backend with no mesh; a context's
  abstract device (JAX's "traced for") and an input's mesh win over it."""
  x = jnp.ones((4, 8))
  assert jaxnorm._engine.platform.traced_for(x) == jax.default_backend() == "cpu"
  with tracing_for("tpu"):
    assert jaxnorm._engine.platform.traced_for(x) == "tpu"
  with tracing_for("gpu"):
    assert jaxnorm._engine.platform.traced_for(None) == "gpu"
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Explicit,))
  sharded = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P("d")))
  seen = []
  jax.jit(lambda x: seen.append(jaxnorm._engine.platform.traced_for(x)) or x).trace(sharded)
  assert seen == ["cpu"]


def test_a_norm_exported_for_a_platform_it_was_not_traced_for_is_still_exact(rng):
  """Traced for XLA:CPU (the default backend) and exported for TPUs, the program carries
  XLA:CPU's form, whose statistics are as exact: the TPU-traced export's output and the
  float64 reference agree with it, where the forms differ (a lax.cond on the CPU's)."""
  x = rng.normal(1e4, 1.0, (16, 6)).astype(np.float32)
  spec = jax.ShapeDtypeStruct(x.shape, x.dtype)

  def fn(x):
    return jaxnorm.batch_norm(x)[0]

  cpu_form = jax.export.export(jax.jit(fn), platforms=("tpu", "cpu"))(spec)
  with tracing_for("tpu"):
    tpu_form = jax.export.export(jax.jit(fn), platforms=("tpu", "cpu"))(spec)
  assert "stablehlo.case" in cpu_form.mlir_module()  # (the checked sums' conditional)
  assert "stablehlo.case" not in tpu_form.mlir_module()
  y64 = (x - x.astype(np.float64).mean(0)) / np.sqrt(x.astype(np.float64).var(0) + 1e-5)
  for exported in (cpu_form, tpu_form):
    np.testing.assert_allclose(exported.call(x), y64, atol=2e-3)


def test_every_platform_choice_is_in_the_decisions_table():
  """Each ``switch(`` / ``every_platform(`` call site in the package (function by
  function) is a row of ``docs/development.md``'s decisions table, which names its figure
  and the test that guards it; a row without a call site is stale."""
  sites = set()
  for path in PACKAGE.rglob("*.py"):
    if path == PACKAGE / "_engine" / "platform.py":
      continue
    function = None
    for line in path.read_text(encoding="utf-8").splitlines():
      if m := re.match(r"def (\w+)\(", line):
        function = m.group(1)
      if re.search(r"\b(switch|every_platform)\(", line) and not line.lstrip().startswith("def "):
        sites.add(f"{path.stem}.{function}")
  docs = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
  table = docs[docs.index("### Decisions") :].split("\n\n")[2]
  rows = {re.match(r"\| `(\w+\.\w+)", row).group(1) for row in table.splitlines()[2:]}
  assert sites == rows


def test_the_routers_docstring_names_functions_that_exist():
  """The router's docstring is the routing table: every ``(file: function)`` it names
  exists in that file of the engine, so the table cannot drift from the code."""
  import importlib

  from jaxnorm._engine import router

  named = [m for m in re.findall(r"\((\w+): (\w+)", router.__doc__) if m != ("file", "function")]
  assert len(named) >= 10
  for module, function in named:
    engine_file = importlib.import_module(f"jaxnorm._engine.{module}")
    assert hasattr(engine_file, function), (module, function)


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_channel_groups_alone_on_every_platform(platform, rng):
  """A GroupNorm of (batch, channels) reduces over no axis but its channel groups: every
  platform's route takes it (XLA:GPU's column statistics once indexed the first reduced
  axis, which it has none of), as the float64 reference at 1e3 ± 1, with a finite
  gradient."""
  x = rng.normal(1e3, 1.0, (16, 32)).astype(np.float32)
  with tracing_for(platform):
    y = jax.jit(lambda x: jaxnorm.group_norm(x, num_groups=4))(x)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(jaxnorm.group_norm(x, num_groups=4)))))(x)
  x64 = x.astype(np.float64).reshape(16, 4, 8)
  y64 = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(y, y64.reshape(16, 32), atol=2e-4)
  assert np.isfinite(grad).all()


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_long_rows_on_every_platform(platform, rng):
  """A LayerNorm over rows longer than ``gpu.FUSED_ROW`` takes the merged sums on GPUs
  forward (RESULTS item 72), as the float64 reference at 1e4 ± 1 (the plain ``E[x²] −
  E[x]²`` in float32 is off by the whole variance there), with its gradient finite."""
  x = rng.normal(1e4, 1.0, (3, 8193)).astype(np.float32)
  with tracing_for(platform):
    y = jax.jit(jaxnorm.layer_norm)(x)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(jaxnorm.layer_norm(x)))))(x)
  np.testing.assert_allclose(y, reference.layer_norm(x), atol=2e-3)
  assert np.isfinite(grad).all()
