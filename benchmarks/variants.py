"""Engine alternatives a device run times beside the shipped engine (``gpu_suite.py --variant``).

Some router choices were made from compiled programs without a device, or from one device
run against another; a device run settles them by timing the alternative in the same
process as Flax. A variant patches the engine's module globals before anything is traced,
so the whole process runs it: its ``jaxnorm`` rows against Flax's compare with the shipped
engine's rows of the same run (``benchmarks/RESULTS.md``, items 71 and 72).

  python benchmarks/gpu_suite.py --variant global-shifts --out DIR
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Variant(NamedTuple):
  """What the alternative is, the suite's cases it concerns (a regex over 'shape norm
  dtype dims', dims as ``1x4096x16384``) and how to apply it (``apply(setattr)``; tests
  pass ``monkeypatch.setattr``)."""

  doc: str
  cases: str
  apply: Callable[[Callable[[Any, str, Any], None]], None]


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


BATCH_TRAIN = r"batch_train"
VARIANTS = {
  "global-shifts": Variant(
    "XLA:GPU's BatchNorm statistics with one pair of shifts for the whole batch (before "
    "item 70; the shipped engine shifts each sample in batches of up to 64)",
    BATCH_TRAIN,
    _per_sample_batch(0),
  ),
  "all-per-sample": Variant(
    "XLA:GPU's BatchNorm statistics shifted per sample in batches of any size (item 70; "
    "the shipped engine stops at 64, item 73)",
    BATCH_TRAIN,
    _per_sample_batch(1 << 62),
  ),
  "columns-whole": Variant(
    "XLA:GPU's per-sample column statistics as before item 85: long columns with few kept "
    "indices in one run, the two shifted sums apart (compiled, x − a was written out)",
    r"(group|instance) \w+ 2x64x64x320$",
    _column_programs(0),
  ),
  "fused-rows-16384": Variant(
    "XLA:GPU's one-kernel LayerNorm forward up to 16,384 elements a row (item 72 stops at 8,192)",
    r"layer \w+ \d+x\d+x(12288|16384)$",
    _fused_rows(16384),
  ),
}
