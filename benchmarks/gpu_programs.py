"""XLA:GPU's programs for every norm, compiled on a machine without a GPU (issue 34, point 4).

Compiles jaxnorm's and Flax's forward and forward+backward for an H100 target with no
device (``jax.experimental.topologies`` and a target description, through the CUDA
plugin), and counts what each program launches and moves: kernels (fusions, custom calls,
copies and other top-level operations of the entry computation and of any loop or
conditional in it) and a bytes model — every kernel's operands read and results written,
as multiples of |x| (XLA's own ``cost_analysis`` returns nothing without a device). Where
jaxnorm's program has more kernels or bytes than Flax's, the table says so.

Needs the CUDA plugin (not a GPU), in its own environment:

  pip install "jax-cuda12-plugin[with-cuda]==<jax's version>" "jax-cuda12-pjrt==<same>"
  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu PYTHONPATH=. \\
      python benchmarks/gpu_programs.py > benchmarks/results/gpu_programs.md

``--stacks`` compiles :mod:`bench_scale`'s model stacks instead (a GroupNorm UNet, a ResNet
stage, a Pre-LN Transformer and a ResNet-50; inference and training step): fusions,
kernels, conditionals and lower and compile time, jaxnorm against Flax, interleaved
(issue 33's point 3 on XLA:GPU): ``> benchmarks/results/gpu_programs_stacks.md``.

``--pallas`` compiles jaxnorm's Pallas row kernels (``implementation="pallas"``) beside
its XLA path at the device suite's training shapes: kernels, Triton calls and bytes
against the least traffic of each pass: ``> benchmarks/results/gpu_programs_pallas.md``.

``--modern`` compiles the modern norms instead (:mod:`bench_modern`'s forms: DyT, AdaLN and
modulated RMSNorm, jaxnorm against the hand-written ``jnp`` forms):
``> benchmarks/results/gpu_programs_modern.md``.
"""

from __future__ import annotations

import functools
import math
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_norms  # noqa: E402
from hlo import kernels_and_bytes  # noqa: E402

import jaxnorm  # noqa: E402

# XLA's description of an H100 SXM (the fields XLA:GPU's compiler reads).
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448 cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""

CASES = [  # (norm, shape, dtype)
  *((k, (16, 512, 768), d) for d in ("float32", "bfloat16") for k in ("layer", "rms")),
  *((k, (4, 1024, 4096), d) for d in ("float32", "bfloat16") for k in ("layer", "rms")),
  *(
    (k, (32, 56, 56, 64), d)
    for d in ("float32", "bfloat16")
    for k in ("batch_train", "batch_eval", "layer", "group", "instance")
  ),
  *((k, (16, 512, 768), "float32") for k in ("add_layer", "add_rms")),
  # small programs (2,048 rows: bench_scale's stacks), where XLA:GPU splits shifted sums
  *((k, (8, 16, 16, 64), "float32") for k in ("batch_train", "layer", "group", "instance")),
]


def _abstract(tree, mesh):
  """``tree``'s arrays as shapes and dtypes, replicated over ``mesh`` (nothing to hold)."""
  rep = NamedSharding(mesh, P())
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), tree)


def _programs(kind, shape, dtype, mesh):
  """jaxnorm's and Flax's forward and forward+backward, lowered for the mesh's GPU."""
  dt = jnp.dtype(dtype)
  x_cpu, cot_cpu = jax.eval_shape(lambda: bench_norms.inputs(kind, shape, dt))

  def abstract(tree):
    return _abstract(tree, mesh)

  out = {}
  for name, lib in (("jaxnorm", jaxnorm), ("flax", nn)):
    x0 = x_cpu[0] if isinstance(x_cpu, tuple) else x_cpu
    module = bench_norms._module(lib, kind, len(shape), dt)
    variables = jax.eval_shape(
      lambda x0=x0: bench_norms._module(nn, kind, len(shape), dt).init(
        jax.random.key(0), jnp.zeros(x0.shape, x0.dtype)
      )
    )
    rest = {k: v for k, v in variables.items() if k != "params"}
    forward = bench_norms.module_forward(module, kind, fused_add=name == "jaxnorm")
    fwd_bwd = bench_norms.forward_backward(forward)
    args = abstract((variables["params"], x_cpu, rest))
    for pass_, fn, a in (
      ("forward", forward, args),
      ("fwd+bwd", fwd_bwd, (*args, abstract(cot_cpu))),
    ):
      out[(name, pass_)] = jax.jit(fn).lower(*a).compile()
  return out, x0.size * dt.itemsize


def modern(mesh):
  """The modern norms' table: jaxnorm against the hand-written form, per kind and pass."""
  import bench_modern  # noqa: PLC0415 (only for --modern)

  print("| norm | shape | dtype | forward kernels | forward bytes | fwd+bwd kernels | "
        "fwd+bwd bytes |\n|---|---|---|---|---|---|---|")  # fmt: skip
  rng = np.random.default_rng(0)
  for kind in ("dyt", "adaln", "adarms"):
    for shape in bench_modern.SHAPES.values():
      for dtype in ("float32", "bfloat16"):
        dt = jnp.dtype(dtype)
        params = _abstract(bench_modern.params_for(kind, shape, rng), mesh)
        x = _abstract(jax.ShapeDtypeStruct(shape, dt), mesh)
        forms = bench_modern.forms(kind)
        cells = []
        for pass_ in ("forward", "fwd+bwd"):
          counted = []
          for name in ("jaxnorm", "jnp"):
            f = forms[name]
            fn = f if pass_ == "forward" else bench_norms.forward_backward(f)
            args = (params, x, None) if pass_ == "forward" else (params, x, None, x)
            counted.append(kernels_and_bytes(jax.jit(fn).lower(*args).compile().as_text()))
          (ka, ba), (kb, bb) = counted
          nbytes = math.prod(shape) * dt.itemsize
          flag = " **" if ka > kb or ba > 1.02 * bb else ""
          cells += [f"{ka} / {kb}", f"{ba / nbytes:.2f} / {bb / nbytes:.2f}{flag}"]
        shape_text = "×".join(map(str, shape))
        print(f"| {kind} | {shape_text} | {dtype} | " + " | ".join(cells) + " |", flush=True)


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
    x, cot = jax.eval_shape(functools.partial(bench_norms.inputs, kind, shape, dt))
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
        text = jax.jit(fn).lower(*_abstract(args, mesh)).compile().as_text()
        kernels, moved = kernels_and_bytes(text)
        triton = text.count('custom_call_target="__gpu$xla.gpu.triton"')
        cells += [f"{kernels}" + (f" ({triton})" if impl == "pallas" else ""),
                  f"{moved / x_bytes:.2f}"]  # fmt: skip
      shape_text = "×".join(map(str, shape))
      print(f"| {kind} | {shape_text} | {dtype} | {pass_} | " + " | ".join(cells)
            + f" | {floors[pass_] / x_bytes:.2f} |", flush=True)  # fmt: skip


def main():
  topology = topologies.get_topology_desc(platform="cuda", target_config=H100, topology="1x1x1")
  mesh = topologies.make_mesh(topology, (1,), ("d",))
  print(f"# XLA:GPU programs, compiled without a device for {topology.devices[0].device_kind}\n")
  if "--modern" in sys.argv[1:]:
    print(f"jax {jax.__version__}. The modern norms: jaxnorm / the hand-written jnp form")
    print("(bench_modern.py); kernels and bytes over |x| as below.\n")
    return modern(mesh)
  if "--pallas" in sys.argv[1:]:
    print(f"jax {jax.__version__}. jaxnorm's XLA path and its Pallas row kernels; kernels and")
    print("bytes over |x| as below; the least traffic: bench_norms.floor_kernels' credit.\n")
    return pallas(mesh)
  if "--stacks" in sys.argv[1:]:
    print(f"jax {jax.__version__}, flax {__import__('flax').__version__}.")
    print("bench_scale.py's model stacks, jaxnorm / Flax: fusions (every fusion instruction),")
    print("kernels (as below), conditionals (jaxnorm's), medians of interleaved lower and")
    print("compile times (s, caches cleared: what a new shape costs), ratio of their sums.\n")
    import accelerator_programs  # noqa: PLC0415 (the stacks are platform-generic)

    return accelerator_programs.stacks(mesh, "gpu")
  print(f"jax {jax.__version__}. Kernels: top-level launches (fusions, custom calls, copies,")
  print("reductions); bytes: every kernel's operands and results over |x|. jaxnorm / Flax.\n")
  print(
    "| norm | shape | dtype | forward kernels | forward bytes | fwd+bwd kernels | fwd+bwd bytes |"
  )
  print("|---|---|---|---|---|---|---|")
  for kind, shape, dtype in CASES:
    progs, nbytes = _programs(kind, shape, dtype, mesh)
    cells = []
    for pass_ in ("forward", "fwd+bwd"):
      (ka, ba), (kb, bb) = (
        kernels_and_bytes(progs[(n, pass_)].as_text()) for n in ("jaxnorm", "flax")
      )
      flag = " **" if ka > kb or ba > 1.02 * bb else ""
      cells += [f"{ka} / {kb}", f"{ba / nbytes:.2f} / {bb / nbytes:.2f}{flag}"]
    shape_text = "×".join(map(str, shape))
    print(f"| {kind} | {shape_text} | {dtype} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
