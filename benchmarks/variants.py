"""Engine alternatives a device run times beside the shipped engine (``gpu_suite.py --variant``).

Some router choices were made from compiled programs without a device, or from one device
run against another; a device run settles them by timing the alternative in the same
process as Flax. A variant patches the engine's module globals before anything is traced,
so the whole process runs it: its ``jaxnorm`` rows against Flax's compare with the shipped
engine's rows of the same run (``benchmarks/RESULTS.md``, items 71 and 72). Retired once a
run has answered them: ``all-per-sample`` (per sample in batches above 64: 1.58–1.81×
Flax's H200 time forward against one pair's 1.05–1.08×, item 73).

  python benchmarks/gpu_suite.py --variant global-shifts --out DIR
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Variant(NamedTuple):
  """What the alternative is, the suite's cases it concerns (a regex over 'shape norm
  dtype dims', dims as ``1x4096x16384``), how to apply it (``apply(setattr)``; tests
  pass ``monkeypatch.setattr``) and the whole programs it concerns (a regex over
  ``gpu_suite.step_cases``' names; None: none)."""

  doc: str
  cases: str
  apply: Callable[[Callable[[Any, str, Any], None]], None]
  steps: str | None = None


def _per_sample_batch(limit: int):
  def apply(set_attr):
    from jaxnorm._engine import gpu  # noqa: PLC0415 (patched when a run asks)

    set_attr(gpu, "PER_SAMPLE_BATCH", limit)

  return apply


def _fused_rows(limit: int):
  def apply(set_attr):
    from jaxnorm._engine import gpu  # noqa: PLC0415

    set_attr(gpu, "FUSED_ROW", limit)

  return apply


def _column_programs(limit: int):
  def apply(set_attr):
    from jaxnorm._engine import gpu  # noqa: PLC0415

    set_attr(gpu, "COLUMN_PROGRAMS", limit)

  return apply


VARIANTS = {
  "global-shifts": Variant(
    "XLA:GPU's BatchNorm statistics with one pair of shifts for the whole batch (before "
    "item 70; the shipped engine shifts each sample in batches of up to 64), at a batch "
    "of 64 and in the ResNet-50 step at 8 (compiled: 706 kernels against 753, 1.0324x "
    "Flax's bytes against 1.0074x, items 86 and 88)",
    r"batch_train \w+ 64x7x7x2048$",
    _per_sample_batch(0),
    r"ResNet-50 step",
  ),
  "columns-whole": Variant(
    "XLA:GPU's per-sample column statistics as before item 85: long columns with few kept "
    "indices in one run, the two shifted sums apart (compiled, x − a was written out)",
    r"(group|instance) \w+ 2x64x64x320$",
    _column_programs(0),
  ),
  "rows-merged": Variant(
    "XLA:GPU's LayerNorm forward over rows as Flax's three kernels (the merged sums), not "
    "the one-kernel row norm: its compiled models move fewer bytes and compile 1.1-1.4x "
    "faster, with more kernels (item 86)",
    r"GPT-2/ViT rows.* layer bfloat16",
    _fused_rows(0),
    r"inference",
  ),
  "fused-rows-16384": Variant(
    "XLA:GPU's one-kernel LayerNorm forward up to 16,384 elements a row (item 72 stops at 8,192)",
    r"layer \w+ \d+x\d+x(12288|16384)$",
    _fused_rows(16384),
  ),
}
