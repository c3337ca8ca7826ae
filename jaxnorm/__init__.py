"""jaxnorm: normalization layers for JAX and Flax, built on one pure ``normalize``.

The pure functions hold all the maths: :func:`normalize`, :func:`layer_norm`,
:func:`rms_norm`, :func:`instance_norm`, :func:`group_norm` and Add & Norm
(:mod:`jaxnorm._norms`); :func:`batch_norm`, its layer step :func:`batch_norm_step` and the
small-batch family :func:`batch_renorm`, :func:`frozen_batch_norm` (:mod:`jaxnorm._batch`);
:func:`moments`, :func:`update_running_average` and :func:`debiased_average`
(:mod:`jaxnorm._engine`); the weight
reparameterizations :func:`weight_norm` and :func:`spectral_norm` (:mod:`jaxnorm._weights`);
the norms without group statistics :func:`dyt`, :func:`l2_normalize`,
:func:`local_response_norm` (:mod:`jaxnorm._pointwise`) and the adaptive ones,
:func:`modulate`, :func:`gated_residual`, :func:`adaptive_layer_norm`,
:func:`adaptive_rms_norm`, :func:`adaptive_instance_norm`,
:func:`conditional_batch_norm_step` (:mod:`jaxnorm._adaptive`).
The Flax linen modules (:class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm`,
:class:`GroupNorm`, :class:`InstanceNorm`, :class:`BatchRenorm`, :class:`FrozenBatchNorm`,
and the wrappers :class:`SpectralNorm`, :class:`WeightNorm`) are drop-in replacements for
``flax.linen``'s and thin layers over them, beside the modern norms Flax lacks
(:class:`DyT`, :class:`AdaLayerNorm`, :class:`AdaRMSNorm`, :class:`ConditionalBatchNorm`,
:class:`LocalResponseNorm`); :mod:`jaxnorm.nnx` holds the
same modules for ``flax.nnx``; :mod:`jaxnorm.convert` imports PyTorch's norms and
:mod:`jaxnorm.fold` folds or freezes BatchNorm after training.
"""

from jaxnorm import convert, nnx
from jaxnorm._adaptive import (
  adaptive_instance_norm,
  adaptive_layer_norm,
  adaptive_rms_norm,
  conditional_batch_norm_step,
  gated_residual,
  modulate,
)
from jaxnorm._batch import (
  SingleValueWarning,
  batch_norm,
  batch_norm_step,
  batch_renorm,
  batch_renorm_step,
  frozen_batch_norm,
  renorm_limits,
)
from jaxnorm._engine import Moments, moments
from jaxnorm._norms import (
  add_layer_norm,
  add_rms_norm,
  group_norm,
  instance_norm,
  layer_norm,
  normalize,
  rms_norm,
)
from jaxnorm._pointwise import dyt, l2_normalize, local_response_norm
from jaxnorm._running import debiased_average, update_running_average
from jaxnorm._weights import spectral_norm, weight_norm
from jaxnorm.fold import batch_norm_epsilons, fold_batch_norm, fold_batch_norms, freeze_batch_norm
from jaxnorm.linen import (
  AdaLayerNorm,
  AdaRMSNorm,
  BatchNorm,
  BatchRenorm,
  ConditionalBatchNorm,
  DyT,
  FrozenBatchNorm,
  GroupNorm,
  InstanceNorm,
  LayerNorm,
  LocalResponseNorm,
  RMSNorm,
  SpectralNorm,
  WeightNorm,
)

__version__ = "0.1.0"

__all__ = [
  "AdaLayerNorm",
  "AdaRMSNorm",
  "BatchNorm",
  "BatchRenorm",
  "ConditionalBatchNorm",
  "DyT",
  "FrozenBatchNorm",
  "GroupNorm",
  "InstanceNorm",
  "LayerNorm",
  "LocalResponseNorm",
  "Moments",
  "RMSNorm",
  "SingleValueWarning",
  "SpectralNorm",
  "WeightNorm",
  "adaptive_instance_norm",
  "adaptive_layer_norm",
  "adaptive_rms_norm",
  "add_layer_norm",
  "add_rms_norm",
  "batch_norm",
  "batch_norm_epsilons",
  "batch_norm_step",
  "batch_renorm",
  "batch_renorm_step",
  "conditional_batch_norm_step",
  "convert",
  "debiased_average",
  "dyt",
  "fold_batch_norm",
  "fold_batch_norms",
  "freeze_batch_norm",
  "frozen_batch_norm",
  "gated_residual",
  "group_norm",
  "instance_norm",
  "l2_normalize",
  "layer_norm",
  "local_response_norm",
  "modulate",
  "moments",
  "nnx",
  "normalize",
  "renorm_limits",
  "rms_norm",
  "spectral_norm",
  "update_running_average",
  "weight_norm",
]
