"""jaxnorm's and Flax's programs compiled for TPUs and H100s without a device (issue 43).

Every norm's forward and forward+backward (``tests/programs.py``'s programs), compiled for a
TPU generation (libtpu's ``jax.experimental.topologies``) or an H100 (the CUDA plugin and
XLA's target description, ``tests/devices.py``), and counted by ``tests/hlo.py``: kernels
(top-level operations other than bookkeeping; on GPUs every launch of the entry computation
and of its loops and conditionals) and bytes over |x| (XLA's ``cost_analysis`` on TPUs; on
GPUs, whose cost analysis needs a device, the bytes model: every kernel's operands read and
results written, a sliced operand counted as its slices). Columns: jaxnorm / Flax's default
(``E[x²] − E[x]²``) / Flax's ``use_fast_variance=False`` (two passes); ``*`` marks a
jaxnorm program with more kernels or bytes than Flax's default, ``**`` one with more than
Flax's two-pass program too.

``--modern`` compiles the adaptive norms, DyT and Batch Renorm instead; ``--stacks`` the
model stacks (``tests/models.py``), with lower and compile times; ``--steps`` their
training steps on one chip and data parallel over four, per device against Flax's default
and exact programs; ``--sharded`` the layouts
of issue 43's point 2 on a 4-chip mesh, counting collectives and all-gathers of x
(automatic sharding; ``--explicit``, explicit sharding, whose types say the layout);
``--pallas`` (GPUs) jaxnorm's Pallas row kernels beside its XLA path at the device suite's
training shapes, against the least traffic of each pass.

  pip install "jax[tpu]==<jax's version>"            # libtpu, no TPU needed
  R=benchmarks/results/accelerators
  PYTHONPATH=. python benchmarks/accelerator_programs.py --topology v5e:2x2 > $R/tpu_v5e.md
  PYTHONPATH=. python benchmarks/accelerator_programs.py --topology v6e:2x2 > $R/tpu_v6e.md
  PYTHONPATH=. python benchmarks/accelerator_programs.py --modern > $R/tpu_v5e_modern.md
  PYTHONPATH=. python benchmarks/accelerator_programs.py --sharded > $R/tpu_v5e_sharded.md
  PYTHONPATH=. python benchmarks/accelerator_programs.py --sharded --explicit \
      > $R/tpu_v5e_sharded_explicit.md
  PYTHONPATH=. python benchmarks/accelerator_programs.py --stacks > $R/tpu_v5e_stacks.md
  PYTHONPATH=. python benchmarks/accelerator_programs.py --steps > $R/tpu_v5e_steps.md

  # H100s: the CUDA plugin (no GPU needed), in a venv of its own
  pip install "jax-cuda12-plugin[with-cuda]==<jax's version>" "jax-cuda12-pjrt==<same>"
  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu PYTHONPATH=. python \\
      benchmarks/accelerator_programs.py --platform gpu [--modern | --sharded [--explicit] |
      --stacks | --steps | --pallas] > $R/h100[_modern | _sharded[_explicit] | _stacks |
      _steps | _pallas].md
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import sys
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # (several runs at once share libtpu)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxnorm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_norms  # noqa: E402 (floor_kernels, the least traffic of a pass)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import devices, models, programs  # noqa: E402 (the tests' programs and counts)
from tests.hlo import count, kernels, kernels_and_bytes, measure  # noqa: E402
from tests.programs import LIBS, forward_backward, renorm_by_hand  # noqa: E402

ROWS = [(16, 512, 768), (4, 1024, 4096), (2, 1024, 8192), (8192, 768), (4096, 4096)]
CASES = [  # (norm, shape): issue 43's shapes users train with
  *((k, s) for s in ROWS for k in ("layer", "rms")),
  *((k, s) for s in ROWS[:2] for k in ("add_layer", "add_rms", "batch_train")),
  ("layer", (8, 256, 1152)),  # DiT
  *(
    (k, s) for s in ((256, 56, 56, 64), (256, 14, 14, 1024)) for k in ("batch_train", "batch_eval")
  ),
  *(("group", s) for s in ((8, 64, 64, 320), (32, 32, 32, 512))),
  ("instance", (32, 64, 64, 128)),
  ("layer", (32, 28, 28, 256)),  # LayerNorm over (H, W, C)
]


def abstract(tree, mesh: Mesh):
  """``tree``'s arrays as shapes and dtypes, replicated over ``mesh`` (nothing to hold)."""
  return programs.abstract(tree, NamedSharding(mesh, P()))


def table(mesh: Mesh, platform: str, dtypes=("bfloat16", "float32")):
  """Prints the per-norm table and returns the geometric means of fwd+bwd bytes."""
  print(
    "| norm | shape | dtype | forward kernels | forward bytes | fwd+bwd kernels | fwd+bwd bytes |"
  )
  print("|---|---|---|---|---|---|---|")
  ratios: list[float] = []
  replicated = NamedSharding(mesh, P())
  for kind, shape in CASES:
    for dtype in dtypes:
      progs, nbytes = programs.compiled(kind, shape, dtype, replicated)
      cells = []
      for pass_ in ("forward", "fwd+bwd"):
        got = {
          lib: measure(progs[(lib, pass_)], nbytes, platform)
          for lib in LIBS
          if (lib, pass_) in progs
        }
        two = got.get("flax2", got["flax"])
        (k, b), (kf, bf) = got["jaxnorm"], got["flax"]
        flag = ""  # (* above Flax's default program, ** above its two-pass one too)
        if k > kf or b > 1.005 * bf:
          flag = " **" if k > two[0] or b > 1.005 * two[1] else " *"
        cells.append(" / ".join(str(k) for k, _ in got.values()))
        cells.append(" / ".join(f"{b:.2f}" for _, b in got.values()) + flag)
        if pass_ == "fwd+bwd":
          ratios.append(got["jaxnorm"][1] / got["flax"][1])
      shape_text = "×".join(map(str, shape))
      print(f"| {kind} | {shape_text} | {dtype} | " + " | ".join(cells) + " |", flush=True)
  mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
  print(
    f"\nfwd+bwd bytes, geometric mean of jaxnorm / Flax over {len(ratios)} cases: **{mean:.3f}**"
  )
  return mean


def modern(mesh: Mesh, platform: str):
  """The adaptive norms and DyT (jaxnorm against Flax's LayerNorm or RMSNorm, then the
  modulation, and the hand-written two-pass ``jnp`` form, :mod:`bench_modern`) and Batch
  Renorm's training step (against Flax's BatchNorm's); ** flags a program above the first
  form after jaxnorm's (Flax's where there is one)."""
  import bench_modern  # noqa: PLC0415

  print(
    "| norm | shape | dtype | forward kernels | forward bytes | fwd+bwd kernels | fwd+bwd bytes |"
  )
  print("|---|---|---|---|---|---|---|")
  rng = np.random.default_rng(0)

  rows = [(k, s) for k in ("adaln", "adarms", "dyt") for s in bench_modern.SHAPES.values()]
  for kind, shape in [*rows, ("renorm", (256, 56, 56, 64))]:
    for dtype in ("bfloat16", "float32"):
      dt = jnp.dtype(dtype)
      x = abstract(jax.ShapeDtypeStruct(shape, dt), mesh)
      if kind == "renorm":
        forms = {}
        for name, module in (
          ("jaxnorm", jaxnorm.BatchRenorm(use_running_average=False, dtype=dt)),
          ("flax", nn.BatchNorm(use_running_average=False, dtype=dt)),
        ):  # fmt: skip
          variables = abstract(jax.eval_shape(module.init, jax.random.key(0), x), mesh)
          rest = {k: v for k, v in variables.items() if k != "params"}
          forms[name] = (
            lambda p, x, _, m=module: m.apply({**p[1], "params": p[0]}, x, mutable=list(p[1]))[0],
            (variables["params"], rest),
          )
        forms["by hand"] = (renorm_by_hand, forms["jaxnorm"][1])
      else:
        params = abstract(bench_modern.params_for(kind, shape, rng), mesh)
        written = bench_modern.forms(kind)
        forms = {n: (written[n], params) for n in ("jaxnorm", "flax", "jnp") if n in written}
      cells = []
      for pass_ in ("forward", "fwd+bwd"):
        got = []
        for fn, params in forms.values():
          f = fn if pass_ == "forward" else forward_backward(fn)
          args = (params, x, None) if pass_ == "forward" else (params, x, None, x)
          got.append(
            measure(jax.jit(f).lower(*args).compile(), math.prod(shape) * dt.itemsize, platform)
          )
        flag = " **" if got[0][0] > got[1][0] or got[0][1] > 1.005 * got[1][1] else ""
        cells += [" / ".join(str(k) for k, _ in got), " / ".join(f"{b:.2f}" for _, b in got) + flag]
      print(
        f"| {kind} | {'×'.join(map(str, shape))} | {dtype} | " + " | ".join(cells) + " |",
        flush=True,
      )


SHARDED = [  # (norm, shape, layout) on 4 chips: issue 43's point 2
  ("batch_train", (64, 28, 28, 64), P("d")),  # batch
  ("batch_train", (64, 28, 28, 64), P(None, None, None, "d")),  # features
  ("layer", (8, 512, 1024), P("d")),  # batch
  ("layer", (8, 512, 1024), P(None, None, "d")),  # features
  ("layer", (8, 512, 1024), P("d", "d2")),  # batch + sequence
  ("rms", (8, 512, 1024), P("d", "d2")),
  ("group", (8, 32, 32, 256), P("d", "d2")),  # batch + H
  ("instance", (8, 32, 32, 256), P("d")),
  ("layer", (16, 1024, 4096), P(("d", "d2"))),  # batch over 4 chips: Transformer-sized rows
  ("batch_train", (64, 28, 28, 64), P("d", "d2")),  # batch + H (spatial partitioning)
]


def sharded(mesh2: Mesh, platform: str = "tpu"):
  """Collectives of each layout's programs, and each device's kernels and bytes over its
  shard of x, jaxnorm / Flax."""
  print("| norm | shape | layout | forward collectives | fwd+bwd collectives | all-gathers of x "
        "| forward kernels, bytes per device | fwd+bwd kernels, bytes per device |")  # fmt: skip
  print("|---|---|---|---|---|---|---|---|")
  for kind, shape, spec in SHARDED:
    sharding = NamedSharding(mesh2, spec)
    progs, nbytes = programs.compiled(kind, shape, "float32", sharding)
    shard = nbytes * math.prod(sharding.shard_shape(shape)) // math.prod(shape)
    cells, costs, gathers = [], [], 0
    for pass_ in ("forward", "fwd+bwd"):
      counts = [sum(count(progs[(lib, pass_)].as_text()).values()) for lib in ("jaxnorm", "flax")]
      flag = " **" if counts[0] > counts[1] else ""
      cells.append(f"{counts[0]} / {counts[1]}{flag}")
      each = [measure(progs[(lib, pass_)], shard, platform) for lib in ("jaxnorm", "flax")]
      worse = " **" if each[0][0] > each[1][0] or each[0][1] > 1.005 * each[1][1] else ""
      costs.append(f"{each[0][0]} / {each[1][0]}, {each[0][1]:.2f} / {each[1][1]:.2f}{worse}")
      size = "x".join(map(str, shape))
      gathers += len(
        re.findall(
          rf"f32\[{size.replace('x', ',')}\][^ ]* all-gather", progs[("jaxnorm", pass_)].as_text()
        )
      )
    print(
      f"| {kind} | {'×'.join(map(str, shape))} | {spec} | " + " | ".join(cells)
      + f" | {gathers} | " + " | ".join(costs) + " |",
      flush=True,
    )  # fmt: skip


def stacks(mesh: Mesh, platform: str, repeats: int = 7):
  """The model stacks' table (``tests/models.py``'s UNet, ResNet stage, Transformer and
  ResNet-50; inference and training step): jaxnorm against Flax, fusions, kernels
  (:func:`kernels_and_bytes` on GPUs, :func:`kernels` on TPUs), jaxnorm's
  conditionals and the medians of interleaved lower and compile times (caches cleared:
  what a new shape costs), issue 53's point 2."""
  count_kernels = (lambda t: kernels_and_bytes(t)[0]) if platform == "gpu" else kernels

  print("| model | program | fusions | kernels | conditionals | lower s | compile s | ratio |")
  print("|---|---|---|---|---|---|---|---|")
  for name, cls, shape in models.MODELS:
    libs = {"jaxnorm": jaxnorm, "flax": nn}
    progs = {k: models.programs(cls, lib, shape) for k, lib in libs.items()}
    for program in ("inference", "training"):
      times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in libs}
      texts = {}
      for i in range(repeats):
        for k in list(libs)[:: 1 if i % 2 == 0 else -1]:
          f, v, x = progs[k][program]
          jax.clear_caches()
          start = time.perf_counter()
          lowered = jax.jit(f).lower(abstract(v, mesh), abstract(x, mesh))
          mid = time.perf_counter()
          texts[k] = lowered.compile().as_text()
          times[k][0].append(mid - start)
          times[k][1].append(time.perf_counter() - mid)
      low, comp = ({k: float(np.median(times[k][j])) for k in libs} for j in (0, 1))
      fusions = {k: len(re.findall(r"\sfusion\(", t)) for k, t in texts.items()}
      launched = {k: count_kernels(t) for k, t in texts.items()}
      ratio = (low["jaxnorm"] + comp["jaxnorm"]) / (low["flax"] + comp["flax"])
      cells = (
        [f"{d['jaxnorm']} / {d['flax']}" for d in (fusions, launched)]
        + [str(texts["jaxnorm"].count(" conditional("))]
        + [f"{d['jaxnorm']:.3f} / {d['flax']:.3f}" for d in (low, comp)]
      )
      print(f"| {name} | {program} | " + " | ".join(cells) + f" | {ratio:.2f} |", flush=True)


def steps(platform: str, topology: str = "v5e:2x2"):
  """Whole training steps of every model in ``tests/models.py`` on one chip and data
  parallel over 4 (the batch sharded, the variables replicated, shapes with their
  shardings): each device's kernels and bytes (``models.step_costs``), jaxnorm over
  Flax's default and over its exact program (``use_fast_variance=False``), and the
  collectives of each (issue 53's point 4)."""
  chips4 = devices.tpu_mesh(topology, 4).devices if platform == "tpu" else devices.h100_devices(4)
  libs = {"jaxnorm": jaxnorm, "flax": nn, "exact": models.flax_exact()}
  print("| model | chips | kernels | × Flax | × exact | bytes × Flax | × exact "
        "| collectives jaxnorm / Flax |")  # fmt: skip
  print("|---|---|---|---|---|---|---|---|")
  for name, cls, _ in models.MODELS:
    for chips in (1, 4):
      mesh = Mesh(np.array(list(chips4)[:chips]), ("d",))
      batch = P("d") if chips > 1 else None
      got = models.step_costs(cls.__name__, libs, mesh, platform, batch)
      (kj, bj, cj), (kf, bf, cf), (ke, be, _) = got.values()
      print(f"| {name} | {chips} | {kj} / {kf} / {ke} | {kj / kf:.3f} | {kj / ke:.3f} "
            f"| {bj / bf:.4f} | {bj / be:.4f} | {sum(cj.values())} / {sum(cf.values())} |",
            flush=True)  # fmt: skip


# The Pallas row kernels against XLA (issue 55): the suite's training shapes and the
# issue's (1024 × 1024, 32768 × 2048, 4096 × 16384).
PALLAS_CASES = [
  *((k, s, d) for d in ("bfloat16", "float32") for k, s in (
    ("rms", (8192, 4096)), ("layer", (16384, 768)), ("add_rms", (8192, 4096)),
    ("layer", (1024, 1024)), ("layer", (32768, 2048)), ("layer", (4096, 16384)),
  )),
]  # fmt: skip


def _row_norm(kind, implementation, dtype):
  """A row norm of its input(s) and parameters (γ, and β for LayerNorm), its output in
  the activations' ``dtype`` (float32 parameters)."""
  kw = dict(implementation=implementation, dtype=dtype)
  if kind == "rms":
    return lambda x, g: jaxnorm.rms_norm(x, g, **kw)
  if kind == "add_rms":
    return lambda x, r, g: jaxnorm.add_rms_norm(x, r, g, **kw)
  return lambda x, g, b: jaxnorm.layer_norm(x, g, b, **kw)


def pallas(mesh):
  """jaxnorm's Pallas row kernels and its XLA path compiled for the H100: kernels (Triton
  custom calls among them) and the bytes model, against the least traffic of the pass
  (:func:`bench_norms.floor_kernels`' credit, in |x|)."""
  print("| norm | shape | dtype | pass | XLA kernels | XLA bytes | Pallas kernels (Triton) "
        "| Pallas bytes | least traffic |")  # fmt: skip
  print("|---|---|---|---|---|---|---|---|---|")
  for kind, shape, dtype in PALLAS_CASES:
    dt = jnp.dtype(dtype)
    x, cot = jax.eval_shape(functools.partial(programs.inputs, kind, shape, dt))
    d = shape[-1]
    params = [jax.ShapeDtypeStruct((d,), jnp.float32)] * (2 if kind == "layer" else 1)
    inputs = [*(x if isinstance(x, tuple) else (x,)), *params]
    x_bytes = shape[0] * d * dt.itemsize
    floors = {p: sum(b for _, _, b in k) for p, k in bench_norms.floor_kernels(x, cot).items()}
    for pass_ in ("forward", "fwd+bwd"):
      cells = []
      for impl in ("xla", "pallas"):
        f = _row_norm(kind, impl, dt)
        if pass_ == "forward":
          fn = f
          args = inputs
        else:

          def fn(*a, f=f):
            *primals, ct = a
            y, vjp = jax.vjp(f, *primals)
            return y, vjp(ct)

          args = [*inputs, cot]
        text = jax.jit(fn).lower(*abstract(args, mesh)).compile().as_text()
        launched, moved = kernels_and_bytes(text)
        triton = text.count('custom_call_target="__gpu$xla.gpu.triton"')
        cells += [f"{launched}" + (f" ({triton})" if impl == "pallas" else ""),
                  f"{moved / x_bytes:.2f}"]  # fmt: skip
      shape_text = "×".join(map(str, shape))
      print(f"| {kind} | {shape_text} | {dtype} | {pass_} | " + " | ".join(cells)
            + f" | {floors[pass_] / x_bytes:.2f} |", flush=True)  # fmt: skip


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--platform", choices=("tpu", "gpu"), default="tpu")
  parser.add_argument("--topology", default="v5e:2x2")
  parser.add_argument("--sharded", action="store_true")
  parser.add_argument("--explicit", action="store_true", help="(--sharded) explicit sharding")
  parser.add_argument("--modern", action="store_true")
  parser.add_argument("--stacks", action="store_true")
  parser.add_argument("--steps", action="store_true")
  parser.add_argument("--repeats", type=int, default=7, help="(--stacks) interleaved pairs")
  parser.add_argument("--pallas", action="store_true", help="(--platform gpu)")
  args = parser.parse_args()
  versions = f"jax {jax.__version__}, flax {__import__('flax').__version__}"
  if args.sharded:
    if args.platform == "tpu":
      chips = devices.tpu_mesh(args.topology, 4).devices
    else:
      chips = np.array(devices.h100_devices(4))
    kind = AxisType.Explicit if args.explicit else AxisType.Auto
    mesh2 = Mesh(chips.reshape(2, 2), ("d", "d2"), axis_types=(kind,) * 2)
    where = args.topology if args.platform == "tpu" else "4 × H100"
    sharding = f"{kind.name.lower()} sharding"
    print(f"# Collectives on a 4-chip {where}, {sharding}, jaxnorm / Flax ({versions})\n")
    return sharded(mesh2, args.platform)
  mesh = (
    devices.tpu_mesh(args.topology)
    if args.platform == "tpu"
    else Mesh(np.array(devices.h100_devices()), ("d",))
  )
  if args.pallas:
    if args.platform != "gpu":
      parser.error("--pallas compiles the GPU row kernels: add --platform gpu")
    print(
      f"# {mesh.devices.flat[0].device_kind}: Pallas row kernels and the XLA path ({versions})\n"
    )
    print("Kernels (Triton calls among them) and bytes over |x|; the least traffic of each pass:")
    print("bench_norms.floor_kernels' credit.\n")
    return pallas(mesh)
  if args.steps:
    print(f"# {mesh.devices.flat[0].device_kind}: whole training steps per device ({versions})\n")
    print("Kernels jaxnorm / Flax / Flax exact (``use_fast_variance=False``), bytes (XLA's cost")
    print("analysis on TPUs, the bytes model on GPUs) as ratios; 4 chips: the batch sharded.\n")
    return steps(args.platform, args.topology)
  if args.stacks:
    print(f"# {mesh.devices.flat[0].device_kind}: model stacks, jaxnorm / Flax ({versions})\n")
    print("Fusions (every fusion instruction), kernels, jaxnorm's conditionals, medians of")
    print("interleaved lower and compile times (s, caches cleared), ratio of their sums.\n")
    return stacks(mesh, args.platform, args.repeats)
  if args.modern:
    print(f"# {mesh.devices.flat[0].device_kind}: modern norms ({versions})\n")
    print("jaxnorm / Flax's norm, then the modulation / the hand-written two-pass form; DyT")
    print("jaxnorm / its jnp form; Batch Renorm's training step against Flax's BatchNorm's and")
    print("Batch Renorm written by hand on Flax's one-pass statistics (renorm_by_hand).\n")
    return modern(mesh, args.platform)
  print(f"# {mesh.devices.flat[0].device_kind}: jaxnorm / Flax / Flax two-pass ({versions})\n")
  print("Kernels: top-level operations other than bookkeeping; bytes over |x|.\n")
  table(mesh, args.platform)


if __name__ == "__main__":
  main()
