"""One registry of the five norms, so that a test table grows by a line when a norm does.

Each :class:`Case` holds the pure function and the float64 reference with one calling
convention, ``(x, scale, bias) -> y`` for a channels-last input with ``C`` even, and the
name and constructor arguments of the Linen module (the same name in ``jaxnorm`` and
``flax.linen``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jaxnorm
from tests import reference as ref


class Case(NamedTuple):
  name: str
  fn: Callable[..., Any]
  ref: Callable[..., Any]
  module: str
  kwargs: dict


CASES = [
  Case(
    "batch",
    lambda x, g, b: jaxnorm.batch_norm(x, g, b)[0],
    lambda x, g, b: ref.batch_norm(x, g, b)[0],
    "BatchNorm",
    dict(use_running_average=False),
  ),
  Case("layer", jaxnorm.layer_norm, ref.layer_norm, "LayerNorm", {}),
  Case("rms", jaxnorm.rms_norm, ref.rms_norm, "RMSNorm", {}),
  Case(
    "group",
    lambda x, g, b: jaxnorm.group_norm(x, g, b, num_groups=2),
    lambda x, g, b: ref.group_norm(x, 2, g, b),
    "GroupNorm",
    dict(num_groups=2),
  ),
  Case("instance", jaxnorm.instance_norm, ref.instance_norm, "InstanceNorm", {}),
]
IDS = [c.name for c in CASES]
