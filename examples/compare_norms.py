"""Puts the usual advice on norms to the test, with the two examples.

The advice (from the notes this project grew from): BatchNorm for large-batch CNNs but
unstable at small batch; GroupNorm for small batches; LayerNorm or RMSNorm for
Transformers, RMSNorm being cheaper. This script trains

- the mini CNN with every norm at batch sizes 2, 8, 32 and 128 (same number of epochs, so
  the same number of images seen, with Adam's learning rate scaled by sqrt(batch/32);
  several seeds), and
- the mini Transformer with LayerNorm and RMSNorm, Pre-LN and Post-LN (same steps),

and writes ``norm_comparison.md`` (tables), ``norm_comparison.png`` (plots) and
``norm_comparison.json`` (raw numbers) into ``--out`` (default ``results/compare_norms``;
the docs' copy is regenerated with ``--out docs/studies``). About 15 minutes on 2 CPU cores:

  python examples/compare_norms.py [--out results/compare_norms] [--seeds 2] [--epochs 8]
      [--steps 600] [--tf-seeds 1]
  python examples/compare_norms.py --extend docs/studies/norm_comparison.json --tf-seeds 20 \
      --out docs/studies    # more Transformer seeds for a run, its CNN kept
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import time

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mini_cnn  # noqa: E402
import mini_transformer  # noqa: E402
from tqdm import tqdm  # noqa: E402

BATCH_SIZES = (2, 8, 32, 128)
# The small-batch remedies (Batch Renorm, ghost batches) have their own study.
CNN_NORMS = tuple(n for n in mini_cnn.NORMS if n not in ("renorm", "ghost"))
TF_NORMS = ("layer", "rms")


def quietly(fn, **kwargs):
  """Runs an example's ``train`` without its per-run output."""
  with contextlib.redirect_stdout(io.StringIO()):
    return fn(out=None, progress=False, **kwargs)


def run_cnn(seeds: int, epochs: int) -> dict:
  runs = [(n, b, s) for n in CNN_NORMS for b in BATCH_SIZES for s in range(seeds)]
  acc = {}
  for norm, batch, seed in tqdm(runs, desc="CNN runs"):
    lr = 3e-3 * (batch / 32) ** 0.5
    r = quietly(mini_cnn.train, norm=norm, batch_size=batch, epochs=epochs, seed=seed, lr=lr)
    acc.setdefault(norm, {}).setdefault(batch, []).append((r["test_accuracy"], r["seconds"]))
  return acc


def run_transformer(steps: int, seeds: int = 1, first: int = 0) -> dict:
  """``{"<norm>-<pre|post>": [result per seed]}`` for LayerNorm and RMSNorm, Pre-LN and
  Post-LN, seeds ``first`` to ``seeds − 1``."""
  out: dict = {}
  configs = [(n, p, s) for p in (False, True) for n in TF_NORMS for s in range(first, seeds)]
  for norm, post, seed in tqdm(configs, desc="Transformer runs"):
    r = quietly(
      mini_transformer.train, norm=norm, post_ln=post, steps=steps, sample_length=0,
      history=True, seed=seed,
    )  # fmt: skip
    out.setdefault(f"{norm}-{'post' if post else 'pre'}", []).append(r)
  return out


def spread(values) -> str:
  """``mean ± std (smallest–largest)`` of one setting's figures over the seeds."""
  a = np.asarray(values)
  return f"{a.mean():.3f} ± {a.std():.3f} ({a.min():.3f}–{a.max():.3f})"


def _fastest(tf, name):
  """The fastest training of one configuration, in seconds: on a shared machine the
  other runs' times include other work."""
  return min(r["seconds"] for r in tf[name])


def _final(tf, name):
  """The final validation losses of one Transformer configuration, one per seed."""
  return np.array([r["final_loss"] for r in tf[name]])


def _acc(cnn, norm, batch):
  a = np.array([x[0] for x in cnn[norm][batch]])
  return a.mean(), a.std()


def _versus(a, b):
  """'higher'/'lower'/'within noise' for two (mean, std) pairs (noise: 2 std, or 0.005)."""
  noise = max(2 * max(a[1], b[1]), 0.005)
  if abs(a[0] - b[0]) <= noise:
    return "within noise of"
  return "above" if a[0] > b[0] else "below"


def reading(cnn: dict, tf: dict) -> list[str]:
  """The advice, checked against this run's numbers (the sentences follow the data)."""
  small, large = BATCH_SIZES[0], BATCH_SIZES[-1]
  bn_small, bn_large = _acc(cnn, "batch", small), _acc(cnn, "batch", large)
  gn_small = _acc(cnn, "group", small)
  best_large = max(cnn, key=lambda n: _acc(cnn, n, large)[0])
  ln, rms = _final(tf, "layer-pre"), _final(tf, "rms-pre")
  post_ln, post_rms = _final(tf, "layer-post"), _final(tf, "rms-post")
  time_ratio = _fastest(tf, "rms-pre") / _fastest(tf, "layer-pre")
  bn_verdict = _versus(bn_small, bn_large)
  lines = [
    f"- *BatchNorm for large-batch CNNs*: at batch {large}, BatchNorm reaches "
    f"{bn_large[0]:.3f} and the best norm there is **{best_large}** "
    f"({_acc(cnn, best_large, large)[0]:.3f}); with the same number of epochs, a batch of "
    f"{large} means {BATCH_SIZES[-1] // BATCH_SIZES[0]}× fewer updates than a batch of {small}.",
    f"- *BatchNorm unstable at small batch*: at batch {small}, BatchNorm reaches "
    f"{bn_small[0]:.3f} ± {bn_small[1]:.3f}, {bn_verdict} its accuracy at batch {large}"
    + (
      ": on this small, easy task the noise of two-image statistics did not hurt "
      "(evaluation uses the running averages, momentum 0.9)."
      if bn_verdict != "below"
      else ": the advice holds here."
    ),
    f"- *GroupNorm for small batches*: at batch {small}, GroupNorm reaches "
    f"{gn_small[0]:.3f} ± {gn_small[1]:.3f}, {_versus(gn_small, bn_small)} BatchNorm.",
    f"- *Normalization helps at all*: without a norm the CNN reaches "
    f"{_acc(cnn, 'none', 32)[0]:.3f} at batch 32 against {_acc(cnn, 'batch', 32)[0]:.3f} "
    f"with BatchNorm.",
    f"- *LayerNorm or RMSNorm for Transformers, RMSNorm cheaper*: Pre-LN validation loss "
    f"{ln.mean():.3f} (LayerNorm) vs {rms.mean():.3f} (RMSNorm), RMSNorm's lower in "
    f"{int((rms < ln).sum())} of {len(ln)} seeds; Post-LN {post_ln.mean():.3f} vs "
    f"{post_rms.mean():.3f}, in {int((post_rms < post_ln).sum())} of {len(ln)}. Training "
    f"time RMSNorm/LayerNorm: {time_ratio:.2f} (Pre-LN, fastest runs on a shared machine)"
    + (
      ": at this model size the norms are a small share of the compute, so RMSNorm's "
      "saving barely shows in the wall-clock time."
      if time_ratio > 0.95
      else "."
    )
    + " Both placements train stably at this depth (3 blocks).",
  ]
  return lines


def write_report(out_dir: str, cnn: dict, tf: dict, args, seconds: float) -> None:
  os.makedirs(out_dir, exist_ok=True)
  lines = [
    "# Which norm when: measured",
    "",
    "Regenerate with `python examples/compare_norms.py --out docs/studies "
    f"--seeds {args.seeds} --tf-seeds {args.tf_seeds} --epochs {args.epochs} "
    f"--steps {args.steps}` "
    f"({seconds / 60:.0f} minutes on {os.cpu_count()} CPU cores, {platform.machine()}, "
    f"jax {jax.__version__}, device {jax.devices()[0].platform}).",
    "",
    f"## Mini CNN on digits: test accuracy by batch size ({args.epochs} epochs, Adam with "
    f"learning rate 3e-3·sqrt(batch/32), mean ± std (smallest–largest) over {args.seeds} "
    f"seeds)",
    "",
    "| norm | " + " | ".join(f"batch {b}" for b in BATCH_SIZES) + " |",
    "|---|" + "---|" * len(BATCH_SIZES),
  ]
  for norm, by_batch in cnn.items():
    cells = []
    for b in BATCH_SIZES:
      cells.append(spread([x[0] for x in by_batch[b]]))
    lines.append(f"| {norm} | " + " | ".join(cells) + " |")
  lines += [
    "",
    f"## Mini Transformer on Genesis (KJV): validation loss ({args.steps} steps, mean ± std "
    f"(smallest–largest) over {args.tf_seeds} seeds)",
    "",
    "| norm | placement | initial loss | final loss | final / initial | seconds (fastest) |",
    "|---|---|---|---|---|---|",
  ]
  for name, runs in tf.items():
    norm, place = name.split("-")
    first, final = np.array([r["initial_loss"] for r in runs]), _final(tf, name)
    lines.append(
      f"| {norm} | {place}-LN | {first.mean():.3f} | {spread(final)} | "
      f"{(final / first).mean():.3f} | {_fastest(tf, name):.1f} |"
    )
  lines += ["", "![plots](norm_comparison.png)", "", "## Reading", "", *reading(cnn, tf), ""]
  lines += [
    "Small batches with non-i.i.d. batches, Batch Renorm, ghost batches and frozen "
    "BatchNorm fine-tuning: [small_batch.md](small_batch.md) "
    "(`examples/small_batch_study.py`).",
    "",
  ]
  with open(os.path.join(out_dir, "norm_comparison.md"), "w") as f:
    f.write("\n".join(lines))

  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
  for norm, by_batch in cnn.items():
    means = [np.mean([x[0] for x in by_batch[b]]) for b in BATCH_SIZES]
    ax1.plot(BATCH_SIZES, means, marker="o", label=norm)
  ax1.set_xscale("log", base=2)
  ax1.set_xlabel("batch size")
  ax1.set_ylabel("test accuracy")
  ax1.set_title(f"mini CNN on digits, {args.epochs} epochs")
  ax1.grid(alpha=0.3)
  ax1.legend()
  for name, runs in tf.items():  # (the mean curve over the seeds)
    curve = np.mean([r["val_curve"] for r in runs], axis=0)
    ax2.plot(np.arange(1, len(curve)) * runs[0]["eval_every"], curve[1:], label=name)
  ax2.set_xlabel("step")
  ax2.set_ylabel("validation loss (nats/char)")
  ax2.set_title("mini Transformer on Genesis")
  ax2.grid(alpha=0.3)
  ax2.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "norm_comparison.png"), dpi=110)
  plt.close(fig)
  with open(os.path.join(out_dir, "norm_comparison.json"), "w") as f:
    json.dump(dict(cnn=cnn, transformer=tf, args=vars(args), seconds=seconds), f, indent=1)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="results/compare_norms")
  ap.add_argument("--seeds", type=int, default=2)
  ap.add_argument("--epochs", type=int, default=8)
  ap.add_argument("--steps", type=int, default=600)
  ap.add_argument("--tf-seeds", type=int, default=1, help="Transformer trainings per config")
  ap.add_argument("--report", metavar="JSON", help="only rewrite the report from a run's JSON")
  ap.add_argument(
    "--extend", metavar="JSON", help="a run's JSON with its Transformer trained up to --tf-seeds"
  )
  args = ap.parse_args(argv)
  if args.report or args.extend:  # (the figures of a run, without training its CNN again)
    with open(args.report or args.extend) as f:
      run = json.load(f)
    keep = ("out", "report", "extend") + (("tf_seeds",) if args.extend else ())
    vars(args).update({k: v for k, v in run["args"].items() if k not in keep})
    cnn = {n: {int(b): v for b, v in by.items()} for n, by in run["cnn"].items()}
    tf, seconds = run["transformer"], run.get("seconds", float("nan"))
    if args.extend:
      start, done = time.perf_counter(), min(len(r) for r in tf.values())
      for name, runs in run_transformer(args.steps, args.tf_seeds, first=done).items():
        tf[name] = tf[name][:done] + runs
      seconds += time.perf_counter() - start
    write_report(args.out, cnn, tf, args, seconds)
    return
  start = time.perf_counter()
  cnn = run_cnn(args.seeds, args.epochs)
  tf = run_transformer(args.steps, args.tf_seeds)
  seconds = time.perf_counter() - start
  write_report(args.out, cnn, tf, args, seconds)
  print(
    json.dumps(dict(seconds=round(seconds, 1), report=os.path.join(args.out, "norm_comparison.md")))
  )


if __name__ == "__main__":
  main()
