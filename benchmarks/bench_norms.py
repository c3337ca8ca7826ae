"""The benchmark suite: every norm, jaxnorm vs flax.linen vs plain jnp, time and traffic.

For each norm (BatchNorm training and inference, LayerNorm, RMSNorm, GroupNorm,
InstanceNorm, and Add & Norm of LayerNorm and RMSNorm) at Transformer shapes (B, T, D) with
D in {768, 4096} and an NHWC CNN shape whose working set exceeds the CPU caches, in float32
and in mixed precision (bfloat16 activations, float32 parameters and statistics), it
measures the forward pass and the forward+backward pass (a VJP with a random cotangent,
gradients w.r.t. the input and the parameters), each jit-compiled:

- time: runs interleaved after compilation (A B C C B A ...), medians, ratios to Flax;
- the floor: in the same interleaved loop, kernels of the least traffic a norm can have
  (forward: read x, write y, 2|x|; forward+backward: that and read x and dy, write dx,
  5|x|), and every case's time as a multiple of its floor;
- traffic: XLA's ``cost_analysis()`` bytes accessed and ``memory_analysis()`` temporaries,
  as multiples of |x| (the input's bytes).

Add & Norm is jaxnorm's fused call (``LayerNorm(...)(x, residual=r)``, the residual stream
in float32) against Flax's separate ``h = x + r`` and norm.

The peers, in the same interleaved loop where installed (``pip install -e ".[bench]"``;
:mod:`peers`): Equinox (LayerNorm, RMSNorm, GroupNorm, InstanceNorm as one group per
channel), Haiku (all five) and tokamax's ``layer_norm`` (LayerNorm and RMSNorm rows; on a
GPU also its ``"triton"`` kernel). Each is first checked to compute Flax's output; the
tables give every implementation's time and jaxnorm's against the best peer (the fastest of
Flax and the libraries).

Writes ``bench_norms.json``, ``bench_norms.md`` (tables) and ``bench_norms.png`` into
``--out`` (by default ``benchmarks/results/<device>``; a subset — ``--only``, ``--quick`` or
one dtype — into its ``partial`` folder, never over the committed full tables) and says
which device it measured; runs unchanged on a GPU or TPU.

  python benchmarks/bench_norms.py [--out DIR] [--repeats 15] [--quick]
      [--dtypes float32 bfloat16] [--only layer/tfm768 group] [--no-peers]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm

try:  # run as a script: benchmarks/ is on the path
  import peers
except ImportError:  # imported as benchmarks.bench_norms
  from benchmarks import peers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The case grid the compiled-program tests count: the same modules, inputs and passes.
from tests.programs import forward_backward, inputs, module, module_forward  # noqa: E402

SHAPES = {
  "tfm768": (16, 512, 768),
  "tfm4096": (4, 1024, 4096),
  "cnn": (32, 56, 56, 64),
}
QUICK_SHAPES = {"tfm768": (4, 128, 768), "tfm4096": (1, 128, 4096), "cnn": (8, 28, 28, 64)}
# float32 throughout, and mixed precision: bfloat16 activations (input, output, cotangent)
# with float32 parameters and statistics (``dtype=bfloat16``, Flax's default param_dtype).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _plain_stats(x, axes):
  mean = x.mean(axes, keepdims=True)
  return mean, ((x - mean) ** 2).mean(axes, keepdims=True)


def _plain(kind, dtype):
  """A hand-written jnp version of each norm: two-pass float32 statistics, autodiff backward."""

  def affine(y, p, shape):
    return y * p["scale"].reshape(shape) + p["bias"].reshape(shape)

  def norm(p, x):
    c = x.shape[-1]
    shape = (1,) * (x.ndim - 1) + (c,)
    x = x.astype(jnp.float32)
    if kind in ("batch_train", "batch_eval"):
      axes = tuple(range(x.ndim - 1))
      if kind == "batch_eval":
        mean, var = p["mean"].reshape(shape), p["var"].reshape(shape)
      else:
        mean, var = _plain_stats(x, axes)
      return affine((x - mean) * jax.lax.rsqrt(var + 1e-5), p, shape)
    if kind in ("layer", "add_layer"):
      axes = tuple(range(1, x.ndim)) if x.ndim == 4 else (-1,)
      mean, var = _plain_stats(x, axes)
      return affine((x - mean) * jax.lax.rsqrt(var + 1e-6), p, shape)
    if kind in ("rms", "add_rms"):
      ms = (x * x).mean(-1, keepdims=True)
      return x * jax.lax.rsqrt(ms + 1e-6) * p["scale"].reshape(shape)
    if kind == "instance":
      mean, var = _plain_stats(x, (1, 2))
      return affine((x - mean) * jax.lax.rsqrt(var + 1e-6), p, shape)
    if kind == "group":
      g = x.reshape(x.shape[:-1] + (32, c // 32))
      mean, var = _plain_stats(g, (1, 2, 4))
      return affine(((g - mean) * jax.lax.rsqrt(var + 1e-6)).reshape(x.shape), p, shape)
    raise ValueError(kind)

  def fn(p, x):
    if kind.startswith("add_"):
      x, residual = x
      h = x.astype(jnp.float32) + residual
      return norm(p, h).astype(dtype), h
    return norm(p, x).astype(dtype)

  return fn


CASES = [  # (norm, shape)
  *((k, s) for s in ("tfm768", "tfm4096") for k in ("layer", "rms", "batch_train", "batch_eval")),
  *(
    ("batch_train", "cnn"),
    ("batch_eval", "cnn"),
    ("layer", "cnn"),
    ("group", "cnn"),
    ("instance", "cnn"),
  ),
  # Add & Norm of a Pre-LN block: jaxnorm's fused call against Flax's separate add and norm,
  # the residual stream h kept in float32.
  *((k, s) for s in ("tfm768", "tfm4096") for k in ("add_layer", "add_rms")),
]


def build(kind, x, dtype, cot, libs=None, pallas=False):
  """Returns {impl: (forward, fwd+bwd, args, cotangent)} for jaxnorm, flax, plain jnp and
  the peers in ``libs`` (:mod:`peers`; each is first checked to compute Flax's output);
  with ``pallas``, also jaxnorm's Pallas row kernels (``jaxnorm-pallas``) where they apply
  (LayerNorm, RMSNorm and Add & Norm over the last axis)."""
  add = kind.startswith("add_")
  x0 = x[0] if add else x
  impls = {}
  front_ends = [("jaxnorm", jaxnorm), ("flax", nn)]
  if pallas and peers.norm_kind(kind) in ("layer", "rms") and x0.ndim == 3:
    front_ends.append(("jaxnorm-pallas", jaxnorm))
  for name, lib in front_ends:
    norm = module(lib, kind, x0.ndim, dtype)
    if name == "jaxnorm-pallas":
      norm = norm.clone(implementation="pallas")
    variables = module(nn, kind, x0.ndim, dtype).init(jax.random.key(0), x0)
    if "batch_stats" in variables:  # non-trivial running statistics for inference
      variables["batch_stats"] = {
        "mean": jnp.full_like(variables["batch_stats"]["mean"], 0.1),
        "var": jnp.full_like(variables["batch_stats"]["var"], 1.5),
      }
    rest = {k: v for k, v in variables.items() if k != "params"}
    forward = module_forward(norm, kind, fused_add=name.startswith("jaxnorm"))
    impls[name] = (forward, variables["params"], rest)
  plain = _plain(kind, dtype)
  params = dict(impls["flax"][1])
  rest = {}
  if kind == "batch_eval":
    rest = {"mean": jnp.full(x0.shape[-1], 0.1), "var": jnp.full(x0.shape[-1], 1.5)}
  impls["jnp"] = (lambda p, x, rest: plain({**p, **rest}, x), params, rest)
  inputs_of = {name: (x, cot) for name in impls}
  for name, (forward, params, rest, layout) in peers.build(kind, x, dtype, libs or {}).items():
    impls[name] = (forward, params, rest)
    inputs_of[name] = jax.tree_util.tree_map(layout, (x, cot))

  # Running statistics are arguments of the compiled step, as in a real training or
  # evaluation step (closed over, XLA would fold them into constants).
  out = {}
  for name, (forward, params, rest) in impls.items():
    x_in, cot_in = inputs_of[name]
    fwd_bwd = forward_backward(forward)
    out[name] = (jax.jit(forward), jax.jit(fwd_bwd), (params, x_in, rest), cot_in)
  for name in _check_peers(kind, out, dtype):
    del out[name]
  return out


# Implementations left out of a run for a wrong output: "name kind: error" (gpu_suite.py
# records them; a device run is too scarce to lose to one wrong peer).
EXCLUDED: list[str] = []


def _check_peers(kind, impls, dtype):
  """Every implementation computes Flax's output (to the dtype's rounding): a timing of
  something else would mean nothing. jaxnorm's own XLA path must; another that does not is
  named in :data:`EXCLUDED`, and its name returned, to be left out."""
  fwd, _, args, _ = impls["flax"]
  want = jax.tree_util.tree_leaves(fwd(*args))[0]
  tol = 2e-4 if dtype == jnp.float32 else 6e-2
  wrong = []
  for name, (fwd, _, args, _) in impls.items():
    got = jax.tree_util.tree_leaves(fwd(*args))[0]
    if got.shape != want.shape:  # (channels first)
      got = jnp.moveaxis(got, 1, -1)
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    if not err <= tol:
      message = f"{name} {kind}: max |y − flax's y| = {err:.3g} > {tol}"
      if name == "jaxnorm":
        raise AssertionError(message)
      print("left out, wrong output:", message, flush=True)
      EXCLUDED.append(message)
      wrong.append(name)
  return wrong


def floor_kernels(x, cot):
  """The least traffic one norm of ``x`` can have, as kernels of one elementwise fusion
  each, ``{pass: [(fn, args, bytes), ...]}`` (bytes: the arrays each reads and writes, which
  ``floor_traffic`` checks its compiled program moves). Forward: one kernel that reads x
  (and the residual, Add & Norm) and writes y (and h): 2|x| (Add & Norm with a float32
  residual: |x| + |r| read, |y| + |h| written). Forward+backward: that kernel, then one
  that reads x and dy (h, dy and dh) and writes dx (and the residual's cotangent): 5|x|.
  The two are timed apart and their times summed: fused into one program they would share
  x's read (3|x|, once credited with 5|x|: 4.8 TB/s on an H100, above its peak)."""
  if isinstance(x, tuple):  # Add & Norm: h = x + r in r's dtype, y in x's
    (x, r), (dy, dh) = x, cot

    def forward(x, r):
      h = x.astype(r.dtype) + r
      return (h * 1.0001 + 0.5).astype(x.dtype), h

    def backward(h, dy, dh):
      dr = h * dy.astype(h.dtype) + dh
      return dr.astype(x.dtype), dr

    fwd, bwd = (jax.jit(forward), (x, r)), (jax.jit(backward), (r, dy, dh))
  else:
    fwd = (jax.jit(lambda x: x * 1.0001 + 0.5), (x,))
    bwd = (jax.jit(lambda x, dy: x * dy + dy), (x, cot))
  kernels = [(fn, args, _traffic(fn, args)) for fn, args in (fwd, bwd)]
  return {"forward": kernels[:1], "fwd+bwd": kernels}


def _traffic(fn, args):
  """Bytes of the arrays ``fn(*args)`` reads and writes."""
  outs = jax.eval_shape(fn, *args)
  return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves((args, outs)))


def floor_traffic(kernels):
  """The floor kernels' compiled bytes accessed over the bytes they are credited with
  (1.0 where each is the one fusion it models)."""
  compiled = sum(analyse(fn, args, 1)[0] for fn, args, _ in kernels)
  return compiled / sum(b for _, _, b in kernels)


def floors(x, cot):
  """:func:`floor_kernels` as zero-argument calls, timed in the same interleaved loop as
  the cases (the kernels of one pass dispatched one after the other)."""

  def call(kernels):
    return lambda: [fn(*args) for fn, args, _ in kernels]

  return {p: call(k) for p, k in floor_kernels(x, cot).items()}


def analyse(fn, args, nbytes):
  compiled = fn.lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list | tuple) else cost
  mem = compiled.memory_analysis()
  temp = getattr(mem, "temp_size_in_bytes", float("nan")) if mem is not None else float("nan")
  return cost.get("bytes accessed", float("nan")) / nbytes, temp / nbytes


def timed(calls, repeats):
  """Median seconds of each zero-argument call, runs interleaved (A B C C B A ...)."""
  for call in calls.values():
    jax.block_until_ready(call())
  times = {k: [] for k in calls}
  order = list(calls)
  for i in range(repeats):
    for k in order if i % 2 == 0 else order[::-1]:
      t0 = time.perf_counter()
      jax.block_until_ready(calls[k]())
      times[k].append(time.perf_counter() - t0)
  return {k: float(np.median(v)) for k, v in times.items()}


def geomean(values):
  values = [v for v in values if v > 0 and math.isfinite(v)]
  return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def selected(only):
  """The cases ``(norm, shape)`` whose ``'norm/shape'`` contains one of ``only`` (all for
  None); a filter that matches nothing is an error naming the cases."""
  cases = [c for c in CASES if not only or any(o in f"{c[0]}/{c[1]}" for o in only)]
  if not cases:
    names = ", ".join(f"{k}/{s}" for k, s in CASES)
    raise SystemExit(f"--only {' '.join(only)} matches no case; the cases are: {names}")
  return cases


def device_name(device) -> str:
  """A folder name for the device: ``nvidia-h100-80gb-hbm3``, ``cpu``."""
  if device.platform == "cpu":
    return "cpu"
  return re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-")


def results_dir(device) -> str:
  """``benchmarks/results/<device>``: where every runner's results for ``device`` go."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", device_name(device))


def output_dir(out, partial, device=None):
  """Where a run writes: ``out`` as given, else :func:`results_dir` of the device
  (``benchmarks/results/cpu`` on a CPU) for a full run and its ``partial`` folder (not
  committed) for a subset (``--only``, ``--quick``, one dtype), so that a subset never
  overwrites the committed full tables."""
  if out is not None:
    return out
  return os.path.join(results_dir(device or jax.devices()[0]), *(["partial"] if partial else []))


def run(shapes, repeats, dtypes, only=None, libs=None, pallas=False):
  rows = []
  cases = selected(only)
  for dtype_name in dtypes:
    dtype = DTYPES[dtype_name]
    for kind, shape_name in cases:
      x, cot = inputs(kind, shapes[shape_name], dtype)
      x0 = x[0] if isinstance(x, tuple) else x
      impls = build(kind, x, dtype, cot, libs, pallas)
      floor = floors(x, cot)
      for p, pass_name in ((0, "forward"), (1, "fwd+bwd")):
        fns = {name: impl[p] for name, impl in impls.items()}
        args = {name: impl[2] + ((impl[3],) if p else ()) for name, impl in impls.items()}
        calls = {n: (lambda f=fns[n], a=args[n]: f(*a)) for n in fns}
        medians = timed({**calls, "floor": floor[pass_name]}, repeats)
        row = dict(
          norm=kind, shape=shape_name, dims=list(x0.shape), dtype=dtype_name, pass_=pass_name
        )
        row["floor_ms"] = medians["floor"] * 1e3
        for name in fns:
          bytes_x, temp_x = analyse(fns[name], args[name], x0.nbytes)
          t = medians[name]
          row[name] = dict(ms=t * 1e3, bytes_x=bytes_x, temp_x=temp_x, floor_x=t / medians["floor"])
        row["ratio_time"] = row["jaxnorm"]["ms"] / row["flax"]["ms"]
        row["ratio_bytes"] = row["jaxnorm"]["bytes_x"] / row["flax"]["bytes_x"]
        row["jnp_ratio_time"] = row["jnp"]["ms"] / row["flax"]["ms"]
        # The best peer: Flax and every library of the suite (not the hand-written jnp).
        ours = ("jaxnorm", "jaxnorm-pallas", "jnp")
        best = min((n for n in fns if n not in ours), key=lambda n: row[n]["ms"])
        row["best_peer"] = best
        row["ratio_best_peer"] = row["jaxnorm"]["ms"] / row[best]["ms"]
        rows.append(row)
        print(
          f"{dtype_name:8s} {kind:12s} {shape_name:8s} {pass_name:8s} "
          f"time {row['ratio_time']:.3f}  bytes {row['ratio_bytes']:.3f}  "
          f"floor x{row['jaxnorm']['floor_x']:.2f} (flax x{row['flax']['floor_x']:.2f})  "
          f"(jaxnorm {row['jaxnorm']['bytes_x']:.1f}|x|, flax {row['flax']['bytes_x']:.1f}|x|, "
          f"temp {row['jaxnorm']['temp_x']:.1f} vs {row['flax']['temp_x']:.1f}|x|)  "
          f"best peer {best} x{row['ratio_best_peer']:.3f}"
          + (
            f"  pallas floor x{row['jaxnorm-pallas']['floor_x']:.2f}, /flax "
            f"{row['jaxnorm-pallas']['ms'] / row['flax']['ms']:.3f}"
            if "jaxnorm-pallas" in row
            else ""
          ),
          flush=True,
        )
  return rows


def summarize(rows):
  """Per dtype and pass: geometric means over the norms (Add & Norm apart: it is compared
  with Flax's separate add and norm), floor multiples, the worst single case."""
  out = {}
  for dtype_name in dict.fromkeys(r["dtype"] for r in rows):
    for pass_name in ("forward", "fwd+bwd"):
      sel = [r for r in rows if r["pass_"] == pass_name and r["dtype"] == dtype_name]
      norms = [r for r in sel if not r["norm"].startswith("add_")]
      adds = [r for r in sel if r["norm"].startswith("add_")]
      out[f"{dtype_name} {pass_name}"] = dict(
        time=geomean([r["ratio_time"] for r in norms]),
        bytes=geomean([r["ratio_bytes"] for r in norms]),
        jnp_time=geomean([r["jnp_ratio_time"] for r in norms]),
        floor=geomean([r["jaxnorm"]["floor_x"] for r in norms]),
        flax_floor=geomean([r["flax"]["floor_x"] for r in norms]),
        max_floor=max((r["jaxnorm"]["floor_x"] for r in norms), default=float("nan")),
        max_time=max((r["ratio_time"] for r in sel), default=float("nan")),
        add_norm_time=geomean([r["ratio_time"] for r in adds]),
        best_peer_time=geomean([r["ratio_best_peer"] for r in norms]),
        max_best_peer=max((r["ratio_best_peer"] for r in sel), default=float("nan")),
        max_temp_excess_x=max(
          (r["jaxnorm"]["temp_x"] - r["flax"]["temp_x"] for r in sel), default=float("nan")
        ),
      )
      kernels = [r for r in sel if "jaxnorm-pallas" in r]
      if kernels:  # issue 22's GPU targets, over LayerNorm, RMSNorm and Add & Norm rows
        out[f"{dtype_name} {pass_name}"]["pallas"] = _kernel_summary(kernels)
  return out


def _kernel_summary(rows):
  """The Pallas kernels against the floor, Flax and tokamax's Triton kernel (where timed)."""
  floor = [r["jaxnorm-pallas"]["floor_x"] for r in rows]
  vs = {
    peer: [r["jaxnorm-pallas"]["ms"] / r[peer]["ms"] for r in rows if peer in r]
    for peer in ("flax", "tokamax_triton")
  }
  return dict(
    floor=geomean(floor),
    max_floor=max(floor),
    time=geomean(vs["flax"]),
    max_time=max(vs["flax"]),
    max_vs_tokamax_triton=max(vs["tokamax_triton"], default=float("nan")),
  )


def write(out_dir, rows, summary, device, args):
  os.makedirs(out_dir, exist_ok=True)
  meta = dict(
    device=device,
    jax=jax.__version__,
    machine=platform.machine(),
    cpus=os.cpu_count(),
    repeats=args.repeats,
    quick=args.quick,
  )
  with open(os.path.join(out_dir, "bench_norms.json"), "w") as f:
    json.dump(dict(meta=meta, summary=summary, rows=rows), f, indent=1)
  lines = [
    f"Device: {device}; jax {jax.__version__}; {os.cpu_count()} CPUs; medians of "
    f"{args.repeats} interleaved runs. Floor: the same loop's copy kernel (forward, 2\\|x\\|) "
    "or copy and a read-2-write-1 kernel (forward+backward, 5\\|x\\|).",
    "",
    "| dtype | norm | shape | pass | jaxnorm ms | flax ms | jnp ms | time jaxnorm/flax | "
    "floor ×, jaxnorm, flax | bytes jaxnorm, flax (×\\|x\\|) | temp jaxnorm, flax (×\\|x\\|) |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    j, fl, p = r["jaxnorm"], r["flax"], r["jnp"]
    lines.append(
      f"| {r['dtype']} | {r['norm']} | {'×'.join(map(str, r['dims']))} | {r['pass_']} | "
      f"{j['ms']:.2f} | {fl['ms']:.2f} | {p['ms']:.2f} | {r['ratio_time']:.3f} | "
      f"{j['floor_x']:.2f}, {fl['floor_x']:.2f} | {j['bytes_x']:.1f}, {fl['bytes_x']:.1f} | "
      f"{j['temp_x']:.1f}, {fl['temp_x']:.1f} |"
    )
  impl_names = _implementations(rows)
  lines += [
    "",
    "Every implementation, ms (— where a library has no such norm); the best peer is the "
    "fastest of Flax and the libraries (not the hand-written jnp):",
    "",
    "| dtype | norm | shape | pass | " + " | ".join(impl_names) + " | jaxnorm / best peer |",
    "|---|---|---|---|" + "---|" * (len(impl_names) + 1),
  ]
  for r in rows:
    cells = [f"{r[n]['ms']:.2f}" if n in r else "—" for n in impl_names]
    lines.append(
      f"| {r['dtype']} | {r['norm']} | {'×'.join(map(str, r['dims']))} | {r['pass_']} | "
      + " | ".join(cells)
      + f" | {r['ratio_best_peer']:.3f} ({r['best_peer']}) |"
    )
  lines += [
    "",
    "Geometric means over the norms (Add & Norm apart):",
    "",
    "| dtype, pass | time jaxnorm/flax | bytes jaxnorm/flax | floor × jaxnorm (flax) | "
    "worst floor × | worst time ratio (any case) | Add & Norm time / flax add + norm | "
    "time jnp/flax | largest excess of temporaries over flax (×\\|x\\|) | "
    "time jaxnorm / best peer | worst case jaxnorm / best peer |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for key, s in summary.items():
    lines.append(
      f"| {key} | {s['time']:.3f} | {s['bytes']:.3f} | {s['floor']:.2f} ({s['flax_floor']:.2f})"
      f" | {s['max_floor']:.2f} | {s['max_time']:.3f} | {s['add_norm_time']:.3f} | "
      f"{s['jnp_time']:.3f} | {s['max_temp_excess_x']:+.4f} | {s['best_peer_time']:.3f} | "
      f"{s['max_best_peer']:.3f} |"
    )
  with open(os.path.join(out_dir, "bench_norms.md"), "w") as f:
    f.write("\n".join(lines) + "\n")

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
  fig, axes = plt.subplots(len(dtypes), 2, figsize=(16, 5 * len(dtypes)), squeeze=False)
  width = 0.8 / len(impl_names)
  for row_axes, dtype_name in zip(axes, dtypes, strict=True):
    for ax, pass_name in zip(row_axes, ("forward", "fwd+bwd"), strict=True):
      sel = [r for r in rows if r["pass_"] == pass_name and r["dtype"] == dtype_name]
      pos = np.arange(len(sel))
      for k, name in enumerate(impl_names):
        heights = [r[name]["floor_x"] if name in r else np.nan for r in sel]
        ax.bar(pos + (k - (len(impl_names) - 1) / 2) * width, heights, width, label=name)
      ax.axhline(1.0, color="k", lw=0.8)
      ax.set_xticks(pos, [f"{r['norm']}\n{r['shape']}" for r in sel], rotation=60, fontsize=7)
      ax.set_title(f"{dtype_name} {pass_name}: time per case, as a multiple of the floor")
      ax.grid(axis="y", alpha=0.3)
    row_axes[0].set_ylabel("time / floor (lower is better)")
  axes[0][0].legend(fontsize=8)
  fig.suptitle(f"bench_norms on {device}")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "bench_norms.png"), dpi=100)
  plt.close(fig)


def _implementations(rows):
  """Every implementation timed, in a fixed order: jaxnorm (and its Pallas kernels), flax,
  jnp, then the peers."""
  names = ["jaxnorm"] + ["jaxnorm-pallas"] * any("jaxnorm-pallas" in r for r in rows)
  names += ["flax", "jnp"]
  for r in rows:
    names += [k for k, v in r.items() if isinstance(v, dict) and "ms" in v and k not in names]
  return names


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument(
    "--out", default=None, help="default: benchmarks/results/<device> (a subset: its partial/)"
  )
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
  ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
  ap.add_argument("--only", nargs="+", help="cases whose 'norm/shape' contains one of these")
  ap.add_argument("--no-peers", action="store_true", help="time jaxnorm, flax and jnp only")
  ap.add_argument(
    "--pallas",
    choices=("auto", "on", "off"),
    default="auto",
    help="also time implementation='pallas' (auto: on GPUs and TPUs; on the CPU the kernels "
    "run in Pallas's interpreter, a correctness tool whose times mean nothing)",
  )
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  pallas = args.pallas == "on" or (args.pallas == "auto" and dev.platform in ("gpu", "tpu"))
  device = f"{dev.platform}: {dev.device_kind} (×{len(jax.devices())})"
  print(f"measuring on {device}", flush=True)
  libs = {} if args.no_peers else peers.available()
  print(f"peers: {', '.join(libs) or 'none'} (pip install -e '.[bench]' for all)", flush=True)
  shapes = QUICK_SHAPES if args.quick else SHAPES
  selected(args.only)  # (before any timing: a filter matching nothing stops here)
  partial = bool(args.only or args.quick) or set(args.dtypes) != set(DTYPES)
  out = output_dir(args.out, partial)
  rows = run(shapes, args.repeats, args.dtypes, args.only, libs, pallas)
  summary = summarize(rows)
  for key, s in summary.items():
    print(
      f"{key}: geomean jaxnorm/flax time {s['time']:.3f}, bytes {s['bytes']:.3f}; floor "
      f"x{s['floor']:.2f} (flax x{s['flax_floor']:.2f}), worst x{s['max_floor']:.2f}; worst "
      f"time ratio {s['max_time']:.3f}; Add & Norm {s['add_norm_time']:.3f}; largest excess "
      f"of temporaries {s['max_temp_excess_x']:+.4f}|x|; jaxnorm / best peer "
      f"{s['best_peer_time']:.3f} (worst case {s['max_best_peer']:.3f})"
    )
    if "pallas" in s:
      k = s["pallas"]
      print(
        f"{key}: pallas kernels floor x{k['floor']:.2f} (worst x{k['max_floor']:.2f}), "
        f"/flax {k['time']:.3f} (worst {k['max_time']:.3f}), worst / tokamax triton "
        f"{k['max_vs_tokamax_triton']:.3f}"
      )
  write(out, rows, summary, device, args)
  print(f"wrote {out}/bench_norms.json, .md and .png", flush=True)
  print(json.dumps(dict(device=device, summary=summary)))


if __name__ == "__main__":
  main()
