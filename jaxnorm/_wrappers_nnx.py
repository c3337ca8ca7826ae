"""Flax NNX's weight-normalizing wrappers, SpectralNorm and WeightNorm, over the pure maths.

Each subclasses its ``flax.nnx`` namesake (same constructor, the same ``batch_stats``/
``scales`` dictionaries keyed by parameter path, initialized by Flax's own ``__init__``) and
replaces the call. Fixed (google/flax#5576, #5577): Flax's NNX call writes the normalized
weight back into the wrapped layer's parameter, so the raw weight is lost, each call
normalizes an already normalized weight and the optimizer steps in the wrong
parameterization; here the normalized weight is swapped in for the wrapped call only and the
raw one put back. WeightNorm's ``scales`` are ``nnx.Param`` (Flax up to 0.12.10 keeps bare
arrays, which no gradient or optimizer reaches). Only ``nnx.Param`` variables are normalized.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import flax.nnx as nnx
from flax.nnx.module import first_from

from jaxnorm._axes import canonicalize_axes
from jaxnorm._weights import spectral_norm, weight_norm
from jaxnorm._wrappers_linen import _non_matrix_error


@contextlib.contextmanager
def _swapped(swaps: list[tuple[Any, Any]]) -> Iterator[None]:
  """Gives each variable of ``swaps`` its new value for the block, then its old one back."""
  old = [(var, var[...]) for var, _ in swaps]
  try:
    for var, value in swaps:
      var.set_value(value)
    yield
  finally:
    for var, value in old:
      var.set_value(value)


def _params(module: nnx.Module) -> list[tuple[tuple, Any]]:
  return list(nnx.to_flat_state(nnx.state(module, nnx.Param)))


def _missing(what: str, path: tuple) -> RuntimeError:
  return RuntimeError(
    f"No {what} for the parameter {path} of the wrapped layer: it was not there when the "
    f"wrapper was built. Build the wrapper after the layer's parameters exist, and do not "
    f"add parameters to the wrapped layer afterwards."
  )


class SpectralNorm(nnx.SpectralNorm):
  """Spectral normalization of a wrapped layer's weights: a drop-in for
  ``flax.nnx.SpectralNorm`` over :func:`jaxnorm.spectral_norm`, without its in-place
  overwrite of the wrapped weights.

  Same constructor as Flax's (``layer_instance, *, n_steps=1, epsilon=1e-12, dtype=None,
  param_dtype=float32, error_on_non_matrix=False, update_stats=True, rngs``); ``u`` and
  ``sigma`` are ``nnx.BatchStat`` entries of ``batch_stats``, keyed ``path + ('u',)`` and
  ``path + ('sigma',)``. ``model.eval()`` stops updating them, ``model.train()`` resumes.
  Attributes as :class:`jaxnorm.SpectralNorm`.

  >>> import jax.numpy as jnp, flax.nnx as nnx, jaxnorm.nnx as jnnx
  >>> layer = jnnx.SpectralNorm(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
  >>> kernel = layer.layer_instance.kernel[...]
  >>> y = layer(jnp.ones((2, 4)))
  >>> bool((layer.layer_instance.kernel[...] == kernel).all())  # the raw weight is kept
  True
  """

  def __call__(self, x: Any, update_stats: bool | None = None, *args: Any, **kwargs: Any) -> Any:
    """Runs the wrapped layer on ``x`` (and any further arguments) with spectrally
    normalized weights, storing the new ``u`` and ``sigma`` when ``update_stats`` (default:
    the constructor's, or ``model.train()``/``model.eval()``)."""
    update_stats = first_from(
      update_stats,
      not self.use_running_average,
      error_msg="SpectralNorm needs update_stats in the constructor or the call.",
    )
    swaps = []
    for path, param in _params(self.layer_instance):
      value = param[...]
      if value.ndim <= 1 or self.n_steps < 1:
        continue
      if value.ndim > 2 and self.error_on_non_matrix:
        raise _non_matrix_error(value.ndim)
      u_path, sigma_path = path + ("u",), path + ("sigma",)
      if u_path not in self.batch_stats or sigma_path not in self.batch_stats:
        raise _missing("u and sigma (SpectralNorm's batch_stats)", path)
      w_bar, u, sigma = spectral_norm(
        value,
        self.batch_stats[u_path][...],
        n_steps=self.n_steps,
        epsilon=self.epsilon,
        dtype=self.dtype,
      )
      swaps.append((param, w_bar))
      if update_stats:
        self.batch_stats[u_path][...] = u
        self.batch_stats[sigma_path][...] = sigma
    with _swapped(swaps):
      return self.layer_instance(x, *args, **kwargs)


class WeightNorm(nnx.WeightNorm):
  """Weight normalization of a wrapped layer's weights: a drop-in for
  ``flax.nnx.WeightNorm`` over :func:`jaxnorm.weight_norm`, with trainable scales and
  without its in-place overwrite of the wrapped weights.

  Same constructor as Flax's (``layer_instance, *, feature_axes=-1, use_scale=True,
  scale_init=ones, epsilon=1e-12, dtype=None, param_dtype=float32,
  variable_filter=nnx.PathContains('kernel'), promote_dtype, rngs``); ``scales`` maps each
  selected parameter's path to its ``nnx.Param`` scale. Attributes as
  :class:`jaxnorm.WeightNorm`.

  >>> import jax, jax.numpy as jnp, flax.nnx as nnx, jaxnorm.nnx as jnnx
  >>> layer = jnnx.WeightNorm(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
  >>> jax.tree.map(jnp.shape, nnx.state(layer.scales, nnx.Param))
  State({
    ('kernel',): Param(
      value=(3,)
    )
  })
  """

  def __init__(self, layer_instance: nnx.Module, **kwargs: Any) -> None:
    super().__init__(layer_instance, **kwargs)
    if self.scales is not None:  # Flax >= 0.12.11 makes them nnx.Param itself
      self.scales = nnx.data(
        {path: s if isinstance(s, nnx.Param) else nnx.Param(s) for path, s in self.scales.items()}
      )

  def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs the wrapped layer on ``x`` (and any further arguments) with its selected
    parameters weight-normalized."""
    swaps = []
    for path, param in _params(self.layer_instance):
      if not self.variable_filter(path, param):
        continue
      value = param[...]
      scale = None
      if self.use_scale:
        if self.scales is None or path not in self.scales:
          raise _missing("scale (WeightNorm's scales)", path)
        scale = self.scales[path][...]
      features = canonicalize_axes(self.feature_axes, value.ndim)
      swaps.append(
        (
          param,
          weight_norm(value, scale, feature_axes=features, epsilon=self.epsilon, dtype=self.dtype),
        )
      )
    with _swapped(swaps):
      return self.layer_instance(x, *args, **kwargs)
