"""Which remedy for small batches? BatchNorm, Batch Renorm, ghost batches, GroupNorm, frozen
BatchNorm, measured on the mini CNN.

BatchNorm's weak spot is the small batch: noisy statistics, and a mismatch between
training (batch statistics) and inference (running averages). On the digits task the mini
CNN barely suffers at batch 2 when batches are drawn i.i.d. (docs/studies/norm_comparison.md), so
this study also draws them **by class** (every batch holds one digit): the non-i.i.d.
setting of Ioffe (2017), where each batch's statistics are far from the population's, as
with sequential data, per-class sampling or one video per batch. It trains

- BatchNorm, Batch Renorm (schedule scaled to the run), GroupNorm at batch sizes 1, 2, 4
  and 128, and ghost BatchNorm (batch 128 in virtual batches of 4), with i.i.d. and
  by-class batches (same number of epochs, Adam's learning rate 3e-3·sqrt(batch/32),
  several seeds), and
- fine-tuning at batch 2: a BatchNorm model pretrained at batch 128 (i.i.d.) on digits
  0–4, then one epoch on digits 5–9 at batch 2 with its BatchNorm layers training (batch
  statistics, running averages updated) or frozen (``FrozenBatchNorm``, which loads the
  same variables) — a pretrained backbone moved to a new task with tiny batches,

and writes ``small_batch.md`` (tables and what they say), ``small_batch.png`` and
``small_batch.json`` into ``--out`` (default ``results/small_batch``; the docs' copy is
regenerated with ``--out docs/studies``). About 7 minutes on 2 CPU cores:

  python examples/small_batch_study.py [--out results/small_batch] [--seeds 5] [--epochs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import matplotlib
import numpy as np
import optax

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mini_cnn  # noqa: E402
from compare_norms import quietly, spread  # noqa: E402
from tqdm import tqdm  # noqa: E402

BATCHES = (1, 2, 4, 128)
NORMS = ("batch", "renorm", "group")
ORDERS = ("iid", "by-class")
GHOST_BATCH = 128  # ghost BatchNorm runs at this batch, in virtual batches of mini_cnn.GHOST
# By-class batches only where a class fills several batches (a class has ~135 training
# images: at batch 128 an epoch would be 10 single-class steps, which no norm survives).
BY_CLASS_MAX_BATCH = 4


def lr_for(batch: int) -> float:
  return 3e-3 * (batch / 32) ** 0.5


def run_grid(seeds: int, epochs: int, batches=BATCHES) -> dict:
  """``{order: {norm: {batch: [test accuracy per seed]}}}``."""
  runs = [
    (o, n, b, s)
    for o in ORDERS
    for n in NORMS
    for b in batches
    if o == "iid" or b <= BY_CLASS_MAX_BATCH
    for s in range(seeds)
  ]
  if GHOST_BATCH in batches:
    runs += [("iid", "ghost", GHOST_BATCH, s) for s in range(seeds)]
  acc: dict = {}
  for order, norm, batch, seed in tqdm(runs, desc="small-batch runs"):
    r = quietly(
      mini_cnn.train, norm=norm, batch_size=batch, epochs=epochs, seed=seed, lr=lr_for(batch),
      order=order,
    )  # fmt: skip
    acc.setdefault(order, {}).setdefault(norm, {}).setdefault(batch, []).append(r["test_accuracy"])
  return acc


def fine_tune(seeds: int, pre_epochs: int, batch: int = 2, lr: float = 1e-3) -> dict:
  """Transfer at a small batch: pretrain with BatchNorm at batch 128 (i.i.d.) on digits
  0–4, then fine-tune for one epoch at ``batch`` on digits 5–9 with the BatchNorm layers
  training or frozen, i.i.d. or by-class batches; test accuracy on digits 5–9.
  ``{key: [accuracy per seed]}`` (``pretrained``: on digits 0–4, before fine-tuning)."""
  x_train, x_test, y_train, y_test = mini_cnn.load_data()
  old, new = y_train < 5, y_train >= 5
  xo, yo, xn, yn = x_train[old], y_train[old], x_train[new], y_train[new]
  test_old, test_new = y_test < 5, y_test >= 5
  out: dict = {}
  for seed in tqdm(range(seeds), desc="fine-tuning"):
    n_pre = pre_epochs * len(mini_cnn.batches(yo, 128, "iid", np.random.default_rng(0)))
    tx = optax.adam(optax.cosine_decay_schedule(lr_for(128), n_pre, alpha=0.05))
    step, predict, state = mini_cnn.linen_trainer("batch", xo[:128], seed, tx, n_pre)
    rng = np.random.default_rng(seed)
    for _ in range(pre_epochs):
      for idx in mini_cnn.batches(yo, 128, "iid", rng):
        step(xo[idx], yo[idx])
    pretrained = state["variables"]
    hits = np.asarray(predict(x_test[test_old])) == y_test[test_old]
    out.setdefault("pretrained", []).append(float(hits.mean()))
    for order in ORDERS:
      for norm in ("batch", "frozen"):
        step, predict, _ = mini_cnn.linen_trainer(
          norm, xn[:batch], seed, optax.adam(lr), variables=pretrained
        )
        for idx in mini_cnn.batches(yn, batch, order, np.random.default_rng(seed + 1)):
          step(xn[idx], yn[idx])
        hits = np.asarray(predict(x_test[test_new])) == y_test[test_new]
        out.setdefault(f"{norm}/{order}", []).append(float(hits.mean()))
  return out


def _ms(values):
  a = np.asarray(values)
  return a.mean(), a.std()


def _cmp(a, b):
  """How ``a`` stands against ``b`` (mean, std pairs; noise: 2 std, at least 0.005)."""
  noise = max(2 * max(a[1], b[1]), 0.005)
  if abs(a[0] - b[0]) <= noise:
    return "within noise of"
  return "above" if a[0] > b[0] else "below"


def reading(acc: dict, ft: dict) -> list[str]:
  """What the numbers say, each sentence computed from them."""
  lines = []
  small, large = BATCHES[1], BATCHES[-1]
  bn_l = _ms(acc["iid"]["batch"][large])
  for order in ORDERS:
    g = acc[order]
    bn_s = _ms(g["batch"][small])
    rn_s, gn_s = _ms(g["renorm"][small]), _ms(g["group"][small])
    lines.append(
      f"- **{order} batches, batch {small}**: BatchNorm {bn_s[0]:.3f} ± {bn_s[1]:.3f} "
      f"({_cmp(bn_s, bn_l)} its {bn_l[0]:.3f} at batch {large}, i.i.d.); Batch Renorm "
      f"{rn_s[0]:.3f} ± {rn_s[1]:.3f} ({_cmp(rn_s, bn_s)} BatchNorm); GroupNorm "
      f"{gn_s[0]:.3f} ± {gn_s[1]:.3f} ({_cmp(gn_s, bn_s)} BatchNorm)."
    )
    one = {n: _ms(g[n][1]) for n in NORMS}
    lines.append(
      f"  At batch 1: BatchNorm {one['batch'][0]:.3f}, Batch Renorm {one['renorm'][0]:.3f}, "
      f"GroupNorm {one['group'][0]:.3f}."
    )
  gh = _ms(acc["iid"]["ghost"][GHOST_BATCH])
  lines.append(
    f"- **Ghost BatchNorm** at batch {GHOST_BATCH} (virtual batches of {mini_cnn.GHOST}): "
    f"{gh[0]:.3f} ± {gh[1]:.3f}, {_cmp(gh, bn_l)} plain BatchNorm at batch {large} "
    f"({bn_l[0]:.3f})."
  )
  pre = _ms(ft["pretrained"])
  for order in ORDERS:
    tr, fr = _ms(ft[f"batch/{order}"]), _ms(ft[f"frozen/{order}"])
    lines.append(
      f"- **Fine-tuning on digits 5–9 at batch 2, {order} batches** (pretrained on digits "
      f"0–4: {pre[0]:.3f} on their test images): BatchNorm training {tr[0]:.3f} ± {tr[1]:.3f}, "
      f"frozen {fr[0]:.3f} ± {fr[1]:.3f} — frozen is {_cmp(fr, tr)} training BatchNorm."
    )
  return lines


def write_report(out_dir, acc, ft, args, seconds):
  os.makedirs(out_dir, exist_ok=True)
  lines = [
    "# Small batches: which remedy, measured",
    "",
    f"Regenerate with `python examples/small_batch_study.py --out docs/studies --seeds "
    f"{args.seeds} --epochs "
    f"{args.epochs}` ({seconds / 60:.0f} minutes on {os.cpu_count()} CPU cores, "
    f"{platform.machine()}, jax {jax.__version__}). The mini CNN on digits "
    f"(`examples/mini_cnn.py`), {args.epochs} epochs at every batch size (the same images "
    f"seen), Adam with learning rate 3e-3·sqrt(batch/32), mean ± std (smallest–largest) "
    f"of the test accuracy over {args.seeds} seeds. *by-class*: every batch holds a single "
    f"digit (non-i.i.d.; "
    f"batch sizes up to {BY_CLASS_MAX_BATCH}: a digit has ~135 training images; at batch 1 "
    f"both orders are i.i.d., a batch of one image always holds one class, so that column "
    f"is a second draw of the same setting); "
    f"BatchNorm and Batch Renorm evaluate with their running averages (momentum 0.9); Batch "
    f"Renorm's schedule is the paper's scaled to the run (warm-up 1/16 of the steps, "
    f"d_max = 5 at 5/16, r_max = 3 at 1/2); ghost BatchNorm runs at batch {GHOST_BATCH} in "
    f"virtual batches of {mini_cnn.GHOST}.",
    "",
  ]
  for order in ORDERS:
    lines += [f"## {order} batches", "", "| norm | " + " | ".join(f"batch {b}" for b in BATCHES)]
    lines[-1] += " |"
    lines.append("|---|" + "---|" * len(BATCHES))
    for norm, by_batch in acc[order].items():
      cells = []
      for b in BATCHES:
        cells.append("—" if b not in by_batch else spread(by_batch[b]))
      lines.append(f"| {norm} | " + " | ".join(cells) + " |")
    lines.append("")
  lines += [
    f"## Fine-tuning at batch 2 (pretrained with BatchNorm at batch 128 on digits 0–4 for "
    f"{args.pre_epochs} epochs, then one epoch on digits 5–9, Adam 1e-3)",
    "",
    "| | test accuracy |",
    "|---|---|",
    f"| pretrained, on digits 0–4 | {spread(ft['pretrained'])} |",
  ]
  for order in ORDERS:
    for norm, name in (("batch", "BatchNorm training"), ("frozen", "FrozenBatchNorm")):
      lines.append(f"| {name}, {order}, on digits 5–9 | {spread(ft[f'{norm}/{order}'])} |")
  lines += ["", "![plots](small_batch.png)", "", "## Reading", "", *reading(acc, ft), ""]
  with open(os.path.join(out_dir, "small_batch.md"), "w") as f:
    f.write("\n".join(lines))

  fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
  for ax, order in zip(axes, ORDERS, strict=False):
    for norm, by_batch in acc[order].items():
      bs = [b for b in BATCHES if b in by_batch]
      means = [_ms(by_batch[b])[0] for b in bs]
      ax.errorbar(bs, means, yerr=[_ms(by_batch[b])[1] for b in bs], marker="o", label=norm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"mini CNN, {order} batches")
    ax.grid(alpha=0.3)
    ax.legend()
  keys = ["pretrained"] + [f"{n}/{o}" for o in ORDERS for n in ("batch", "frozen")]
  axes[2].bar(range(len(keys)), [_ms(ft[k])[0] for k in keys], yerr=[_ms(ft[k])[1] for k in keys])
  names = ["pretrained\n(on 0–4)"] + [k.replace("/", "\n") + "\n(on 5–9)" for k in keys[1:]]
  axes[2].set_xticks(range(len(keys)), names, fontsize=8)
  axes[2].set_ylim(min(_ms(ft[k])[0] for k in keys) - 0.05, 1.0)
  axes[2].set_title("pretrained on digits 0–4, fine-tuned on 5–9 at batch 2")
  axes[2].grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "small_batch.png"), dpi=110)
  plt.close(fig)
  with open(os.path.join(out_dir, "small_batch.json"), "w") as f:
    json.dump(dict(accuracy=acc, fine_tuning=ft, args=vars(args), seconds=seconds), f, indent=1)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="results/small_batch")  # docs' copy: --out docs/studies
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--epochs", type=int, default=8)
  ap.add_argument("--pre-epochs", type=int, default=12)
  ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
  ap.add_argument("--report", metavar="JSON", help="only rewrite the report from a run's JSON")
  args = ap.parse_args(argv)
  if args.report:  # (the figures of a run, without training again)
    with open(args.report) as f:
      run = json.load(f)
    vars(args).update({k: v for k, v in run["args"].items() if k not in ("out", "report")})
    acc = {
      o: {n: {int(b): v for b, v in by.items()} for n, by in g.items()}
      for o, g in run["accuracy"].items()
    }
    write_report(args.out, acc, run["fine_tuning"], args, run.get("seconds", float("nan")))
    return
  start = time.perf_counter()
  acc = run_grid(args.seeds, args.epochs, tuple(args.batches))
  ft = fine_tune(args.seeds, args.pre_epochs)
  seconds = time.perf_counter() - start
  if tuple(args.batches) == BATCHES:
    write_report(args.out, acc, ft, args, seconds)
  print(json.dumps(dict(seconds=round(seconds, 1), accuracy=acc, fine_tuning=ft)))


if __name__ == "__main__":
  main()
