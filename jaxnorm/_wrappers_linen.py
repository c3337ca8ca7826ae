"""Flax linen's weight-normalizing wrappers, SpectralNorm and WeightNorm, over the pure maths.

Each subclasses its ``flax.linen`` namesake (same attributes, defaults, variable names and
collections: ``batch_stats`` ``<layer>/<path>/u`` and ``/sigma``, ``params``
``<layer>/<path>/scale``; at ``init`` the stored weights are the normalized ones, as Flax's)
and calls :func:`jaxnorm.spectral_norm` or :func:`jaxnorm.weight_norm` on the wrapped
layer's parameters. Deliberate differences: only the ``params`` collection is mapped. Flax
maps every collection, so WeightNorm normalized a wrapped BatchNorm's running statistics
(``variable_filter=None``) or, being immutable, refused to let it update them, and
SpectralNorm returned the normalized weights as ``params`` updates under ``mutable=True``.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm._axes import canonicalize_axes
from jaxnorm._weights import spectral_norm, weight_norm


def _name(module: Any, path: tuple) -> str:
  """Flax's name of a wrapped variable: the layer's name, then its path in the collection."""
  return (
    module.layer_instance.name + "/" + jax.tree_util.keystr(path[1:], simple=True, separator="/")
  )


def _non_matrix_error(ndim: int) -> ValueError:
  return ValueError(
    f"Input is {ndim}D but error_on_non_matrix is True: SpectralNorm normalizes matrices; "
    f"pass error_on_non_matrix=False to see a {ndim}D weight as a matrix of its last axis "
    f"(weight.reshape(-1, weight.shape[-1]))."
  )


class SpectralNorm(nn.SpectralNorm):
  """Spectral normalization of a wrapped layer's weights: a drop-in for
  ``flax.linen.SpectralNorm`` over :func:`jaxnorm.spectral_norm`.

  Every parameter of ``layer_instance`` with two or more dimensions is divided by its
  largest singular value, estimated by ``n_steps`` of power iteration from the stored ``u``
  (scalars and vectors pass unchanged). Call with ``update_stats=True`` and
  ``mutable=['batch_stats']`` in training to keep the new ``u`` and ``sigma``; with
  ``update_stats=False`` the stored ones are read, not written.

  Attributes:
    layer_instance: the module whose parameters are normalized.
    n_steps: power-iteration steps per call (0 leaves the weights unchanged).
    epsilon: added inside the root of each ℓ2 normalization.
    dtype: the normalized weights' dtype (default: inferred from the weight and ``u``).
    param_dtype: the dtype of ``u`` and ``sigma``.
    error_on_non_matrix: raise for weights of more than two dimensions instead of seeing
      them as ``(-1, last axis)`` matrices.
    collection_name: the collection of ``u`` and ``sigma`` (Flax's default
      ``'batch_stats'``).

  >>> import jax, jax.numpy as jnp, flax.linen as nn, jaxnorm
  >>> layer = jaxnorm.SpectralNorm(nn.Dense(3))
  >>> x = jnp.ones((2, 4))
  >>> variables = layer.init(jax.random.key(0), x, update_stats=False)
  >>> jax.tree.map(jnp.shape, variables["batch_stats"])
  {'layer_instance/kernel/sigma': (), 'layer_instance/kernel/u': (1, 3)}
  >>> y, updates = layer.apply(variables, x, update_stats=True, mutable=["batch_stats"])
  """

  @nn.compact
  def __call__(self, *args: Any, update_stats: bool, **kwargs: Any) -> Any:
    """Runs ``layer_instance(*args, **kwargs)`` with spectrally normalized weights.

    Args:
      *args: passed on to the wrapped layer.
      update_stats: store the new ``u`` and ``sigma`` (training) or not (evaluation).
      **kwargs: passed on to the wrapped layer.

    Returns:
      The wrapped layer's output.
    """
    normalize = functools.partial(self._normalize_weight, update_stats=update_stats)
    return nn.map_variables(
      lambda layer: layer(*args, **kwargs),
      "params",
      trans_in_fn=lambda vs: jax.tree_util.tree_map_with_path(normalize, vs),
      init=self.is_initializing(),
    )(self.layer_instance)

  def _normalize_weight(self, path: tuple, value: Any, update_stats: bool) -> Any:
    value = jnp.asarray(value)
    if value.ndim <= 1 or self.n_steps < 1:
      return value
    if value.ndim > 2 and self.error_on_non_matrix:
      raise _non_matrix_error(value.ndim)
    name = _name(self, path)
    shape = (1, value.shape[-1])
    rng = None if self.has_variable(self.collection_name, name + "/u") else self.make_rng("params")
    u = self.variable(
      self.collection_name, name + "/u", jax.random.normal, rng, shape, self.param_dtype
    )
    sigma = self.variable(self.collection_name, name + "/sigma", jnp.ones, (), self.param_dtype)
    w_bar, u_new, sigma_new = spectral_norm(
      value, u.value, n_steps=self.n_steps, epsilon=self.epsilon, dtype=self.dtype
    )
    if update_stats:
      u.value, sigma.value = u_new, sigma_new
    return w_bar


class WeightNorm(nn.WeightNorm):
  """Weight normalization of a wrapped layer's weights: a drop-in for
  ``flax.linen.WeightNorm`` over :func:`jaxnorm.weight_norm`.

  Each parameter of ``layer_instance`` whose path (``'Dense_0/kernel'``) contains a string of
  ``variable_filter`` (all of them when the filter is None or empty) is replaced by
  ``scale · w / ‖w‖``, the norm taken per feature of ``feature_axes``.

  Attributes:
    layer_instance: the module whose parameters are normalized.
    epsilon: added to the sum of squares inside the root.
    dtype: the normalized weights' dtype (default: inferred from the weight and scale).
    param_dtype: the dtype of the ``scale`` parameters.
    use_scale: learn a per-feature ``scale`` (``params``: ``<layer>/<path>/scale``).
    scale_init: the scales' initializer (ones; PyTorch's ``weight_norm`` starts ``g`` at
      ``‖v‖`` instead).
    feature_axes: the axes that keep one norm each (default the last); None: one norm over
      the whole weight.
    variable_filter: substrings selecting the parameters to normalize (default
      ``{'kernel'}``).

  >>> import jax, jax.numpy as jnp, flax.linen as nn, jaxnorm
  >>> layer = jaxnorm.WeightNorm(nn.Dense(3))
  >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 4)))
  >>> variables["params"]["layer_instance/kernel/scale"].shape
  (3,)
  """

  @nn.compact
  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    """Runs ``layer_instance(*args, **kwargs)`` with weight-normalized parameters.

    Args:
      *args: passed on to the wrapped layer.
      **kwargs: passed on to the wrapped layer.

    Returns:
      The wrapped layer's output.
    """
    return nn.map_variables(
      lambda layer: layer(*args, **kwargs),
      "params",
      trans_in_fn=lambda vs: jax.tree_util.tree_map_with_path(self._normalize_weight, vs),
      init=self.is_initializing(),
    )(self.layer_instance)

  def _normalize_weight(self, path: tuple, value: Any) -> Any:
    value = jnp.asarray(value)
    name = _name(self, path)
    if self.variable_filter and not any(f in name for f in self.variable_filter):
      return value
    features = () if self.feature_axes is None else canonicalize_axes(self.feature_axes, value.ndim)
    scale = None
    if self.use_scale:
      shape = tuple(value.shape[a] for a in features)
      scale = self.param(name + "/scale", self.scale_init, shape, self.param_dtype)
    return weight_norm(value, scale, feature_axes=features, epsilon=self.epsilon, dtype=self.dtype)
