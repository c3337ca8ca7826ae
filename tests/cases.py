"""One registry of the five norms: every test table that runs "each norm" iterates over it,
so a norm (or a capability) is added here once.

A :class:`Case` records, per norm, the pure function and the float64 reference (one calling
convention, ``(x, scale, bias, **axes) -> y``), the class name shared by ``jaxnorm``
(Linen), ``jaxnorm.nnx``, ``flax.linen`` and ``flax.nnx`` (the Flax twins), the options the
norm needs, the axes it takes in each input layout, and its capabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
from flax import nnx

import jaxnorm
from jaxnorm import nnx as jnnx
from tests import reference as ref

# Input layouts: (shape, channel axis). C = 8 everywhere, W ≠ C so a wrong axis shows.
LAYOUTS = {"nhwc": ((3, 5, 4, 8), -1), "nchw": ((3, 8, 5, 4), 1), "btd": ((3, 6, 8), -1)}


def _per_sample(layout: str) -> tuple[int, ...]:
  """LayerNorm's reduced axes: every non-batch axis of an image, the features of a sequence."""
  shape, _ = LAYOUTS[layout]
  return (-1,) if layout == "btd" else tuple(range(1, len(shape)))


class Case(NamedTuple):
  """One norm. ``fn``/``ref`` take ``(x, scale, bias, **axes)``; ``kwargs`` are the options
  of every call and constructor (e.g. ``num_groups``), ``train`` the Linen constructor
  arguments of a training call; ``axes(layout)`` gives ``(jaxnorm's axes keywords, the
  reference's)`` for an input of that layout, the same keywords for the pure function and
  both modules."""

  name: str
  fn: Callable[..., Any]
  ref: Callable[..., Any]
  module: str
  kwargs: dict
  axes: Callable[[str], tuple[dict, dict]]
  train: dict = {}
  running_stats: bool = False  # keeps batch_stats / nnx.BatchStat
  pure_bias: bool = True  # Flax's class has a bias (flax's RMSNorm has none)
  equinox: bool = False  # jaxnorm.equinox (and eqx.nn) have the class, channels-first

  def call(self, x: Any, scale: Any, bias: Any, layout: str | None = None) -> Any:
    """The pure function on an input of ``layout`` (None: channels-last defaults)."""
    axes = {} if layout is None else self.axes(layout)[0]
    return self.fn(x, scale, bias, **self.kwargs, **axes)

  def reference(self, x: Any, scale: Any, bias: Any, layout: str | None = None) -> Any:
    """The float64 reference on an input of ``layout``."""
    axes = {} if layout is None else self.axes(layout)[1]
    return self.ref(x, scale, bias, **axes)

  def linen(self, layout: str | None = None, **kw: Any) -> nn.Module:
    """jaxnorm's Linen module (training mode) for an input of ``layout``."""
    axes = {} if layout is None else self.axes(layout)[0]
    return getattr(jaxnorm, self.module)(**self.kwargs, **self.train, **axes, **kw)

  def flax_linen(self, **kw: Any) -> nn.Module:
    """Flax's Linen twin with the same options (channels-last)."""
    return getattr(nn, self.module)(**self.kwargs, **self.train, **kw)

  def nnx(self, features: int, layout: str | None = None, seed: int = 0, **kw: Any) -> Any:
    """jaxnorm's NNX module of ``features`` channels for an input of ``layout``."""
    axes = {} if layout is None else self.axes(layout)[0]
    return getattr(jnnx, self.module)(features, **self.kwargs, **axes, **kw, rngs=nnx.Rngs(seed))


def _batch(x, g, b, **kw):
  return jaxnorm.batch_norm(x, g, b, **kw)[0]


def _group_ref(x, g, b, **kw):
  return ref.group_norm(x, 2, g, b, **kw)


CASES = [
  Case(
    "batch",
    _batch,
    lambda x, g, b, **kw: ref.batch_norm(x, g, b, **kw)[0],
    "BatchNorm",
    {},
    lambda lay: (dict(axis=LAYOUTS[lay][1]), dict(axis=LAYOUTS[lay][1])),
    train=dict(use_running_average=False),
    running_stats=True,
    equinox=True,
  ),
  Case(
    "layer",
    jaxnorm.layer_norm,
    ref.layer_norm,
    "LayerNorm",
    {},
    lambda lay: (
      dict(reduction_axes=_per_sample(lay), feature_axes=LAYOUTS[lay][1]),
      dict(reduction_axes=_per_sample(lay), feature_axes=LAYOUTS[lay][1]),
    ),
    equinox=True,
  ),
  Case(
    "rms",
    jaxnorm.rms_norm,
    ref.rms_norm,
    "RMSNorm",
    {},
    lambda lay: (
      dict(reduction_axes=LAYOUTS[lay][1], feature_axes=LAYOUTS[lay][1]),
      dict(axes=LAYOUTS[lay][1]),
    ),
    pure_bias=False,
    equinox=True,
  ),
  Case(
    "group",
    jaxnorm.group_norm,
    _group_ref,
    "GroupNorm",
    dict(num_groups=2),
    lambda lay: (dict(feature_axis=LAYOUTS[lay][1]), dict(channel_axis=LAYOUTS[lay][1])),
    equinox=True,
  ),
  Case(
    "instance",
    jaxnorm.instance_norm,
    ref.instance_norm,
    "InstanceNorm",
    {},
    lambda lay: (dict(feature_axes=LAYOUTS[lay][1]), dict(channel_axis=LAYOUTS[lay][1])),
  ),
]
IDS = [c.name for c in CASES]
EQUINOX = [c for c in CASES if c.equinox]  # jaxnorm.equinox's classes, the same names
NAMES = [c.module for c in CASES]  # the class names, in jaxnorm, jaxnorm.nnx and Flax
BY_NAME = {c.module: c for c in CASES}
