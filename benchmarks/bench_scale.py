"""What jaxnorm costs where users scale, against Flax, in one process (issue 33).

Tables, each a jaxnorm/Flax ratio per case (interleaved runs, medians):

- ``eager``: one un-jitted call of each Linen and NNX module (a notebook, a debugger), the
  modules' training and inference calls;
- ``compile``: lowering and compiling the inference and training programs of three small
  models (a GroupNorm UNet block stack, a ResNet-style BatchNorm stack, a Pre-LN
  Transformer) and a ResNet-50, with the compiled program's fusions and conditionals;
- ``collectives``: all-reduces, all-gathers and collective-permutes in the compiled forward
  and forward+backward of each norm under GSPMD on 8 virtual CPU devices (plain ``jit``,
  the batch sharded, and the features sharded for tensor-parallel LayerNorm/RMSNorm), in
  automatic and explicit sharding;
- ``reads``: XLA:CPU's bytes accessed per norm (forward, forward+backward) over |x|, with
  the forward's fusions and conditionals, on one device;
- ``resnet50``: the collectives of a whole ResNet-50 training step, the batch sharded.

  python benchmarks/bench_scale.py [--only eager,compile,collectives,reads,resnet50]
                                   [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxnorm  # noqa: E402
import jaxnorm.nnx as jnnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_norms import timed  # noqa: E402 (the one interleaved timer)
from tests import hlo  # noqa: E402 (one counter, the tests' own)
from tests.models import CNN, MODELS, SEQ, ResNet50, programs  # noqa: E402

# --- eager calls -------------------------------------------------------------------------

LINEN = [  # (name, constructor per library, shape, call kwargs)
  ("BatchNorm train", lambda m: m.BatchNorm(use_running_average=False), CNN),
  ("BatchNorm eval", lambda m: m.BatchNorm(use_running_average=True), CNN),
  ("LayerNorm", lambda m: m.LayerNorm(), SEQ),
  ("RMSNorm", lambda m: m.RMSNorm(), SEQ),
  ("GroupNorm", lambda m: m.GroupNorm(num_groups=16), CNN),
  ("InstanceNorm", lambda m: m.InstanceNorm(), CNN),
]
NNX = [
  ("BatchNorm train", lambda m: m.BatchNorm(64, rngs=nnx.Rngs(0)), CNN, "train"),
  ("BatchNorm eval", lambda m: m.BatchNorm(64, rngs=nnx.Rngs(0)), CNN, "eval"),
  ("LayerNorm", lambda m: m.LayerNorm(256, rngs=nnx.Rngs(0)), SEQ, None),
  ("RMSNorm", lambda m: m.RMSNorm(256, rngs=nnx.Rngs(0)), SEQ, None),
  ("GroupNorm", lambda m: m.GroupNorm(64, num_groups=16, rngs=nnx.Rngs(0)), CNN, None),
  ("InstanceNorm", lambda m: m.InstanceNorm(64, rngs=nnx.Rngs(0)), CNN, None),
]


def eager(repeats):
  rng = np.random.default_rng(0)
  rows = []
  for name, make, shape in LINEN:
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    calls = []
    for lib in (jaxnorm, nn):
      m = make(lib)
      v = m.init(jax.random.key(0), x)
      mutable = ["batch_stats"] if "train" in name else False
      calls.append(lambda m=m, v=v, x=x, mutable=mutable: m.apply(v, x, mutable=mutable))
    ours, flax = timed(dict(zip(("jaxnorm", "flax"), calls, strict=True)), repeats).values()
    rows.append(("linen", name, ours, flax))
  for name, make, shape, mode in NNX:
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    calls = []
    for lib in (jnnx, nnx):
      m = make(lib)
      if mode == "eval":
        m.eval()
      calls.append(lambda m=m, x=x: m(x))
    ours, flax = timed(dict(zip(("jaxnorm", "flax"), calls, strict=True)), repeats).values()
    rows.append(("nnx", name, ours, flax))
  print("\n## Eager (un-jitted) calls: median µs, jaxnorm / Flax\n")
  print("| API | module | jaxnorm µs | Flax µs | ratio |\n|---|---|---|---|---|")
  for api, name, a, b in rows:
    print(f"| {api} | {name} | {a * 1e6:.0f} | {b * 1e6:.0f} | {a / b:.2f} |")


# --- collectives under GSPMD -------------------------------------------------------------

COLLECTIVES = hlo.COLLECTIVES[:4]  # (the tables' columns: no reduce-scatter ever appeared)
SHARDED = [  # (name, constructor per library, shape, spec)
  ("BatchNorm", lambda m: m.BatchNorm(use_running_average=False), CNN, P("data")),
  ("LayerNorm", lambda m: m.LayerNorm(), SEQ, P("data")),
  ("LayerNorm TP", lambda m: m.LayerNorm(), SEQ, P(None, None, "data")),
  ("RMSNorm", lambda m: m.RMSNorm(), SEQ, P("data")),
  ("RMSNorm TP", lambda m: m.RMSNorm(), SEQ, P(None, None, "data")),
  ("GroupNorm", lambda m: m.GroupNorm(num_groups=16), CNN, P("data")),
  ("InstanceNorm", lambda m: m.InstanceNorm(), CNN, P("data")),
]


def count_ops(text: str) -> dict[str, int]:
  """Collectives and conditionals in a compiled program's text."""
  return hlo.count(text, (*COLLECTIVES, "conditional"))


def _fmt(c):
  return "/".join(str(c[op]) for op in COLLECTIVES)


def _forward_and_step(m, v):
  """A module's forward (its statistics mutable where it has them) and a
  forward+backward w.r.t. its parameters and input, as functions of ``(v, x)``."""
  mutable = ["batch_stats"] if "batch_stats" in v else False

  def fwd(v, x):
    return m.apply(v, x, mutable=mutable)

  def step(v, x):
    def loss(p, x):
      out = m.apply({**v, "params": p}, x, mutable=mutable)
      return jnp.sum(jnp.sin(out[0] if mutable else out))

    return jax.grad(loss, argnums=(0, 1))(v["params"], x)

  return fwd, step


def collectives():
  print("\n## Collectives under GSPMD, 8 devices: all-reduce/all-gather/permute/all-to-all\n")
  print("| mode | norm | layout | jaxnorm fwd | Flax fwd | jaxnorm fwd+bwd | Flax fwd+bwd |")
  print("|---|---|---|---|---|---|---|")
  for mode in (AxisType.Auto, AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(mode,))
    for name, make, shape, spec in SHARDED:
      x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
      cells = []
      for lib in (jaxnorm, nn):
        m = make(lib)
        v = m.init(jax.random.key(0), x)
        with jax.set_mesh(mesh):
          xs = jax.device_put(x, NamedSharding(mesh, spec))
          texts = [jax.jit(f).lower(v, xs).compile().as_text() for f in _forward_and_step(m, v)]
        cells.append([count_ops(t) for t in texts])
      (jf, js), (ff, fs) = cells
      layout = ",".join(str(s) for s in spec)
      print(
        f"| {mode.name} | {name} | {layout} | {_fmt(jf)} | {_fmt(ff)} | {_fmt(js)} | {_fmt(fs)} |"
      )


# --- reads of x: XLA's bytes accessed per norm ---------------------------------------------

READS = [  # (name, constructor per library, shape)
  ("BatchNorm train", lambda m: m.BatchNorm(use_running_average=False), CNN),
  ("BatchNorm eval", lambda m: m.BatchNorm(use_running_average=True), CNN),
  ("LayerNorm", lambda m: m.LayerNorm(), SEQ),
  ("LayerNorm (H,W,C)", lambda m: m.LayerNorm(reduction_axes=(1, 2, 3)), CNN),
  ("RMSNorm", lambda m: m.RMSNorm(), SEQ),
  ("GroupNorm", lambda m: m.GroupNorm(num_groups=16), CNN),
  ("InstanceNorm", lambda m: m.InstanceNorm(), CNN),
]


def reads():
  print("\n## Reads of x: XLA:CPU's bytes accessed / |x|, one device, jaxnorm / Flax\n")
  print("| dtype | norm | fwd bytes | fwd fusions | fwd conditionals | fwd+bwd bytes |")
  print("|---|---|---|---|---|---|")
  for dtype in (jnp.float32, jnp.bfloat16):
    for name, make, shape in READS:
      x = jnp.asarray(np.random.default_rng(0).normal(size=shape), dtype)
      cells = []
      for lib in (jaxnorm, nn):
        m = make(lib)
        v = m.init(jax.random.key(0), x)
        progs = [jax.jit(f).lower(v, x).compile() for f in _forward_and_step(m, v)]
        cost = [p.cost_analysis() for p in progs]
        cost = [c[0] if isinstance(c, list) else c for c in cost]
        texts = [p.as_text() for p in progs]
        cells.append(
          (
            cost[0]["bytes accessed"] / x.nbytes,
            len(re.findall(r"\sfusion\(", texts[0])),
            count_ops(texts[0])["conditional"],
            cost[1]["bytes accessed"] / x.nbytes,
          )
        )
      (a, b) = cells
      print(
        f"| {jnp.dtype(dtype).name} | {name} | {a[0]:.2f} / {b[0]:.2f} | {a[1]} / {b[1]} "
        f"| {a[2]} / {b[2]} | {a[3]:.2f} / {b[3]:.2f} |"
      )


# --- whole models (tests/models.py): collectives and compile time -------------------------


def resnet50_collectives():
  """Collectives of a ResNet-50 training step, the batch sharded over 8 devices."""
  print("\n## ResNet-50 training step under GSPMD, 8 devices, batch sharded\n")
  print("| mode | jaxnorm all-reduce/all-gather/permute/all-to-all | Flax |")
  print("|---|---|---|")
  x = np.random.default_rng(0).normal(size=(16, 64, 64, 3)).astype(np.float32)
  # (automatic sharding only: under explicit sharding Flax's Conv asks for out_sharding)
  for mode in (AxisType.Auto,):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(mode,))
    cells = []
    for lib in (jaxnorm, nn):
      f, v, _ = programs(ResNet50, lib, x.shape)["training"]
      with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        cells.append(count_ops(jax.jit(f).lower(v, xs).compile().as_text()))
    print(f"| {mode.name} | {_fmt(cells[0])} | {_fmt(cells[1])} |")


def compile_times(repeats):
  print("\n## Compile time (trace, lower, compile), median s, jaxnorm / Flax\n")
  print(
    "| model | program | trace s | lower s | compile s | ratio of sums | fusions | conditionals |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for name, cls, shape in MODELS:
    ours, theirs = programs(cls, jaxnorm, shape), programs(cls, nn, shape)
    for program in ("inference", "training"):
      times: dict[str, list[tuple[float, ...]]] = {"ours": [], "flax": []}
      texts = {}
      for i in range(repeats):
        for key, progs in (("ours", ours), ("flax", theirs))[:: 1 if i % 2 == 0 else -1]:
          f, v, x = progs[program]
          jax.clear_caches()  # what a new shape costs: trace, lower and compile
          start = time.perf_counter()
          traced = jax.jit(f).trace(v, x)
          mid = time.perf_counter()
          lowered = traced.lower()
          late = time.perf_counter()
          texts[key] = lowered.compile().as_text()
          times[key].append((mid - start, late - mid, time.perf_counter() - late))
      a, b = (np.median(np.array(times[k]), 0) for k in ("ours", "flax"))
      fusions = [len(re.findall(r"\sfusion\(", texts[k])) for k in ("ours", "flax")]
      cond = count_ops(texts["ours"])["conditional"]
      steps = " | ".join(f"{p:.3f} / {q:.3f}" for p, q in zip(a, b, strict=True))
      cells = f"{steps} | {a.sum() / b.sum():.2f} | {fusions[0]}/{fusions[1]} | {cond}"
      print(f"| {name} | {program} | {cells} |", flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="eager,compile,collectives,reads,resnet50")
  parser.add_argument("--repeats", type=int, default=30)
  args = parser.parse_args(argv)
  parts = set(args.only.split(","))
  flax_version = __import__("flax").__version__
  print(f"jax {jax.__version__}, flax {flax_version}, {jax.devices()[0].platform}")
  if "eager" in parts:
    eager(args.repeats)
  if "compile" in parts:
    compile_times(max(3, args.repeats // 6))
  if "collectives" in parts:
    collectives()
  if "reads" in parts:
    reads()
  if "resnet50" in parts:
    resnet50_collectives()


if __name__ == "__main__":
  main()
