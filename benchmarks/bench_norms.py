"""The benchmark suite: every norm, jaxnorm vs flax.linen vs plain jnp, time and traffic.

For each norm (BatchNorm training and inference, LayerNorm, RMSNorm, GroupNorm,
InstanceNorm) at Transformer shapes (B, T, D) with D in {768, 4096} and an NHWC CNN shape
whose working set exceeds the CPU caches, it measures the forward pass and the
forward+backward pass (a VJP with a random cotangent, gradients w.r.t. the input and the
parameters), each jit-compiled:

- time: runs interleaved after compilation (A B C C B A ...), medians, ratios to Flax;
- traffic: XLA's ``cost_analysis()`` bytes accessed and ``memory_analysis()`` temporaries,
  as multiples of |x| (the input's bytes);
- achieved bandwidth: bytes accessed / time, as a fraction of what a same-run reference
  kernel of known traffic (read x, write y: 2|x|) achieves on this machine.

Writes ``bench_norms.json``, ``bench_norms.md`` (tables) and ``bench_norms.png`` into
``--out`` and says which device it measured; runs unchanged on a GPU or TPU.

  python benchmarks/bench_norms.py [--out benchmarks/results] [--repeats 15] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm

SHAPES = {
  "tfm768": (16, 512, 768),
  "tfm4096": (4, 1024, 4096),
  "cnn": (32, 56, 56, 64),
}
QUICK_SHAPES = {"tfm768": (4, 128, 768), "tfm4096": (1, 128, 4096), "cnn": (8, 28, 28, 64)}


def _plain_stats(x, axes):
  mean = x.mean(axes, keepdims=True)
  return mean, ((x - mean) ** 2).mean(axes, keepdims=True)


def _plain(kind):
  """A hand-written jnp version of each norm: two-pass statistics, autodiff backward."""

  def affine(y, p, shape):
    return y * p["scale"].reshape(shape) + p["bias"].reshape(shape)

  def fn(p, x):
    c = x.shape[-1]
    shape = (1,) * (x.ndim - 1) + (c,)
    if kind in ("batch_train", "batch_eval"):
      axes = tuple(range(x.ndim - 1))
      if kind == "batch_eval":
        mean, var = p["mean"].reshape(shape), p["var"].reshape(shape)
      else:
        mean, var = _plain_stats(x, axes)
      return affine((x - mean) * jax.lax.rsqrt(var + 1e-5), p, shape)
    if kind == "layer":
      axes = tuple(range(1, x.ndim)) if x.ndim == 4 else (-1,)
      mean, var = _plain_stats(x, axes)
      return affine((x - mean) * jax.lax.rsqrt(var + 1e-6), p, shape)
    if kind == "rms":
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

  return fn


def _module(lib, kind, ndim):
  if kind == "batch_train":
    return lib.BatchNorm(use_running_average=False)
  if kind == "batch_eval":
    return lib.BatchNorm(use_running_average=True)
  if kind == "layer":
    return lib.LayerNorm(reduction_axes=(1, 2, 3)) if ndim == 4 else lib.LayerNorm()
  if kind == "rms":
    return lib.RMSNorm()
  if kind == "group":
    return lib.GroupNorm(num_groups=32)
  if kind == "instance":
    return lib.InstanceNorm()
  raise ValueError(kind)


CASES = [  # (norm, shape)
  *((k, s) for s in ("tfm768", "tfm4096") for k in ("layer", "rms", "batch_train", "batch_eval")),
  *(
    ("batch_train", "cnn"),
    ("batch_eval", "cnn"),
    ("layer", "cnn"),
    ("group", "cnn"),
    ("instance", "cnn"),
  ),
]


def build(kind, x):
  """Returns {impl: (forward, fwd+bwd, params)} for jaxnorm, flax and plain jnp."""
  impls = {}
  for name, lib in (("jaxnorm", jaxnorm), ("flax", nn)):
    module = _module(lib, kind, x.ndim)
    variables = _module(nn, kind, x.ndim).init(jax.random.key(0), x)
    if "batch_stats" in variables:  # non-trivial running statistics for inference
      variables["batch_stats"] = {
        "mean": jnp.full_like(variables["batch_stats"]["mean"], 0.1),
        "var": jnp.full_like(variables["batch_stats"]["var"], 1.5),
      }
    rest = {k: v for k, v in variables.items() if k != "params"}
    mutable = ["batch_stats"] if kind == "batch_train" else False

    def forward(params, x, rest, module=module, mutable=mutable):
      out = module.apply({"params": params, **rest}, x, mutable=mutable)
      return out[0] if mutable else out

    impls[name] = (forward, variables["params"], rest)
  plain = _plain(kind)
  params = dict(impls["flax"][1])
  rest = {}
  if kind == "batch_eval":
    rest = {"mean": jnp.full(x.shape[-1], 0.1), "var": jnp.full(x.shape[-1], 1.5)}
  impls["jnp"] = (lambda p, x, rest: plain({**p, **rest}, x), params, rest)

  # Running statistics are arguments of the compiled step, as in a real training or
  # evaluation step (closed over, XLA would fold them into constants).
  out = {}
  for name, (forward, params, rest) in impls.items():

    def fwd_bwd(params, x, rest, cot, forward=forward):
      y, vjp = jax.vjp(lambda p, x: forward(p, x, rest), params, x)
      return y, vjp(cot)

    out[name] = (jax.jit(forward), jax.jit(fwd_bwd), (params, x, rest))
  return out


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


def reference_bandwidth(x, repeats):
  """Bytes per second of a kernel that reads x and writes y once (2|x|), same run."""
  copy = jax.jit(lambda x: x * 1.0001 + 0.5)
  t = timed({"copy": lambda: copy(x)}, repeats)["copy"]
  return 2 * x.nbytes / t


def geomean(values):
  values = [v for v in values if v > 0 and math.isfinite(v)]
  return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def run(shapes, repeats):
  rows = []
  for kind, shape_name in CASES:
    x = jax.random.normal(jax.random.key(1), shapes[shape_name], jnp.float32)
    cot = jax.random.normal(jax.random.key(2), x.shape, jnp.float32)
    impls = build(kind, x)
    bandwidth = reference_bandwidth(x, repeats)
    for p, pass_name in ((0, "forward"), (1, "fwd+bwd")):
      fns = {name: impl[p] for name, impl in impls.items()}
      args = {name: impl[2] + ((cot,) if p else ()) for name, impl in impls.items()}
      medians = timed({n: (lambda f=fns[n], a=args[n]: f(*a)) for n in fns}, repeats)
      row = dict(norm=kind, shape=shape_name, dims=list(x.shape), pass_=pass_name)
      for name in fns:
        bytes_x, temp_x = analyse(fns[name], args[name], x.nbytes)
        t = medians[name]
        row[name] = dict(
          ms=t * 1e3,
          bytes_x=bytes_x,
          temp_x=temp_x,
          bandwidth_fraction=bytes_x * x.nbytes / t / bandwidth,
        )
      row["ratio_time"] = row["jaxnorm"]["ms"] / row["flax"]["ms"]
      row["ratio_bytes"] = row["jaxnorm"]["bytes_x"] / row["flax"]["bytes_x"]
      row["jnp_ratio_time"] = row["jnp"]["ms"] / row["flax"]["ms"]
      rows.append(row)
      print(
        f"{kind:12s} {shape_name:8s} {pass_name:8s} time {row['ratio_time']:.3f}  "
        f"bytes {row['ratio_bytes']:.3f}  (jaxnorm {row['jaxnorm']['bytes_x']:.1f}|x|, "
        f"flax {row['flax']['bytes_x']:.1f}|x|, temp {row['jaxnorm']['temp_x']:.1f} vs "
        f"{row['flax']['temp_x']:.1f}|x|)",
        flush=True,
      )
  return rows


def summarize(rows):
  out = {}
  for pass_name in ("forward", "fwd+bwd"):
    sel = [r for r in rows if r["pass_"] == pass_name]
    out[pass_name] = dict(
      time=geomean([r["ratio_time"] for r in sel]),
      bytes=geomean([r["ratio_bytes"] for r in sel]),
      jnp_time=geomean([r["jnp_ratio_time"] for r in sel]),
      max_temp_excess_x=max(r["jaxnorm"]["temp_x"] - r["flax"]["temp_x"] for r in sel),
    )
  return out


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
    f"{args.repeats} interleaved runs.",
    "",
    "| norm | shape | pass | jaxnorm ms | flax ms | jnp ms | time jaxnorm/flax | bytes "
    "jaxnorm, flax (×\\|x\\|) | temp jaxnorm, flax (×\\|x\\|) | bandwidth fraction jaxnorm, "
    "flax |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    j, fl, p = r["jaxnorm"], r["flax"], r["jnp"]
    lines.append(
      f"| {r['norm']} | {'×'.join(map(str, r['dims']))} | {r['pass_']} | {j['ms']:.2f} | "
      f"{fl['ms']:.2f} | {p['ms']:.2f} | {r['ratio_time']:.3f} | {j['bytes_x']:.1f}, "
      f"{fl['bytes_x']:.1f} | {j['temp_x']:.1f}, {fl['temp_x']:.1f} | "
      f"{j['bandwidth_fraction']:.2f}, {fl['bandwidth_fraction']:.2f} |"
    )
  lines += [
    "",
    "| pass | time jaxnorm/flax | bytes jaxnorm/flax | time jnp/flax | "
    "largest excess of temporaries over flax (×\\|x\\|) |",
    "|---|---|---|---|---|",
  ]
  for pass_name, s in summary.items():
    lines.append(
      f"| {pass_name} | {s['time']:.3f} | {s['bytes']:.3f} | {s['jnp_time']:.3f} | "
      f"{s['max_temp_excess_x']:+.4f} |"
    )
  with open(os.path.join(out_dir, "bench_norms.md"), "w") as f:
    f.write("\n".join(lines) + "\n")

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
  for ax, pass_name in zip(axes, ("forward", "fwd+bwd"), strict=True):
    sel = [r for r in rows if r["pass_"] == pass_name]
    labels = [f"{r['norm']}\n{r['shape']}" for r in sel]
    pos = np.arange(len(sel))
    ax.bar(pos - 0.2, [r["ratio_time"] for r in sel], 0.4, label="time")
    ax.bar(pos + 0.2, [r["ratio_bytes"] for r in sel], 0.4, label="bytes accessed")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(pos, labels, rotation=60, fontsize=7)
    ax.set_title(f"{pass_name}: jaxnorm / flax.linen")
    ax.grid(axis="y", alpha=0.3)
  axes[0].legend()
  axes[0].set_ylabel("ratio (lower is better)")
  fig.suptitle(f"bench_norms on {device}")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "bench_norms.png"), dpi=110)
  plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="benchmarks/results")
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  device = f"{dev.platform}: {dev.device_kind} (×{len(jax.devices())})"
  print(f"measuring on {device}", flush=True)
  rows = run(QUICK_SHAPES if args.quick else SHAPES, args.repeats)
  summary = summarize(rows)
  for pass_name, s in summary.items():
    print(
      f"geometric mean jaxnorm/flax, {pass_name}: time {s['time']:.3f}, bytes "
      f"{s['bytes']:.3f}; jnp/flax time {s['jnp_time']:.3f}; largest excess of temporaries "
      f"over flax {s['max_temp_excess_x']:+.4f}|x|"
    )
  write(args.out, rows, summary, device, args)
  print(json.dumps(dict(device=device, summary=summary)))


if __name__ == "__main__":
  main()
