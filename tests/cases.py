"""One registry of every norm: every test table that runs "each norm" iterates over it, so
a norm (or a capability) is added here once. :data:`CASES` holds the five norms with
statistics (and their modules), :data:`FUNCTIONS` every other norm's pure function (the
modern norms, Add & Norm, Batch Renorm, frozen BatchNorm, ``normalize``, the weight norms).

A :class:`Case` records, per norm, the pure function and the float64 reference (one calling
convention, ``(x, scale, bias, **axes) -> y``), the class name shared by ``jaxnorm``
(Linen), ``jaxnorm.nnx``, ``flax.linen`` and ``flax.nnx`` (the Flax twins), the options the
norm needs, the axes it takes in each input layout, and its capabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
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


# --- every other norm's pure function -----------------------------------------------------

B, T, D = 3, 5, 8
ROWS = (B, T, D)
IMAGE = (2, 4, 3, 6)  # N, H, W, C
# the arrays that carry the batch
PER_SAMPLE = ("x", "residual", "shift", "scale", "content", "labels")


def function_data(seed: int = 0) -> dict[str, np.ndarray]:
  """x (B, T, D) off centre (so a wrong mean shows), per-sample conditioning, parameters."""
  r = np.random.default_rng(seed)
  return dict(
    x=r.normal(3.0, 2.0, ROWS),
    shift=r.normal(0, 1, (B, D)),
    scale=r.normal(0, 0.5, (B, D)),
    g=r.normal(1, 0.3, D),
    b=r.normal(0, 0.3, D),
    content=r.normal(2.0, 1.5, IMAGE),
    style=r.normal(-4.0, 3.0, (1, 5, 2, 6)),  # one style, other spatial size
    labels=np.array([2, 0, 1]),
    table_g=r.normal(1, 0.5, (3, D)),
    table_b=r.normal(0, 0.5, (3, D)),
    residual=r.normal(-1.0, 1.0, ROWS),
    mean=r.normal(2.0, 0.5, D),  # running statistics, off the batch's (Batch Renorm's r, d)
    var=r.uniform(2.0, 6.0, D),
    weight=r.normal(0.5, 1.0, (6, D)),  # (in, out)
    u=r.normal(0, 1, (1, D)),
  )


class Function(NamedTuple):
  """One pure norm outside :data:`CASES`: ``fn(*arrays)`` and its float64 ``ref(*arrays)``
  on the arrays of :func:`function_data` named by ``args`` (the first, x, the content or the
  weight, is the one tested in every dtype); ``batched``: whether a batch of samples can
  be cut to none (not a weight's); ``differences``: the arguments whose derivative is the
  reference's central differences (None: every floating one; the rest the norm holds
  constant by definition: Batch Renorm's r and d, a frozen BatchNorm's every input but x,
  spectral normalization's power iteration)."""

  name: str
  fn: Callable[..., Any]
  ref: Callable[..., Any]
  args: tuple[str, ...]
  batched: bool = True
  differences: tuple[str, ...] | None = None

  def arrays(self, dtype: Any = jnp.float32, batch: int | None = None) -> list[jax.Array]:
    """The arguments: the first in ``dtype``, floats in float32, the labels as integers;
    with ``batch``, every per-sample array cut to that many samples (0: an empty batch)."""
    data = function_data()
    out = []
    for i, name in enumerate(self.args):
      a = data[name] if batch is None or name not in PER_SAMPLE else data[name][:batch]
      kind = dtype if i == 0 else jnp.int32 if name == "labels" else jnp.float32
      out.append(jnp.asarray(a, kind))
    return out

  def reference(self, *args: Any) -> np.ndarray:
    """The float64 reference on ``args`` (floats widened to float64, labels kept)."""
    return self.ref(*(a if a.dtype.kind in "iub" else np.asarray(a, np.float64)
                      for a in map(np.asarray, args)))  # fmt: skip


def _update(x):
  """A sublayer's output for the gate, in float32 (so x's rounding is the only one)."""
  return jnp.square(x.astype(jnp.float32)) * 0.1


def _mask():
  return np.arange(D)[None, None, :] < 6


def _per_sample_modulate(reference_norm=None, **kw):
  """The reference of a norm (or none) followed by per-sample modulation."""

  def reference(x, shift, scale):
    y = x if reference_norm is None else reference_norm(x)
    return ref.modulate(y, ref.per_sample(shift, 3), ref.per_sample(scale, 3), **kw)

  return reference


FUNCTIONS = [
  Function("dyt", lambda x, g, b: jaxnorm.dyt(x, 0.7, g, b),
         lambda x, g, b: ref.dyt(x, 0.7, g, b), ("x", "g", "b")),
  Function("dyt_alpha_per_feature", lambda x, g: jaxnorm.dyt(x, g * 0.5, None, g),
         lambda x, g: ref.dyt(x, np.asarray(g) * 0.5, None, g), ("x", "g")),
  Function("l2_normalize", lambda x: jaxnorm.l2_normalize(x), ref.l2_normalize, ("x",)),
  Function("l2_normalize_2d", lambda x: jaxnorm.l2_normalize(x, (1, 2)),
         lambda x: ref.l2_normalize(x, (1, 2)), ("x",)),
  Function("lrn", lambda x: jaxnorm.local_response_norm(x, 3, 0.2, 0.75, 2.0),
         lambda x: ref.local_response_norm(x, 3, 0.2, 0.75, 2.0), ("x",)),
  Function("lrn_even_channels_first",
         lambda x: jaxnorm.local_response_norm(x, 4, 0.5, 0.6, 1.0, channel_axis=1),
         lambda x: ref.local_response_norm(x, 4, 0.5, 0.6, 1.0, channel_axis=1), ("x",)),
  Function("modulate", jaxnorm.modulate, _per_sample_modulate(), ("x", "shift", "scale")),
  Function("film", lambda x, shift, scale: jaxnorm.modulate(x, shift, scale,
                                                          zero_centered_scale=False),
         _per_sample_modulate(zero_centered=False), ("x", "shift", "scale")),
  Function("gated_residual", lambda x, scale: jaxnorm.gated_residual(x, _update(x), scale),
         lambda x, scale: (np.asarray(x, np.float64)
                           + ref.per_sample(scale, 3) * np.asarray(x, np.float64) ** 2 * 0.1),
         ("x", "scale")),
  Function("adaptive_layer_norm", jaxnorm.adaptive_layer_norm,
         _per_sample_modulate(ref.layer_norm), ("x", "shift", "scale")),
  Function("adaptive_layer_norm_masked",
         lambda x, shift, scale: jaxnorm.adaptive_layer_norm(x, shift, scale, mask=_mask()),
         _per_sample_modulate(lambda x: ref.layer_norm(x, mask=_mask())),
         ("x", "shift", "scale")),
  Function("adaptive_rms_norm", jaxnorm.adaptive_rms_norm, _per_sample_modulate(ref.rms_norm),
         ("x", "shift", "scale")),
  Function("adaptive_instance_norm", jaxnorm.adaptive_instance_norm,
         ref.adaptive_instance_norm, ("content", "style")),
  Function("adaptive_instance_norm_nchw",
         lambda content, style: jaxnorm.adaptive_instance_norm(
           content.transpose(0, 3, 1, 2), style.transpose(0, 3, 1, 2), feature_axes=1),
         lambda content, style: ref.adaptive_instance_norm(
           np.transpose(content, (0, 3, 1, 2)), np.transpose(style, (0, 3, 1, 2)),
           channel_axis=1),
         ("content", "style")),
  Function("add_layer_norm", lambda x, residual, g, b: jaxnorm.add_layer_norm(x, residual, g, b)[0],
         lambda x, residual, g, b: ref.layer_norm(x + residual, g, b),
         ("x", "residual", "g", "b")),
  Function("add_rms_norm", lambda x, residual, g: jaxnorm.add_rms_norm(x, residual, g)[0],
         lambda x, residual, g: ref.rms_norm(x + residual, g), ("x", "residual", "g")),
  Function("normalize", lambda x: jaxnorm.normalize(x, (1, 2)),
         lambda x: ref.normalize(x, (1, 2)), ("x",)),
  Function("batch_renorm",
         lambda x, g, b, mean, var: jaxnorm.batch_renorm(
           x, g, b, mean=mean, var=var, r_max=1.5, d_max=0.5)[0],
         lambda x, g, b, mean, var: ref.batch_renorm(x, mean, var, 1.5, 0.5, g, b)[0],
         ("x", "g", "b", "mean", "var"), differences=()),
  Function("frozen_batch_norm", jaxnorm.frozen_batch_norm,
         lambda x, g, b, mean, var: ref.batch_norm_eval(x, mean, var, g, b),
         ("x", "g", "b", "mean", "var"), differences=("x",)),
  Function("weight_norm", jaxnorm.weight_norm, ref.weight_norm, ("weight", "g"), batched=False),
  Function("spectral_norm", lambda weight, u: jaxnorm.spectral_norm(weight, u)[0],
         lambda weight, u: ref.spectral_norm(weight, u)[0], ("weight", "u"), batched=False,
         differences=()),
  Function("conditional_batch_norm",
         lambda x, labels, table_g, table_b: jaxnorm.conditional_batch_norm_step(
           x, labels, table_g, table_b, jnp.zeros(D), jnp.ones(D),
           use_running_average=False)[0],
         lambda x, labels, table_g, table_b: ref.conditional_batch_norm(
           x, np.asarray(labels), table_g, table_b)[0],
         ("x", "labels", "table_g", "table_b")),
]  # fmt: skip
FUNCTION_IDS = [c.name for c in FUNCTIONS]
