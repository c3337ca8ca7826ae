"""jaxnorm: normalization layers for JAX and Flax, built on one pure ``normalize``.

The pure functions (:func:`normalize`, :func:`batch_norm`, :func:`layer_norm`,
:func:`instance_norm`, :func:`group_norm`, :func:`rms_norm`, :func:`moments`,
:func:`update_running_average`, :func:`batch_norm_step`, and the small-batch family
:func:`batch_renorm`, :func:`frozen_batch_norm`) hold all the maths; the Flax linen modules
(:class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm`, :class:`GroupNorm`,
:class:`InstanceNorm`) are drop-in replacements for ``flax.linen``'s and thin layers over them,
next to :class:`BatchRenorm` and :class:`FrozenBatchNorm`; :mod:`jaxnorm.nnx` holds the same
modules for ``flax.nnx``, over the same functions.
"""

from jaxnorm import convert, nnx
from jaxnorm._axes import canonicalize_axes
from jaxnorm._stats import Moments, moments, reduction_dtype, update_running_average
from jaxnorm.batch import batch_norm_step, running_stats_dtypes
from jaxnorm.fold import batch_norm_epsilons, fold_batch_norm, fold_batch_norms
from jaxnorm.frozen import freeze_batch_norm, frozen_batch_norm
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
from jaxnorm.linen import (
  BatchNorm,
  BatchRenorm,
  FrozenBatchNorm,
  GroupNorm,
  InstanceNorm,
  LayerNorm,
  RMSNorm,
)
from jaxnorm.renorm import batch_renorm, batch_renorm_step, renorm_limits

__version__ = "0.1.0"

__all__ = [
  "BatchNorm",
  "BatchRenorm",
  "FrozenBatchNorm",
  "GroupNorm",
  "InstanceNorm",
  "LayerNorm",
  "Moments",
  "RMSNorm",
  "add_layer_norm",
  "add_rms_norm",
  "affine",
  "batch_norm",
  "batch_norm_epsilons",
  "batch_norm_step",
  "batch_renorm",
  "batch_renorm_step",
  "canonicalize_axes",
  "convert",
  "fold_batch_norm",
  "fold_batch_norms",
  "freeze_batch_norm",
  "frozen_batch_norm",
  "group_norm",
  "instance_norm",
  "layer_norm",
  "moments",
  "nnx",
  "normalize",
  "reduction_dtype",
  "renorm_limits",
  "rms_norm",
  "running_stats_dtypes",
  "update_running_average",
]
