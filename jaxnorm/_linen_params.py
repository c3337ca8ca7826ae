"""The Linen modules' learned affine parameters, declared in one place for every module
(:mod:`jaxnorm.linen` and :mod:`jaxnorm._modern_linen`)."""

from __future__ import annotations

from typing import Any

import jax


def declare_affine(
  module: Any, shape: tuple[int, ...], use_bias: bool, scale_init: Any = None
) -> tuple[jax.Array | None, jax.Array | None]:
  """Creates ``scale`` (where ``module.use_scale``) then ``bias`` (where ``use_bias``) of
  ``shape``: Flax's order, so random initializers match."""
  scale = bias = None
  if module.use_scale:
    scale = module.param("scale", scale_init or module.scale_init, shape, module.param_dtype)
  if use_bias:
    bias = module.param("bias", module.bias_init, shape, module.param_dtype)
  return scale, bias
