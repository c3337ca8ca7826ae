"""The device-timed suite: every norm at the shapes users train with, timed on the device.

One command for a GPU when one is lent (minutes at a time, rarely): jaxnorm (XLA and its
Pallas row kernels), Flax, plain ``jnp`` and the peers that import (Equinox, Haiku,
tokamax XLA and Triton), forward and forward+backward, each case's device time
(``devtime.py``: CUPTI on NVIDIA GPUs, else the in-jit loop), its wall clock per call (one
call, end to end, labelled as such) and its floor (the least traffic a norm can have,
``bench_norms.floor_kernels``: forward 2|x|, forward+backward 5|x|, Add & Norm's with its
residual; each floor kernel timed on its own and its compiled bytes recorded against the
traffic it is credited with, ``floor_traffic``), model bytes per second and the
fraction of the copy bandwidth measured in the same run; then whole programs, device-timed:
the training steps of ``bench_e2e.py`` and the ResNet-50, UNet, Transformer and GPT-2
programs of ``tests/models.py`` (:data:`MODEL_STEPS`). Working sets below twice the L2 are
labelled "L2-warm".

Shapes, named (``SUITE``): Llama rows (tokens × 4096, × 8192, bfloat16), GPT-2/ViT rows
(× 768), Liger-Kernel's M = 4096 × N ∈ {1k, 2k, 4k, 8k, 16k} float32 LayerNorm, tokamax's
768 × 768 × 128 bfloat16, ResNet-50 activations (NHWC bfloat16, 256 × 56 × 56 × 64,
256 × 14 × 14 × 1024, and 7 × 7 × 2048 at batches 256 and 64) for BatchNorm and
GroupNorm, a DiT/UNet GroupNorm map; and the modern norms Flax lacks (AdaLN and modulated
RMSNorm at DiT-XL's tokens, DyT at Llama's rows), whose ``/Flax`` column is against the
hand-written ``jnp`` form (``bench_modern.py``).

First, ``pallas_device_check.py``: the Pallas kernels' outputs and gradients against
float64 on the device (its JSON beside the suite's; a kernel with a wrong output is then
left out of the timings and named). After the cases, ``pallas_tune.py`` (``--tune``
seconds): the GPU layouts of the Pallas kernels per row length and dtype, and the
``GPU_TABLE`` entries the run supports. Raw results (JSON and a Markdown table, with the
device's name) go to ``benchmarks/results/<device>/``; ``--budget`` seconds bound the run
(cases in ``SUITE``'s order, the rest listed as skipped); ``--smoke`` runs tiny shapes on
the CPU in seconds (``benchmarks/tests/test_gpu_suite.py``), so that the suite never rots
between GPU runs.

``--variant NAME`` runs an engine alternative of ``variants.py`` on its cases and whole
programs alone (into ``gpu_suite_NAME.*``), to be read against the shipped engine's rows
of the same device run; ``device_run.sh`` is the whole device run in one call.

  python benchmarks/gpu_suite.py [--smoke] [--budget 420] [--tune 180] [--out DIR] [--no-steps]
                                 [--cases REGEX] [--variant NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_modern  # noqa: E402
import bench_norms  # noqa: E402 (puts the repository on the path: tests' case grid)
import devtime  # noqa: E402
import pallas_device_check  # noqa: E402
import pallas_tune  # noqa: E402
import peers  # noqa: E402
import variants  # noqa: E402

from tests import models, programs  # noqa: E402

BF16, F32 = jnp.bfloat16, jnp.float32
SUITE = [  # (shape's name, norm, shape, dtype), in the order they run
  ("Llama rows, 8192 tokens × 4096", "rms", (1, 8192, 4096), BF16),
  ("Llama rows, 8192 tokens × 4096", "add_rms", (1, 8192, 4096), BF16),
  ("Llama rows, 4096 tokens × 8192", "rms", (1, 4096, 8192), BF16),
  ("GPT-2/ViT rows, 16384 tokens × 768", "layer", (32, 512, 768), BF16),
  ("GPT-2/ViT rows, 16384 tokens × 768", "layer", (32, 512, 768), F32),
  ("GPT-2/ViT rows, 16384 tokens × 768", "add_layer", (32, 512, 768), BF16),
  *(("Liger M = 4096", "layer", (1, 4096, n), F32) for n in (1024, 2048, 4096, 8192, 16384)),
  # issue 55's rows beside them: small, long and wide (4096 × 16384 float32 is Liger's)
  *(("rows 1024 × 1024", "layer", (1, 1024, 1024), dt) for dt in (BF16, F32)),
  *(("rows 32768 × 2048", "layer", (1, 32768, 2048), dt) for dt in (BF16, F32)),
  ("rows 4096 × 12288", "layer", (1, 4096, 12288), BF16),  # (gpu.FUSED_ROW's two sides)
  ("rows 4096 × 16384", "layer", (1, 4096, 16384), BF16),
  ("tokamax 768 × 768 × 128", "layer", (768, 768, 128), BF16),
  ("ResNet-50 conv2, 256 × 56 × 56 × 64", "batch_train", (256, 56, 56, 64), BF16),
  ("ResNet-50 conv2, 256 × 56 × 56 × 64", "batch_eval", (256, 56, 56, 64), BF16),
  ("ResNet-50 conv4, 256 × 14 × 14 × 1024", "batch_train", (256, 14, 14, 1024), BF16),
  ("ResNet-50 conv5, 256 × 7 × 7 × 2048", "batch_train", (256, 7, 7, 2048), BF16),
  ("ResNet-50 conv5, 64 a GPU, 64 × 7 × 7 × 2048", "batch_train", (64, 7, 7, 2048), BF16),
  ("ResNet-50 conv2, 256 × 56 × 56 × 64", "group", (256, 56, 56, 64), BF16),
  ("DiT/UNet map, 16 × 64 × 64 × 320", "group", (16, 64, 64, 320), BF16),
  ("DiT/UNet map, 16 × 64 × 64 × 320", "instance", (16, 64, 64, 320), BF16),
  ("SD UNet level 1, batch 2, 2 × 64 × 64 × 320", "group", (2, 64, 64, 320), BF16),  # (chunks)
  # The modern norms against the hand-written jnp forms (bench_modern.py).
  ("DiT-XL tokens, 32 × 256 × 1152", "adaln", (32, 256, 1152), BF16),
  ("DiT-XL tokens, 32 × 256 × 1152", "adarms", (32, 256, 1152), BF16),
  ("Llama rows, 8192 tokens × 4096", "dyt", (1, 8192, 4096), BF16),
]
SMOKE = [
  ("smoke rows", "add_rms", (2, 8, 128), BF16),
  ("smoke map", "group", (2, 4, 4, 64), F32),
  ("smoke tokens", "adaln", (2, 8, 128), BF16),
]
PASSES = ("forward", "fwd+bwd")


def copy_bandwidth(nbytes: int, n: int, min_seconds: float) -> float:
  """Bytes per second of a copy-like kernel (read x, write y) over ``nbytes`` of float32,
  timed as every case is."""
  x = jnp.ones(max(nbytes // 4, 1024), F32)
  copy = jax.jit(lambda x: x * 1.0001 + 0.5)
  seconds, _ = devtime.device_time(copy, (x,), carry=0, n=n, min_seconds=min_seconds)
  return 2 * x.nbytes / seconds if seconds > 0 else float("nan")


def measure_case(
  label, kind, shape, dtype, libs, n, device, copy_bw, min_seconds=0.02, pallas=True
):
  """Rows for one shape and norm: every implementation, both passes; ``to_flax`` against
  Flax's, or for the modern norms Flax lacks the hand-written ``jnp`` form's."""
  if kind in bench_modern.KINDS:
    x0, impls = bench_modern.build(kind, shape, dtype)
    x, cot = x0, x0 * 0.5 + 1
  else:
    x, cot = programs.inputs(kind, shape, dtype)
    impls = bench_norms.build(kind, x, dtype, cot, libs=libs, pallas=pallas)
  floors = bench_norms.floor_kernels(x, cot)
  rows = []
  for pass_ in PASSES:
    # The floor: each kernel timed on its own (fused, forward and backward would share a
    # read of x), the times summed; credited with the bytes its compiled program moves.
    kernels = floors[pass_]
    floor_s = 0.0
    for fn, args, _ in kernels:
      seconds, method = devtime.device_time(fn, args, carry=0, n=n, min_seconds=min_seconds)
      floor_s += seconds
    model_bytes = sum(b for _, _, b in kernels)
    traffic = bench_norms.floor_traffic(kernels)
    times = {}
    for name, (fwd, fwd_bwd, args, cot_in) in impls.items():
      fn, fargs = (fwd, args) if pass_ == "forward" else (fwd_bwd, (*args, cot_in))
      dev_s, method = devtime.device_time(
        fn, fargs, carry=1, n=n, min_seconds=min_seconds, repeats=3 if n < 10 else 5
      )
      wall_s = devtime.wall_time(fn, fargs, repeats=max(3, n // 2))
      faults = devtime.faults_per_call(fn, fargs, calls=3) if device.platform == "cpu" else None
      times[name] = (dev_s, wall_s, faults)
    flax_s = times["flax" if "flax" in times else "jnp"][0]
    for name, (dev_s, wall_s, faults) in times.items():
      rows.append(
        dict(
          shape_name=label,
          norm=kind,
          shape=list(shape),
          dtype=jnp.dtype(dtype).name,
          pass_=pass_,
          impl=name,
          method=method,
          device_us=dev_s * 1e6,
          wall_us=wall_s * 1e6,
          faults_per_call=faults,
          floor_us=floor_s * 1e6,
          floor_traffic=traffic,
          x_floor=dev_s / floor_s if floor_s > 0 else float("nan"),
          to_flax=dev_s / flax_s if flax_s > 0 else float("nan"),
          model_gb_s=model_bytes / dev_s / 1e9 if dev_s > 0 else float("nan"),
          of_copy=model_bytes / dev_s / copy_bw if dev_s > 0 else float("nan"),
          cache=devtime.cache_label(model_bytes, device),
        )
      )
  return rows


# The whole programs of tests/models.py that issue 53 names, beside bench_e2e's steps: the
# ResNet-50 and GroupNorm UNet training steps (one H100 compiled: 1.18x and 0.94x Flax's
# kernels, item 85) and the LayerNorm models' inference, where XLA:GPU's one-kernel row
# norm runs (compiled: fewer kernels, more bytes, 1.1-1.4x Flax's compile time, item 86).
MODEL_STEPS = {
  "ResNet-50 step, batch 8 × 64², float32": ("ResNet50", "training"),
  "GroupNorm UNet step, float32": ("UNetStack", "training"),
  "Pre-LN Transformer inference, float32": ("TransformerStack", "inference"),
  "GPT-2 small inference, 8 × 1024 tokens": ("GPT2Small", "inference"),
}


def step_cases(smoke=False):
  """``{name: make(lib) → (jitted step, args)}``: bench_e2e.py's training steps, then the
  models' programs (:data:`MODEL_STEPS`); ``smoke``: the Transformer stack's inference
  alone, small enough for a CPU."""
  import bench_e2e

  def model(cls_name, program):
    def make(lib):
      fn, variables, x = models.named_programs(cls_name, lib)[program]
      return jax.jit(fn), (variables, x)

    return make

  cases = {} if smoke else {
    "Pre-LN Transformer step, float32": lambda lib: bench_e2e.transformer_step(lib, F32),
    "Pre-LN Transformer step, bfloat16": lambda lib: bench_e2e.transformer_step(lib, BF16),
    "ResNet-18 step, shard_map BatchNorm": bench_e2e.resnet_step,
  }  # fmt: skip
  for name, (cls_name, program) in MODEL_STEPS.items():
    if not smoke or cls_name == "TransformerStack":
      cases[name] = model(cls_name, program)
  return cases


def measure_steps(n, only=None, smoke=False, done=None):
  """Whole steps (:func:`step_cases`), jaxnorm against Flax, device-timed; ``only``: a
  regex over their names; ``done(rows)`` after each, so that a run stopped by its timeout
  keeps the steps it timed."""
  import flax.linen as nn

  import jaxnorm

  rows = []
  for name, make in step_cases(smoke).items():
    if only is not None and not re.search(only, name):
      continue
    t = {}
    for lib in (jaxnorm, nn):
      step, args = make(lib)
      if devtime.cupti_available():
        dev_s, method = devtime.cupti_time(step, args, iterations=n), "cupti"
      else:  # (a step's feedback through every parameter is no loop to compile here)
        dev_s, method = devtime.wall_time(step, args, repeats=max(3, n // 4)), "wall"
      t[lib.__name__] = (dev_s, devtime.wall_time(step, args, repeats=max(3, n // 4)), method)
    (a, wa, method), (b, wb, _) = t["jaxnorm"], t["flax.linen"]
    rows.append(
      dict(
        step=name,
        method=method,
        jaxnorm_us=a * 1e6,
        flax_us=b * 1e6,
        to_flax=a / b,
        jaxnorm_wall_us=wa * 1e6,
        flax_wall_us=wb * 1e6,
      )  # fmt: skip
    )
    print(f"{name}: jaxnorm {a * 1e6:.0f} µs, Flax {b * 1e6:.0f} µs ({method})", flush=True)
    if done is not None:
      done(rows)
  return rows


def markdown(meta, rows, steps, skipped):
  lines = [
    f"# Device-timed suite: {meta['device']}",
    "",
    *([f"Variant {meta['variant']} (`variants.py`).", ""] if meta.get("variant") else []),
    f"jax {meta['jax']}, flax {meta['flax']}; timing: {meta['method']}; copy bandwidth "
    f"{meta['copy_gb_s']:.0f} GB/s (read + write, same method); L2 {meta['l2']}; "
    f"{meta['seconds']:.0f} s. `device µs`: kernels only (CUPTI) or per iteration of an "
    "in-jit loop; `wall µs`: one call, end to end (dispatch included). `×floor`: against "
    "kernels of the least traffic (forward 2|x|, forward+backward 5|x|, Add & Norm with its "
    "residual read and h written; each kernel timed apart, the times summed), timed the "
    "same way; `floor bytes`: their compiled bytes over that traffic (1.00: each is the "
    "one fusion it models); `GB/s`, `of copy`: that model traffic over the device time; "
    "`faults`: minor page faults per call on a CPU (first touches of fresh outputs, in the "
    "wall clock only).",
    "",
    "| shape | norm | dtype | pass | impl | device µs | wall µs | faults | ×floor "
    "| floor bytes | /Flax | GB/s | of copy | cache |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    faults = "—" if r["faults_per_call"] is None else f"{r['faults_per_call']:.0f}"
    lines.append(
      f"| {r['shape_name']} ({'×'.join(map(str, r['shape']))}) | {r['norm']} | {r['dtype']} "
      f"| {r['pass_']} | {r['impl']} "
      f"| {r['device_us']:.1f} | {r['wall_us']:.1f} | {faults} | {r['x_floor']:.2f} "
      f"| {r['floor_traffic']:.2f} | {r['to_flax']:.3f} | {r['model_gb_s']:.0f} "
      f"| {r['of_copy']:.2f} | {r['cache']} |"
    )
  if steps:
    lines += ["", "| whole step | method | jaxnorm µs | Flax µs | /Flax | wall: jaxnorm, Flax µs |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for s in steps:
      lines.append(
        f"| {s['step']} | {s['method']} | {s['jaxnorm_us']:.0f} | {s['flax_us']:.0f} "
        f"| {s['to_flax']:.3f} | {s['jaxnorm_wall_us']:.0f}, {s['flax_wall_us']:.0f} |"
      )
  if skipped:
    lines += ["", "Skipped (budget): " + "; ".join(skipped)]
  if meta.get("pallas_check_ok") is False:
    lines += ["", "The Pallas kernels failed `pallas_device_check.py` (its JSON beside this)."]
  if meta.get("excluded"):
    lines += ["", "Left out for a wrong output: " + "; ".join(meta["excluded"])]
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU, seconds")
  ap.add_argument("--budget", type=float, default=420.0, help="seconds for the norm cases")
  ap.add_argument(
    "--out", default=None, help="default: benchmarks/results/<device>/ (a subset: its partial/)"
  )
  ap.add_argument("--no-steps", action="store_true", help="skip the whole training steps")
  ap.add_argument("--iterations", type=int, default=None)
  ap.add_argument("--cases", default=None, help="a regex over 'shape norm dtype 1x8x128'")
  ap.add_argument("--variant", default=None, choices=sorted(variants.VARIANTS),
                  help="time an engine alternative (variants.py) on its cases alone")  # fmt: skip
  ap.add_argument("--tune", type=float, default=180.0, help="seconds for pallas_tune.py")
  args = ap.parse_args(argv)
  variant = variants.VARIANTS[args.variant] if args.variant else None
  if variant:  # (before anything is traced; the Pallas check and tuner are the shipped
    variant.apply(setattr)  # run's, and its steps those the variant names)
    args.cases, args.no_steps, args.tune = args.cases or variant.cases, not variant.steps, 0
  start = time.perf_counter()
  device = jax.devices()[0]
  suite = SMOKE if args.smoke else SUITE
  n = args.iterations or (4 if args.smoke else 20)
  min_seconds = 0.002 if args.smoke else 0.02
  libs = {} if args.smoke or variant else peers.available()  # (a variant: against Flax)
  copy_bw = copy_bandwidth((1 << 20) if args.smoke else (1 << 30), n, min_seconds)
  print(f"{device.device_kind}: copy {copy_bw / 1e9:.0f} GB/s", flush=True)
  # (a subset, --cases or --smoke, into results/<device>/partial: never over the full run)
  subset = args.smoke or bool(args.cases and not variant)
  out = bench_norms.output_dir(args.out, subset, device)
  os.makedirs(out, exist_ok=True)
  excluded_before = len(bench_norms.EXCLUDED)  # (this run's exclusions: those after it)
  checked = None  # (the Pallas kernels' outputs against float64 first: on a CPU, the smoke's)
  if (args.smoke or device.platform != "cpu") and not variant:
    checked = pallas_device_check.main((["--smoke"] if args.smoke else []) + ["--out", out])
  rows, skipped = [], []
  for label, kind, shape, dtype in suite:
    name = f"{label} {kind} {jnp.dtype(dtype).name}"
    if args.cases and not re.search(args.cases, f"{name} {'x'.join(map(str, shape))}"):
      continue
    if time.perf_counter() - start > args.budget:
      skipped.append(name)
      continue
    # (the Pallas kernels run interpreted on a CPU: its times mean nothing, past the smoke run)
    pallas = (args.smoke or device.platform != "cpu") and not variant
    case = measure_case(label, kind, shape, dtype, libs, n, device, copy_bw, min_seconds, pallas)
    rows += case
    best = {r["pass_"]: r["to_flax"] for r in case if r["impl"] == "jaxnorm"}
    print(f"{name}: jaxnorm/Flax {best}", flush=True)
  import flax

  stem = f"gpu_suite_{args.variant}" if args.variant else "gpu_suite"

  def write(steps):
    meta = dict(
      device=f"{device.platform}: {device.device_kind}",
      jax=jax.__version__,
      flax=flax.__version__,
      method=rows[0]["method"] if rows else "none",
      copy_gb_s=copy_bw / 1e9,
      l2=devtime.l2_bytes(device),
      iterations=n,
      smoke=args.smoke,
      seconds=time.perf_counter() - start,
      excluded=bench_norms.EXCLUDED[excluded_before:],
      pallas_check_ok=checked,
      variant=args.variant and f"{args.variant}: {variant.doc}",
    )
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
      json.dump(dict(meta=meta, rows=rows, steps=steps, skipped=skipped), f, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
      f.write(markdown(meta, rows, steps, skipped))
    return meta

  write([])  # (the norms' rows are kept should a whole step fail)
  if (args.smoke or device.platform != "cpu") and args.tune > 0:  # the GPU table's layouts
    pallas_tune.main(
      (["--smoke"] if args.smoke else []) + ["--budget", str(args.tune), "--out", out]
    )
  only = variant.steps if variant else None
  steps = [] if args.no_steps else measure_steps(n, only, args.smoke, done=write)
  meta = write(steps)
  print(f"wrote {out}/{stem}.json and {stem}.md in {meta['seconds']:.0f} s", flush=True)
  return meta, rows


if __name__ == "__main__":
  main()
