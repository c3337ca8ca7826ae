"""The GPU table of the Pallas row kernels, measured (issue 55, point 1): for each padded
row length and dtype, LayerNorm's forward+backward through the kernels timed on the device
at each candidate layout (rows per block, Triton warps, programs of the persistent
backward grid), beside the rule's layout, jaxnorm's XLA path and the floor
(``bench_norms.floor_kernels``), all in one process.

Writes ``pallas_tune.json`` and ``pallas_tune.md`` (every candidate's time, each cell's best
against the rule, XLA and the floor) and prints the ``GPU_TABLE`` entries whose best layout
beat the rule's by more than 3 % — the lines to commit to ``jaxnorm/_engine/pallas.py`` with these
results. ``gpu_suite.py`` runs it after its cases, with what is left of its budget.
``--smoke`` runs one tiny cell on the CPU (interpreted: the layouts change nothing there and
the times mean nothing), so that it works the day a GPU is lent.

  python benchmarks/pallas_tune.py [--smoke] [--budget 240] [--out DIR]

(``--out`` defaults to ``benchmarks/results/<device>/``, as the suite's.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_norms  # noqa: E402 (puts the repository on the path: tests' case grid)
import devtime  # noqa: E402

import jaxnorm  # noqa: E402
from jaxnorm._engine import pallas as _pallas  # noqa: E402
from tests import programs  # noqa: E402

# (row length, dtype), in the order they run (a budget may stop it): bfloat16 first, Llama's
# and GPT-2's rows (768 pads to 1,024) first
CELLS = [(d, dt) for dt in (jnp.bfloat16, jnp.float32) for d in (4096, 1024, 8192, 2048, 16384)]
ELEMENTS = 1 << 25  # per cell: 64 MiB of bfloat16, past an H100's 50 MiB of L2
BEATS = 0.97  # a measured entry replaces the rule where it takes under 97 % of its time


def candidates(d: int) -> list[tuple[int, int, int]]:
  """The rule's layout first, then blocks of the rule's rows and of twice as many (up to
  8,192 elements), with 4, 8 or 16 warps, over half, one or two programs per SM."""
  dp = _pallas._next_power_of_2(d)
  rule = _pallas.gpu_rule(dp)
  rows = [r for r in (rule[0], rule[0] * 2) if r * dp <= max(dp, 8192)]
  sms = _pallas.SMS
  grid = itertools.product(rows, (4, 8, 16), (sms // 2, sms, sms * 2))
  return [rule, *(c for c in grid if c != rule)]


def _step(implementation):
  def fwd_bwd(x, g, b, ct):
    y, vjp = jax.vjp(
      lambda x, g, b: jaxnorm.layer_norm(x, g, b, dtype=x.dtype, implementation=implementation),
      x,
      g,
      b,
    )
    return y, *vjp(ct)

  return jax.jit(fwd_bwd)


def measure_cell(d, dtype, layouts, n, min_seconds, deadline, elements=ELEMENTS):
  """Times for one cell of ``elements``: the floor, XLA, then each layout (until
  ``deadline``)."""
  dtype = jnp.dtype(dtype)
  rows = max(8, elements // d)
  x, ct = programs.inputs("layer", (rows, d), dtype)
  g, b = jnp.ones((d,), jnp.float32), jnp.zeros((d,), jnp.float32)
  args = (x, g, b, ct)
  floor = sum(
    devtime.device_time(fn, fargs, carry=0, n=n, min_seconds=min_seconds)[0]
    for fn, fargs, _ in bench_norms.floor_kernels(x, ct)["fwd+bwd"]
  )
  xla, method = devtime.device_time(_step("xla"), args, n=n, min_seconds=min_seconds)
  reference = _step("xla")(*args)
  key = (_pallas._next_power_of_2(d), dtype.itemsize)
  out = dict(d=d, dtype=dtype.name, rows=rows, floor_us=floor * 1e6, xla_us=xla * 1e6)
  out.update(method=method, layouts=[])
  saved = _pallas.GPU_TABLE.get(key)
  try:
    for layout in layouts:
      if time.perf_counter() > deadline:
        break
      _pallas.GPU_TABLE[key] = layout
      jax.clear_caches()  # (the kernels' programs are cached per shape, not per layout)
      step = _step("pallas")
      try:
        error = max(  # every output checked against XLA's: a layout must not change them
          float(jnp.max(jnp.abs(a.astype(jnp.float32) - e.astype(jnp.float32))))
          / max(float(jnp.max(jnp.abs(e.astype(jnp.float32)))), 1e-30)
          for a, e in zip(step(*args), reference, strict=True)
        )
        seconds, _ = devtime.device_time(step, args, n=n, min_seconds=min_seconds)
      except Exception as e:  # (a layout Triton cannot compile: named, the run goes on)
        error, seconds, failed = float("inf"), float("inf"), f"{type(e).__name__}: {e}"[:300]
      else:
        failed = None
      out["layouts"].append(dict(layout=list(layout), us=seconds * 1e6, error=error, failed=failed))
  finally:
    if saved is None:
      _pallas.GPU_TABLE.pop(key, None)
    else:
      _pallas.GPU_TABLE[key] = saved
    jax.clear_caches()
  return out


def decide(cells, tolerance):
  """The ``GPU_TABLE`` entries a run supports: per cell, the fastest layout whose outputs
  agree with XLA's within ``tolerance``, where it beats the rule's (the first) by more
  than 3 %."""
  table = {}
  for cell in cells:
    fine = [c for c in cell["layouts"] if c["error"] <= tolerance[cell["dtype"]]]
    if len(cell["layouts"]) < 2 or not fine or cell["layouts"][0] not in fine:
      continue
    best = min(fine, key=lambda c: c["us"])
    if best["us"] < BEATS * cell["layouts"][0]["us"]:
      key = (_pallas._next_power_of_2(cell["d"]), jnp.dtype(cell["dtype"]).itemsize)
      table[key] = tuple(best["layout"])
  return table


def _ratio(a, b):
  return a / b if b > 0 else float("nan")  # (a CPU's loop time can round to 0)


def markdown(meta, cells, table, elements):
  lines = [
    f"# Pallas GPU layouts: {meta['device']}",
    "",
    f"jax {meta['jax']}, {meta['method']}, LayerNorm forward+backward of {elements:,} "
    "elements per cell; times in µs. Rule: the layout of `_pallas._layout` without a "
    "table entry; best: the fastest layout whose outputs agree with XLA's.",
    "",
    "| D | dtype | floor | XLA | rule (rows, warps, programs) | best | best / rule | × floor |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for c in cells:
    if not c["layouts"]:
      continue
    rule, best = c["layouts"][0], min(c["layouts"], key=lambda r: r["us"])
    lines.append(
      f"| {c['d']} | {c['dtype']} | {c['floor_us']:.1f} | {c['xla_us']:.1f} | "
      f"{rule['us']:.1f} {tuple(rule['layout'])} | {best['us']:.1f} {tuple(best['layout'])} | "
      f"{_ratio(best['us'], rule['us']):.3f} | {_ratio(best['us'], c['floor_us']):.2f} |"
    )
  lines += ["", "GPU_TABLE entries this run supports (commit them with these results):", ""]
  lines += [f"    {k}: {v}," for k, v in sorted(table.items())] or ["    (none)"]
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="one tiny cell, CPU, seconds")
  ap.add_argument("--budget", type=float, default=240.0, help="seconds in all")
  ap.add_argument("--out", default=None, help="default: benchmarks/results/<device>/")
  args = ap.parse_args(argv)
  deadline = time.perf_counter() + args.budget
  device = jax.devices()[0]
  elements = 4096 if args.smoke else ELEMENTS
  cells_to_run = [(1024, jnp.float32)] if args.smoke else CELLS
  n, min_seconds = (3, 0.002) if args.smoke else (20, 0.02)
  cells = []
  for d, dtype in cells_to_run:
    if time.perf_counter() > deadline:
      break
    layouts = candidates(d)[: 2 if args.smoke else None]
    cells.append(measure_cell(d, dtype, layouts, n, min_seconds, deadline, elements))
    print(f"pallas_tune {d} {jnp.dtype(dtype).name}: {len(cells[-1]['layouts'])} layouts")
  table = decide(cells, {"bfloat16": 2e-2, "float32": 1e-4})
  meta = dict(
    device=f"{device.platform}: {device.device_kind}",
    jax=jax.__version__,
    method=cells[0]["method"] if cells else "none",
    smoke=args.smoke,
  )

  out = args.out or bench_norms.results_dir(device)
  os.makedirs(out, exist_ok=True)
  serial = {f"{k[0]},{k[1]}": list(v) for k, v in table.items()}
  with open(os.path.join(out, "pallas_tune.json"), "w") as f:
    json.dump(dict(meta=meta, cells=cells, table=serial), f, indent=1)
  with open(os.path.join(out, "pallas_tune.md"), "w") as f:
    f.write(markdown(meta, cells, table, elements))
  for key, value in sorted(table.items()):
    print(f"GPU_TABLE[{key}] = {value}")
  return meta, cells, table


if __name__ == "__main__":
  main()
