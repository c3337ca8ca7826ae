"""jaxnorm: normalization layers for JAX and Flax, built on one pure ``normalize``.

The pure functions (:func:`normalize`, :func:`batch_norm`, :func:`layer_norm`,
:func:`instance_norm`, :func:`group_norm`, :func:`rms_norm`, :func:`moments`,
:func:`update_running_average`, :func:`batch_norm_step`) hold all the maths; the Flax linen modules
(:class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm`, :class:`GroupNorm`,
:class:`InstanceNorm`) are drop-in replacements for ``flax.linen``'s and thin layers over them;
:mod:`jaxnorm.nnx` holds the same five for ``flax.nnx``, over the same functions.
"""

from jaxnorm import nnx
from jaxnorm._axes import canonicalize_axes
from jaxnorm._stats import Moments, moments, reduction_dtype, update_running_average
from jaxnorm.batch import batch_norm_step, running_stats_dtypes
from jaxnorm.functional import (
  add_layer_norm,
  add_rms_norm,
  affine,
  batch_norm,
  group_norm,
  instance_norm,
  layer_norm,
  normalize,
  rms_norm,
)
from jaxnorm.linen import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm

__version__ = "0.1.0"

__all__ = [
  "BatchNorm",
  "GroupNorm",
  "InstanceNorm",
  "LayerNorm",
  "Moments",
  "RMSNorm",
  "add_layer_norm",
  "add_rms_norm",
  "affine",
  "batch_norm",
  "batch_norm_step",
  "canonicalize_axes",
  "group_norm",
  "instance_norm",
  "layer_norm",
  "moments",
  "nnx",
  "normalize",
  "reduction_dtype",
  "rms_norm",
  "running_stats_dtypes",
  "update_running_average",
]
