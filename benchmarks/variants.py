"""Engine alternatives a device run times beside the shipped engine (``gpu_suite.py --variant``).

Some router choices were made from compiled programs without a device, or from one device
run against another; a device run settles them by timing the alternative in the same
process as Flax. A variant patches the engine's module globals before anything is traced,
so the whole process runs it: its ``jaxnorm`` rows against Flax's compare with the shipped
engine's rows of the same run (``benchmarks/RESULTS.md``, items 71 and 72).

  python benchmarks/gpu_suite.py --variant global-shifts --out DIR
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple


class Variant(NamedTuple):
  """What the alternative is, the suite's cases it concerns (a regex over 'shape norm
  dtype dims', dims as ``1x4096x16384``) and how to apply it (``apply(setattr)``; tests
  pass ``monkeypatch.setattr``)."""

  doc: str
  cases: str
  apply: Callable[[Callable[[Any, str, Any], None]], None]


def _batch_shifts(per_sample: Callable[[Any, tuple[int, ...]], bool]):
  def apply(set_attr):
    from jaxnorm._engine import router  # noqa: PLC0415 (patched when a run asks)

    two_shifts, on_mesh = router.two_shifts, router.on_mesh

    def shifts(raw, axes, dtype, per_outer=False):
      keep = on_mesh(raw) or (per_outer and per_sample(raw, axes))
      return two_shifts(raw, axes, dtype, per_outer=keep)

    set_attr(router, "two_shifts", shifts)

  return apply


def _fused_rows(limit: int):
  def apply(set_attr):
    from jaxnorm._engine import router  # noqa: PLC0415

    set_attr(router, "FUSED_ROW", limit)

  return apply


BATCH_TRAIN = r"batch_train"
VARIANTS = {
  "global-shifts": Variant(
    "XLA:GPU's BatchNorm statistics with one pair of shifts for the whole batch (before "
    "item 70; the shipped engine shifts each sample)",
    BATCH_TRAIN,
    _batch_shifts(lambda raw, axes: False),
  ),
  "short-per-sample": Variant(
    "each sample shifted only where the statistics reduce at most 4,096 elements (item "
    "70's hybrid)",
    BATCH_TRAIN,
    _batch_shifts(lambda raw, axes: math.prod(raw.shape[a] for a in axes) <= 4096),
  ),
  "fused-rows-16384": Variant(
    "XLA:GPU's one-kernel LayerNorm forward up to 16,384 elements a row (item 72 stops at 8,192)",
    r"layer \w+ \d+x\d+x(12288|16384)$",
    _fused_rows(16384),
  ),
}
