"""Trains the guides' example configurations over many seeds, resumably, and prints the
tables the guides quote from them.

Two studies, each a JSON file of one record per (configuration, seed) that grows as runs
finish, so a long study can stop and go on (runs already in the file are skipped):

- ``qk_norm``: ``mini_transformer.py`` (800 steps) with LayerNorm, RMSNorm, QK-norm per
  head and over the whole projection, DyT and DyT with QK-norm: the QK-norm table of
  ``docs/guides/modern.md``. About 2.5 minutes per run on one core of this project's CPU.
- ``dit_width``: ``mini_dit.py --models token --dim 80``, the wider class-token DiT the
  same guide sets against AdaLN-Zero (whose 20 seeds are in ``mini_dit_seeds.json``).

  python examples/seed_study.py qk_norm --seeds 20 [--json docs/studies/qk_norm.json]
  python examples/seed_study.py qk_norm --report    # the table from the JSON, no training
  python examples/seed_study.py qk_norm --from-seed 10  # a second process on seeds 10-19

Seeds run in order, every configuration of a seed before the next seed, so a study cut
short still compares the configurations on the same seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mini_dit  # noqa: E402
import mini_transformer  # noqa: E402
from compare_norms import quietly, spread  # noqa: E402

STUDY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "studies")

# label -> mini_transformer.train arguments (the label is the command line's flags)
QK_CONFIGS = {
  "--norm layer": dict(norm="layer"),
  "--norm rms": dict(norm="rms"),
  "--norm layer --qk-norm head": dict(norm="layer", qk_norm="head"),
  "--norm layer --qk-norm flat": dict(norm="layer", qk_norm="flat"),
  "--norm dyt": dict(norm="dyt"),
  "--norm dyt --qk-norm head": dict(norm="dyt", qk_norm="head"),
}
DIT_CONFIGS = {"--models token --dim 80": dict(models=("token",), dim=80)}


def _run_qk(config: dict, seed: int) -> dict:
  r = quietly(mini_transformer.train, **config, seed=seed, sample_length=0)
  return {k: r[k] for k in ("initial_loss", "final_loss", "seconds")}


def _run_dit(config: dict, seed: int) -> dict:
  r = quietly(mini_dit.train, **config, seed=seed)
  token = r["token"]
  return dict(val_loss=token["val_loss"], class_accuracy=token["class_accuracy"],
              parameters=token["parameters"], seconds=token["seconds"],
              classifier_accuracy_on_real=r["classifier_accuracy_on_real"])  # fmt: skip


STUDIES = {"qk_norm": (QK_CONFIGS, _run_qk), "dit_width": (DIT_CONFIGS, _run_dit)}


def load(path: str) -> list[dict]:
  """The study's records so far (none when the file does not exist yet)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)["runs"]


def save(path: str, study: str, record: dict) -> list[dict]:
  """Adds ``record`` to the file's records as they are now (another process may share
  the file: ``--from-seed``) through a temporary file, so a run stopped mid-write loses
  none; returns them."""
  runs = [r for r in load(path) if (r["config"], r["seed"]) != (record["config"], record["seed"])]
  runs.append(record)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(dict(study=study, runs=runs), f, indent=1)
  os.replace(tmp, path)
  return runs


def run(study: str, seeds: int, path: str, first: int = 0) -> list[dict]:
  """Trains every (configuration, seed) with ``first <= seed < seeds`` not yet in
  ``path``."""
  configs, train_one = STUDIES[study]
  runs = load(path)
  done = {(r["config"], r["seed"]) for r in runs}
  todo = [(c, s) for s in range(first, seeds) for c in configs if (c, s) not in done]
  for label, seed in tqdm(todo, desc=f"{study} runs"):
    runs = save(path, study, dict(config=label, seed=seed, **train_one(configs[label], seed)))
  return runs


def _by_config(runs: list[dict], key: str) -> tuple[list[int], dict[str, np.ndarray]]:
  """The seeds every configuration has finished, and each configuration's ``key`` on them."""
  labels = list(dict.fromkeys(r["config"] for r in runs))
  seeds = sorted(set.intersection(*({r["seed"] for r in runs if r["config"] == c} for c in labels)))
  table = {c: {r["seed"]: r[key] for r in runs if r["config"] == c} for c in labels}
  return seeds, {c: np.array([table[c][s] for s in seeds]) for c in labels}


def qk_norm_table(runs: list[dict]) -> str:
  """modern.md's QK-norm table: each configuration's final validation loss over the seeds
  all configurations finished, and on how many of them it beat LayerNorm's."""
  seeds, loss = _by_config(runs, "final_loss")
  first = _by_config(runs, "initial_loss")[1]
  start = np.concatenate(list(first.values()))
  base = loss["--norm layer"]
  lines = [
    f"| `mini_transformer.py` (800 steps), {_seeds(seeds)} | validation loss, nats/char: "
    "mean ± std (smallest–largest) | seeds below `--norm layer` |",
    "|---|---|---|",
  ]
  for label, values in loss.items():
    below = "—" if label == "--norm layer" else f"{int((values < base).sum())} of {len(seeds)}"
    lines.append(f"| `{label}` | {spread(values)} | {below} |")
  command = f"`python examples/seed_study.py qk_norm --seeds {len(seeds)}`"
  if seeds != list(range(len(seeds))):  # (two processes: the seeds they had finished)
    command = "`python examples/seed_study.py qk_norm`, two processes split by `--from-seed`"
  lines += ["", f"{_seeds(seeds, numbered=True)}, from {start.min():.1f}–{start.max():.1f} "
            f"nats/char at the start ({command})."]  # fmt: skip
  qk = np.concatenate([loss[f"--norm layer --qk-norm {q}"] - base for q in ("head", "flat")])
  gap = loss["--norm dyt"] - base
  behind = f"{gap.min():.2f}" if f"{gap.min():.2f}" == f"{gap.max():.2f}" else _range(gap, 2)
  reading = (
    f"QK-norm moves the loss by {np.abs(qk).max():.3f} nats at most against LayerNorm on the "
    "same seed (its point is stability at scale, where attention logits grow), and DyT with "
    "the paper's `α = 0.5` and this example's learning rate trains but ends "
    f"{behind} nats behind LayerNorm. "
  )
  if len(seeds) < 20:
    reading += (
      f"{len(seeds)} of the study's 20 seeds so far: `python examples/seed_study.py "
      "qk_norm` trains the ones `docs/studies/qk_norm.json` lacks, and the table is what "
      "its `--report` prints."
    )
  else:
    reading += "The table is what `python examples/seed_study.py qk_norm --report` prints."
  return "\n".join(lines) + "\n\n" + textwrap.fill(reading, 90)


def dit_width_row(runs: list[dict]) -> str:
  """modern.md's wider class-token row: ranges (means) over the seeds run."""
  seeds, loss = _by_config(runs, "val_loss")
  acc = _by_config(runs, "class_accuracy")[1]
  label = next(iter(loss))
  params = {r["parameters"] for r in runs}
  if len(params) != 1:
    raise ValueError(f"the runs disagree on the model's size: {sorted(params)}")
  lo, hi = loss[label], acc[label]
  name = "class token, `--dim 80`" + ("" if len(seeds) == 20 else f" ({_seeds(seeds)})")
  return (f"| {name} | {params.pop():,} | {lo.min():.3f}–{lo.max():.3f} ({lo.mean():.3f}) | "
          f"{hi.min():.3f}–{hi.max():.3f} ({hi.mean():.3f}) |")  # fmt: skip


def dit_width_reading(runs: list[dict]) -> str:
  """The guide's sentence on the wider token model against the narrow one and AdaLN-Zero
  on the same seeds (their runs: ``mini_dit_seeds.json``)."""
  seeds, loss = _by_config(runs, "val_loss")
  wide, acc = loss[next(iter(loss))], next(iter(_by_config(runs, "class_accuracy")[1].values()))
  with open(os.path.join(STUDY_DIR, "mini_dit_seeds.json")) as f:
    base = {r["seed"]: r for r in json.load(f)}
  adaln, token = ({k: np.array([base[s][m][k] for s in seeds]) for k in ("val_loss",
                   "class_accuracy")} for m in ("adaln", "token"))  # fmt: skip
  worse, fewer = (wide / adaln["val_loss"] - 1) * 100, (adaln["class_accuracy"] - acc) * 100
  return (
    "so the token model was also run wider, with more parameters than AdaLN-Zero (`python "
    f"examples/seed_study.py dit_width`, {len(seeds)} seeds, `docs/studies/dit_width.json`): "
    f"its loss is below the narrow token model's in {int((wide < token['val_loss']).sum())} "
    f"of them, and it still trails AdaLN-Zero in {int((worse > 0).sum())}, by "
    f"{_range(worse, 0)} % in loss and {_range(fewer, 0)} points of samples of the class "
    "asked for."
  )


def _range(a: np.ndarray, digits: int) -> str:
  return f"{a.min():.{digits}f}–{a.max():.{digits}f}"


def _seeds(seeds: list[int], numbered: bool = False) -> str:
  """``"20 seeds"``, or with ``numbered`` ``"Seeds 0–19"`` (``"Seed 0"`` for one)."""
  if not numbered:
    return f"{len(seeds)} seed{'s' * (len(seeds) != 1)}"
  if len(seeds) == 1:
    return f"Seed {seeds[0]}"
  run = seeds == list(range(seeds[0], seeds[-1] + 1))
  return f"Seeds {seeds[0]}–{seeds[-1]}" if run else f"Seeds {', '.join(map(str, seeds))}"


REPORTS = {
  "qk_norm": qk_norm_table,
  "dit_width": lambda runs: dit_width_row(runs) + "\n\n" + dit_width_reading(runs),
}


def main(argv=None) -> str:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("study", choices=sorted(STUDIES))
  ap.add_argument("--seeds", type=int, default=20, help="train seeds 0 .. N-1")
  ap.add_argument("--from-seed", type=int, default=0, help="start there (a second process)")
  ap.add_argument("--json", help="the study's records (default docs/studies/<study>.json)")
  ap.add_argument("--report", action="store_true", help="print the table only, no training")
  args = ap.parse_args(argv)
  path = args.json or os.path.join(STUDY_DIR, f"{args.study}.json")
  runs = load(path) if args.report else run(args.study, args.seeds, path, args.from_seed)
  if not runs:
    raise SystemExit(f"{path} has no runs yet: run the study without --report first")
  report = REPORTS[args.study](runs)
  print(report)
  return report


if __name__ == "__main__":
  main()
