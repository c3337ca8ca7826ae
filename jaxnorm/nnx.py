"""Flax NNX modules: drop-in replacements for ``flax.nnx``'s norms, thin over the same core.

Each class subclasses its ``flax.nnx`` namesake and takes Flax's constructor parameters in
Flax's order with Flax's defaults (``num_features`` first, ``rngs`` required,
``promote_dtype``, ``bias_metadata``, ``scale_metadata``), then jaxnorm's own, keyword-only.
Its constructor is Flax's (``super().__init__``), so the state is Flax's (``nnx.Param``
``scale``/``bias``, ``nnx.BatchStat`` ``mean``/``var``) and ``nnx.state``/``nnx.update``/
``nnx.split``/``nnx.merge`` and checkpoints of a ``flax.nnx`` model load unchanged; jaxnorm
declares only its own extras. A call runs the pure functions that the Linen modules call;
the meaning of every attribute is documented once, on the Linen class of the same name
(:mod:`jaxnorm.linen`).

    >>> from flax import nnx
    >>> from jaxnorm import nnx as jnnx
    >>> bn = jnnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0))
    >>> y = bn(jnp.arange(12.).reshape(4, 3))           # training: batch statistics
    >>> bn.mean[...].tolist()
    [0.45000001788139343, 0.550000011920929, 0.6500000357627869]
    >>> bn.eval()                                       # inference: running averages
    >>> bn(jnp.zeros((1, 3))).shape
    (1, 3)

Differences from ``flax.nnx`` (beyond those of the Linen modules, see the README):
``GroupNorm`` repeats its group statistics along the channel axis (``flax.nnx.GroupNorm``
repeats them along axis 1, which is wrong when ``reduction_axes`` keeps more than one axis);
``BatchNorm`` can keep statistics of another shape than ``(num_features,)``
(``reduction_axes`` with ``stats_shape``).

The modern norms Flax lacks (:class:`DyT`, :class:`LocalResponseNorm`,
:class:`AdaLayerNorm`, :class:`AdaRMSNorm`, :class:`ConditionalBatchNorm`,
:mod:`jaxnorm._modern_nnx`) follow the same conventions without a Flax class to subclass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
from flax.nnx.nn import dtypes  # (Flax's default promote_dtype, the same object as its own)
from jax.nn import initializers

from jaxnorm import _norms as F
from jaxnorm._axes import Axes, batch_norm_axes, canonicalize_axes, kept_shape
from jaxnorm._batch import (
  check_renorm_schedule,
  check_step,
  check_track_running_stats,
  counts_batches,
  first_use_running_average,
  frozen_batch_norm,
  renorm_schedule,
  renorm_training,
  step,
  training,
)
from jaxnorm._config import configure
from jaxnorm._dtypes import running_stats_dtypes
from jaxnorm._modern_nnx import (
  AdaLayerNorm,
  AdaRMSNorm,
  ConditionalBatchNorm,
  DyT,
  LocalResponseNorm,
)
from jaxnorm._running import check_momentum
from jaxnorm._wrappers_nnx import SpectralNorm, WeightNorm
from jaxnorm.fold import batch_norm_labels

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
  "RMSNorm",
  "SpectralNorm",
  "WeightNorm",
  "freeze_batch_norm",
]

Initializer = Any
Dtype = Any
_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


def _promote(module, arrays):
  """``module.promote_dtype(arrays, dtype=module.dtype)`` under JAX's standard promotion:
  Flax's raises under ``jax_numpy_dtype_promotion="strict"`` for bfloat16 data and float32
  parameters; jaxnorm gives the standard mode's result in either mode."""
  with jax.numpy_dtype_promotion("standard"):
    return module.promote_dtype(arrays, dtype=module.dtype)


def _read(variable):
  return None if variable is None else variable[...]


def _onto(value, shape):
  """A ``(num_features,)`` parameter or statistic of ``flax.nnx`` laid onto ``shape`` (the
  sizes of several feature axes); left as is when the sizes differ, for the pure
  function's shape error to name."""
  if value is None or value.shape == tuple(shape) or value.size != math.prod(shape):
    return value
  return value.reshape(shape)


def _common(module, mask):
  """The keyword arguments every call passes on to its pure function unchanged."""
  return dict(
    epsilon=module.epsilon,
    mask=mask,
    axis_name=module.axis_name,
    axis_index_groups=module.axis_index_groups,
    dtype=module.dtype,
  )


def _onto_features(x, feature_axes, *params):
  """Each of ``params`` (``(num_features,)`` or None) laid onto the feature axes of ``x``."""
  features = canonicalize_axes(feature_axes, jnp.ndim(x), name="feature_axes")
  shape = tuple(jnp.shape(x)[a] for a in features)
  return tuple(_onto(p, shape) for p in params)


class BatchNorm(nnx.BatchNorm):
  """Batch normalization, drop-in for ``flax.nnx.BatchNorm``; the attributes mean what
  they mean on :class:`jaxnorm.linen.BatchNorm`.

  Args:
    num_features: the number of features (the size of ``axis``).
    use_running_average: default mode (False: train on batch statistics); the call
      argument overrides it; ``.train()``, ``.eval()`` and ``nnx.view`` set it.
    axis, momentum, epsilon, dtype, param_dtype, use_bias, use_scale: as in
      :class:`jaxnorm.BatchNorm`.
    bias_init, scale_init, axis_name, axis_index_groups, use_fast_variance: as in
      :class:`jaxnorm.BatchNorm` (``use_fast_variance`` is accepted; the variance is
      always the accurate one).
    promote_dtype: ``flax.nnx``'s function that casts ``(x, mean, var, scale, bias)`` to
      one dtype before the normalization.
    rngs: the random number streams (``params`` initializes ``scale`` and ``bias``).
    bias_metadata, scale_metadata: metadata of the ``bias``/``scale`` ``nnx.Param``.
    reduction_axes: (jaxnorm) the axes of the statistics (default: all but ``axis``).
    stats_shape: (jaxnorm) the shape of the running statistics when ``reduction_axes``
      keeps more than the feature axis, e.g. ``(T, D)`` for per-time-step statistics of a
      ``(B, T, D)`` input with ``reduction_axes=0`` (default ``(num_features,)``).
    virtual_batch_size: (jaxnorm) ghost batches, as in :class:`jaxnorm.linen.BatchNorm`.
    unbiased_running_var: (jaxnorm) PyTorch's running variance and its counter of updates
      (an ``nnx.BatchStat`` ``num_batches_tracked``), as in
      :class:`jaxnorm.linen.BatchNorm`; ``momentum=None`` is PyTorch's cumulative average
      (with the counter too).
    track_running_stats: (jaxnorm) False: no running statistics (``mean`` and ``var``
      are None) and the batch statistics in every mode, PyTorch's
      ``track_running_stats=False`` (default True).
    count_batches: (jaxnorm) False: no counter, as :class:`jaxnorm.linen.BatchNorm`'s.

  The running statistics are ``nnx.BatchStat`` in float32 (float64 for a float64
  ``param_dtype`` under ``jax_enable_x64``); a step whose batch has no valid element or
  non-finite statistics leaves a feature's running values as they were.
  """

  def __init__(
    self,
    num_features: int,
    *,
    use_running_average: bool | None = False,
    axis: int = -1,
    momentum: float = 0.99,
    epsilon: float = 1e-5,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    use_bias: bool = True,
    use_scale: bool = True,
    bias_init: Initializer = initializers.zeros,
    scale_init: Initializer = initializers.ones,
    axis_name: str | None = None,
    axis_index_groups: Any = None,
    use_fast_variance: bool = True,
    promote_dtype: Any = dtypes.promote_dtype,
    rngs: nnx.Rngs,
    bias_metadata: Mapping[str, Any] = _NO_METADATA,
    scale_metadata: Mapping[str, Any] = _NO_METADATA,
    reduction_axes: Axes | None = None,
    stats_shape: tuple[int, ...] | None = None,
    virtual_batch_size: int | None = None,
    unbiased_running_var: bool = False,
    track_running_stats: bool = True,
    count_batches: bool = True,
  ):
    plain = type(self) is BatchNorm
    track = check_track_running_stats(type(self).__name__, track_running_stats, plain)
    super().__init__(
      num_features, use_running_average=use_running_average, axis=axis, momentum=momentum,
      epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
      use_scale=use_scale, bias_init=bias_init, scale_init=scale_init, axis_name=axis_name,
      axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
      promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
      scale_metadata=scale_metadata,
    )  # fmt: skip
    # jaxnorm's extras: statistics of another shape or dtype (float64 under x64), or none.
    shape = (num_features,) if stats_shape is None else tuple(stats_shape)
    mean_dtype, var_dtype = running_stats_dtypes(param_dtype, jnp.float32, dtype)
    if not track:
      none: Any = None  # (declared as data, not as a static attribute)
      self.mean = self.var = nnx.data(none)
    elif (shape, mean_dtype, var_dtype) != (self.mean.shape, self.mean.dtype, self.var.dtype):
      self.mean = nnx.BatchStat(jnp.zeros(shape, mean_dtype))
      self.var = nnx.BatchStat(jnp.ones(shape, var_dtype))
    self.reduction_axes = reduction_axes
    self.virtual_batch_size = virtual_batch_size
    self.unbiased_running_var = unbiased_running_var
    self.track_running_stats = track_running_stats
    self.count_batches = count_batches
    if counts_batches(self):
      self.num_batches_tracked = nnx.BatchStat(jnp.zeros((), jnp.int32))

  def __call__(
    self, x: jax.Array, use_running_average: bool | None = None, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` with the batch statistics (training, updating the running averages)
    or with the running averages; ``use_running_average`` overrides the attribute."""
    use_ra, x, (scale, bias, *running), cfg = self._prepare(x, use_running_average)
    counter = self.num_batches_tracked[...] if counts_batches(self) else None
    check_step(self.momentum, counter)
    y, updated = step(
      training(self.virtual_batch_size), x, scale, bias, tuple(running), cfg, self.epsilon,
      mask, use_running_average=use_ra, initializing=False, momentum=self.momentum,
      unbiased=self.unbiased_running_var, counter=counter,
      layer=f"{type(self).__name__}({self.num_features})",
    )  # fmt: skip
    self._store(updated)
    if updated is not None and counts_batches(self):
      self.num_batches_tracked[...] = updated[2]
    return y

  def _prepare(self, x, use_running_average):
    """The mode, the promoted input, ``(scale, bias, mean, var)`` laid onto its axes, and
    the call's :class:`~jaxnorm._config.Config`: what every BatchNorm-family call starts
    with."""
    use_ra = first_use_running_average(use_running_average, self.use_running_average)
    stored = (_read(self.mean), _read(self.var))
    x, mean, var, scale, bias = _promote(self, (x, *stored, _read(self.scale), _read(self.bias)))
    features, reduced = batch_norm_axes(jnp.ndim(x), self.axis, self.reduction_axes)
    shape = kept_shape(jnp.shape(x), reduced)
    if stored[0] is not None and math.prod(shape) != stored[0].size:
      raise ValueError(
        f"{type(self).__name__}({self.num_features}) keeps running statistics of shape "
        f"{stored[0].shape}, but an input of shape {jnp.shape(x)} reduced over axes {reduced} "
        f"has statistics of shape {shape}; construct it with num_features equal to the "
        f"size of axis={self.axis}, or with stats_shape={shape} when reduction_axes keeps "
        f"more than the feature axis."
      )
    # Inference normalizes with the promoted statistics (as flax.nnx); training updates the
    # stored ones, in their own dtype.
    running = (mean, var) if use_ra else stored
    params = tuple(_onto(p, tuple(jnp.shape(x)[a] for a in features)) for p in (scale, bias))
    args = (*params, *(_onto(s, shape) for s in running))
    cfg = configure(
      x, reduced, features, *params, args[2] if use_ra else None, dtype=self.dtype,
      axis_name=self.axis_name, axis_index_groups=self.axis_index_groups,
    )  # fmt: skip
    return use_ra, x, args, cfg

  def _store(self, updated):
    """Writes a training step's new running statistics (None: nothing to write)."""
    if updated is None:  # (always, without running statistics)
      return
    # The running averages are not trained: no gradient flows into them (as flax.nnx).
    mean, var = jax.lax.stop_gradient(updated[:2])
    self.mean[...] = mean.reshape(self.mean.shape)
    self.var[...] = var.reshape(self.var.shape)

  # set_view (nnx.view's hook) is flax.nnx.BatchNorm's own, whose signature differs between
  # Flax versions.


class BatchRenorm(BatchNorm):
  """Batch Renormalization (Ioffe 2017) for ``flax.nnx``; the arguments mean what they mean
  on :class:`jaxnorm.linen.BatchRenorm` (``r_max``, ``d_max``, ``warmup_steps``,
  ``r_max_steps``, ``d_max_steps``, keyword-only) and on :class:`BatchNorm` (the rest).

  The number of training updates is an ``nnx.BatchStat`` ``steps`` (int32), saved and
  restored with the running statistics, so a checkpoint resumes the schedule.

    >>> from flax import nnx
    >>> from jaxnorm import nnx as jnnx
    >>> brn = jnnx.BatchRenorm(3, warmup_steps=0, r_max_steps=None, d_max_steps=None,
    ...                        rngs=nnx.Rngs(0))
    >>> y = brn(jnp.arange(12.).reshape(4, 3))
    >>> int(brn.steps[...])
    1
  """

  def __init__(
    self,
    num_features: int,
    *,
    r_max: float = 3.0,
    d_max: float = 5.0,
    warmup_steps: int = 5000,
    r_max_steps: int | None = 40000,
    d_max_steps: int | None = 25000,
    **kwargs: Any,
  ):
    if kwargs.get("virtual_batch_size") is not None:
      raise ValueError(
        "BatchRenorm does not take virtual_batch_size (its r and d compare the whole "
        "batch with the running statistics); use BatchNorm(virtual_batch_size=...)."
      )
    if kwargs.get("unbiased_running_var"):
      raise ValueError(
        "BatchRenorm does not take unbiased_running_var (PyTorch's convention belongs to "
        "BatchNorm; Batch Renorm's running statistics are the biased moving averages of its "
        "paper); use BatchNorm(unbiased_running_var=True)."
      )
    super().__init__(num_features, **kwargs)
    check_renorm_schedule(r_max, d_max, warmup_steps, r_max_steps, d_max_steps)
    self.steps = nnx.BatchStat(jnp.zeros((), jnp.int32))
    self.r_max = r_max
    self.d_max = d_max
    self.warmup_steps = warmup_steps
    self.r_max_steps = r_max_steps
    self.d_max_steps = d_max_steps

  def __call__(
    self, x: jax.Array, use_running_average: bool | None = None, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Renormalized batch statistics in training (updating ``mean``, ``var``, ``steps``),
    the running averages otherwise; ``use_running_average`` overrides the attribute."""
    use_ra, x, (scale, bias, mean, var), cfg = self._prepare(x, use_running_average)
    check_momentum(self.momentum)  # (a number: Batch Renorm keeps no counter)
    y, updated = step(
      renorm_training(self.steps[...], **renorm_schedule(self)), x, scale, bias, (mean, var), cfg,
      self.epsilon, mask, use_running_average=use_ra, initializing=False,
      momentum=self.momentum, layer=f"{type(self).__name__}({self.num_features})",
    )  # fmt: skip
    self._store(updated)
    if updated is not None:
      self.steps[...] = self.steps[...] + 1
    return y


class FrozenBatchNorm(BatchNorm):
  """Frozen BatchNorm for ``flax.nnx``: :class:`jaxnorm.linen.FrozenBatchNorm`'s maths
  with :class:`BatchNorm`'s constructor and state (``nnx.Param`` ``scale``/``bias``,
  ``nnx.BatchStat`` ``mean``/``var``), so the state of a trained ``BatchNorm`` loads with
  ``nnx.update`` unchanged. The statistics are never updated, in any mode, and no gradient
  reaches the parameters.

    >>> from flax import nnx
    >>> from jaxnorm import nnx as jnnx
    >>> fbn = jnnx.FrozenBatchNorm(3, rngs=nnx.Rngs(0))
    >>> fbn(jnp.ones((2, 3))).shape
    (2, 3)
  """

  def __call__(
    self, x: jax.Array, use_running_average: bool | None = None, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` with the stored statistics; the arguments are accepted and unused."""
    del use_running_average, mask
    _, x, args, cfg = self._prepare(x, True)
    return frozen_batch_norm(
      x, *args, axis=cfg.features, reduction_axes=cfg.axes, epsilon=self.epsilon,
      dtype=self.dtype,
    )  # fmt: skip


def freeze_batch_norm(
  model: nnx.Module, frozen: str = "frozen", trainable: str = "trainable"
) -> Any:
  """Labels of ``nnx.state(model, nnx.Param)`` for an optimizer that leaves every
  BatchNorm alone (:func:`jaxnorm.freeze_batch_norm` for ``flax.nnx``): the ``scale`` and
  ``bias`` of every module holding a ``mean`` ``BatchStat`` are ``frozen``, the rest
  ``trainable``. Use them as
  ``nnx.Optimizer(model, optax.multi_transform({"trainable": tx, "frozen":
  optax.set_to_zero()}, labels), wrt=nnx.Param)``.

    >>> from flax import nnx
    >>> from jaxnorm import nnx as jnnx
    >>> labels = freeze_batch_norm(jnnx.FrozenBatchNorm(3, rngs=nnx.Rngs(0)))
    >>> labels["scale"], labels["bias"]
    ('frozen', 'frozen')
  """

  def is_variable(a):
    return isinstance(a, nnx.Variable)

  return batch_norm_labels(
    nnx.state(model, nnx.BatchStat),
    nnx.state(model, nnx.Param),
    frozen=frozen,
    trainable=trainable,
    is_leaf=is_variable,
  )


class LayerNorm(nnx.LayerNorm):
  """Layer normalization, drop-in for ``flax.nnx.LayerNorm``; the attributes mean what
  they mean on :class:`jaxnorm.linen.LayerNorm`.

  Args:
    num_features: the size of the feature axes (``scale`` and ``bias`` have this shape).
    epsilon, dtype, param_dtype, use_bias, use_scale, bias_init, scale_init: as in
      :class:`jaxnorm.LayerNorm`.
    reduction_axes, feature_axes, axis_name, axis_index_groups, use_fast_variance: as in
      :class:`jaxnorm.LayerNorm`.
    promote_dtype: casts ``(x, scale, bias)`` to one dtype first (``flax.nnx``'s).
    rngs, bias_metadata, scale_metadata: as in :class:`BatchNorm`.
    residual_dtype: (jaxnorm) the dtype of ``h`` when called with a ``residual`` (Add &
      Norm, see :class:`jaxnorm.linen.LayerNorm`).
    implementation: (jaxnorm) ``"xla"``, ``"pallas"`` or None (see
      :func:`jaxnorm.layer_norm`).
  """

  def __init__(
    self,
    num_features: int,
    *,
    epsilon: float = 1e-6,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    use_bias: bool = True,
    use_scale: bool = True,
    bias_init: Initializer = initializers.zeros,
    scale_init: Initializer = initializers.ones,
    reduction_axes: Axes = -1,
    feature_axes: Axes = -1,
    axis_name: str | None = None,
    axis_index_groups: Any = None,
    use_fast_variance: bool = True,
    promote_dtype: Any = dtypes.promote_dtype,
    rngs: nnx.Rngs,
    bias_metadata: Mapping[str, Any] = _NO_METADATA,
    scale_metadata: Mapping[str, Any] = _NO_METADATA,
    residual_dtype: Dtype | None = None,
    implementation: str | None = None,
  ):
    super().__init__(
      num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
      use_scale=use_scale, bias_init=bias_init, scale_init=scale_init,
      reduction_axes=reduction_axes, feature_axes=feature_axes, axis_name=axis_name,
      axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
      promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
      scale_metadata=scale_metadata,
    )  # fmt: skip
    self.residual_dtype = residual_dtype
    self.implementation = implementation

  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None, residual: jax.Array | None = None
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Applies layer normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`); with a
    ``residual``, Add & Norm returning ``(y, h)`` (see :func:`jaxnorm.add_layer_norm`)."""
    x, scale, bias = _promote(self, (x, _read(self.scale), _read(self.bias)))
    args = _onto_features(x, self.feature_axes, scale, bias)
    kw = dict(
      reduction_axes=self.reduction_axes,
      feature_axes=self.feature_axes,
      implementation=self.implementation,
      **_common(self, mask),
    )
    if residual is None:
      return F.layer_norm(x, *args, **kw)
    return F.add_layer_norm(x, residual, *args, residual_dtype=self.residual_dtype, **kw)


class RMSNorm(nnx.RMSNorm):
  """RMS normalization, drop-in for ``flax.nnx.RMSNorm``; the attributes mean what they
  mean on :class:`jaxnorm.linen.RMSNorm`.

  Args:
    num_features: the size of the feature axes.
    epsilon, dtype, param_dtype, use_scale, scale_init: as in :class:`jaxnorm.RMSNorm`.
    reduction_axes, feature_axes, axis_name, axis_index_groups, use_fast_variance: as in
      :class:`jaxnorm.RMSNorm`.
    promote_dtype: casts ``(x, scale)`` (and ``bias``) to one dtype first.
    rngs, scale_metadata: as in :class:`BatchNorm`.
    use_bias, bias_init, bias_metadata: (jaxnorm) a learned bias ``β`` (default none).
    epsilon_in_root: (jaxnorm) ``x / sqrt(ms + ε)`` if True (Flax's), else ``x / (rms + ε)``.
    zero_centered_scale: (jaxnorm) multiply by ``1 + γ``; ``scale`` starts at
      ``scale_init(...) − 1`` (zeros).
    residual_dtype: (jaxnorm) the dtype of ``h`` in Add & Norm (see :class:`LayerNorm`).
    implementation: (jaxnorm) ``"xla"``, ``"pallas"`` or None (see :class:`LayerNorm`).
  """

  bias: nnx.Param | None  # (jaxnorm) flax.nnx.RMSNorm has no bias

  def __init__(
    self,
    num_features: int,
    *,
    epsilon: float = 1e-6,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    use_scale: bool = True,
    scale_init: Initializer = initializers.ones,
    reduction_axes: Axes = -1,
    feature_axes: Axes = -1,
    axis_name: str | None = None,
    axis_index_groups: Any = None,
    use_fast_variance: bool = True,
    promote_dtype: Any = dtypes.promote_dtype,
    rngs: nnx.Rngs,
    scale_metadata: Mapping[str, Any] = _NO_METADATA,
    use_bias: bool = False,
    bias_init: Initializer = initializers.zeros,
    bias_metadata: Mapping[str, Any] = _NO_METADATA,
    epsilon_in_root: bool = True,
    zero_centered_scale: bool = False,
    residual_dtype: Dtype | None = None,
    implementation: str | None = None,
  ):
    if zero_centered_scale:
      scale_init = F.zero_centered_init(scale_init)
    super().__init__(
      num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
      use_scale=use_scale, scale_init=scale_init, reduction_axes=reduction_axes,
      feature_axes=feature_axes, axis_name=axis_name, axis_index_groups=axis_index_groups,
      use_fast_variance=use_fast_variance, promote_dtype=promote_dtype, rngs=rngs,
      scale_metadata=scale_metadata,
    )  # fmt: skip
    # jaxnorm's extras: a bias (created after the scale, from the same stream, as Flax's
    # other norms do), ε's place and the zero-centred scale.
    none: Any = None
    self.bias = nnx.data(none)
    if use_bias:
      bias = bias_init(rngs.params(), (num_features,), param_dtype)
      self.bias = nnx.Param(bias, **bias_metadata)
    self.use_bias = use_bias
    self.epsilon_in_root = epsilon_in_root
    self.zero_centered_scale = zero_centered_scale
    self.residual_dtype = residual_dtype
    self.implementation = implementation

  def __call__(
    self, x: jax.Array, mask: jax.Array | None = None, *, residual: jax.Array | None = None
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Applies RMS normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`); with a
    ``residual``, Add & Norm returning ``(y, h)`` (see :func:`jaxnorm.add_rms_norm`)."""
    bias = None
    if self.bias is None:  # flax.nnx's own promote_dtype call
      x, scale = _promote(self, (x, _read(self.scale)))
    else:
      x, scale, bias = _promote(self, (x, _read(self.scale), _read(self.bias)))
    kw = dict(
      reduction_axes=self.reduction_axes,
      feature_axes=self.feature_axes,
      epsilon_in_root=self.epsilon_in_root,
      zero_centered_scale=self.zero_centered_scale,
      implementation=self.implementation,
      **_common(self, mask),
    )
    args = _onto_features(x, self.feature_axes, scale, bias)
    if residual is None:
      return F.rms_norm(x, *args, **kw)
    return F.add_rms_norm(x, residual, *args, residual_dtype=self.residual_dtype, **kw)


class GroupNorm(nnx.GroupNorm):
  """Group normalization, drop-in for ``flax.nnx.GroupNorm``; the attributes mean what they
  mean on :class:`jaxnorm.linen.GroupNorm`. Unlike ``flax.nnx.GroupNorm``, the group
  statistics are repeated along the channel axis, so ``reduction_axes`` that keep several
  axes (e.g. ``-1`` on ``(B, T, C)``: statistics per (b, t, group)) are right.

  Args:
    num_features: the number of channels.
    num_groups: the number of groups (default 32); None when ``group_size`` is given.
    group_size: channels per group, instead of ``num_groups``.
    epsilon, dtype, param_dtype, use_bias, use_scale, bias_init, scale_init: as in
      :class:`jaxnorm.GroupNorm`.
    reduction_axes, axis_name, axis_index_groups, use_fast_variance: as in
      :class:`jaxnorm.GroupNorm`.
    promote_dtype: casts ``(x, scale, bias)`` to one dtype first.
    rngs, bias_metadata, scale_metadata: as in :class:`BatchNorm`.
    feature_axis: (jaxnorm) the channel axis (default -1; 1 for NCHW).
  """

  def __init__(
    self,
    num_features: int,
    num_groups: int | None = 32,
    group_size: int | None = None,
    *,
    epsilon: float = 1e-6,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    use_bias: bool = True,
    use_scale: bool = True,
    bias_init: Initializer = initializers.zeros,
    scale_init: Initializer = initializers.ones,
    reduction_axes: Axes | None = None,
    axis_name: str | None = None,
    axis_index_groups: Any = None,
    use_fast_variance: bool = True,
    promote_dtype: Any = dtypes.promote_dtype,
    rngs: nnx.Rngs,
    bias_metadata: Mapping[str, Any] = _NO_METADATA,
    scale_metadata: Mapping[str, Any] = _NO_METADATA,
    feature_axis: int = -1,
  ):
    groups = F.resolve_groups(num_features, num_groups, group_size)  # (jaxnorm's clear errors)
    super().__init__(
      num_features, num_groups=groups, group_size=None, epsilon=epsilon, dtype=dtype,
      param_dtype=param_dtype, use_bias=use_bias, use_scale=use_scale, bias_init=bias_init,
      scale_init=scale_init, reduction_axes=reduction_axes, axis_name=axis_name,
      axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
      promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
      scale_metadata=scale_metadata,
    )  # fmt: skip
    self.feature_axis = feature_axis

  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Applies group normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`)."""
    x, scale, bias = _promote(self, (x, _read(self.scale), _read(self.bias)))
    return F.group_norm(
      x,
      scale,
      bias,
      num_groups=self.num_groups,
      feature_axis=self.feature_axis,
      reduction_axes=self.reduction_axes,
      **_common(self, mask),
    )


class InstanceNorm(nnx.InstanceNorm):
  """Instance normalization, drop-in for ``flax.nnx.InstanceNorm``; the attributes mean
  what they mean on :class:`jaxnorm.linen.InstanceNorm` (``feature_axes=1`` for NCHW).

  Args:
    num_features: the number of channels.
    epsilon, dtype, param_dtype, use_bias, use_scale, bias_init, scale_init: as in
      :class:`jaxnorm.InstanceNorm`.
    feature_axes, axis_name, axis_index_groups, use_fast_variance: as in
      :class:`jaxnorm.InstanceNorm`.
    promote_dtype: casts ``(x, scale, bias)`` to one dtype first.
    rngs, bias_metadata, scale_metadata: as in :class:`BatchNorm`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    epsilon: float = 1e-6,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    use_bias: bool = True,
    use_scale: bool = True,
    bias_init: Initializer = initializers.zeros,
    scale_init: Initializer = initializers.ones,
    feature_axes: Axes = -1,
    axis_name: str | None = None,
    axis_index_groups: Any = None,
    use_fast_variance: bool = True,
    promote_dtype: Any = dtypes.promote_dtype,
    rngs: nnx.Rngs,
    bias_metadata: Mapping[str, Any] = _NO_METADATA,
    scale_metadata: Mapping[str, Any] = _NO_METADATA,
  ):
    super().__init__(
      num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
      use_scale=use_scale, bias_init=bias_init, scale_init=scale_init,
      feature_axes=feature_axes, axis_name=axis_name, axis_index_groups=axis_index_groups,
      use_fast_variance=use_fast_variance, promote_dtype=promote_dtype, rngs=rngs,
      bias_metadata=bias_metadata, scale_metadata=scale_metadata,
    )  # fmt: skip

  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Applies instance normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`)."""
    x, scale, bias = _promote(self, (x, _read(self.scale), _read(self.bias)))
    return F.instance_norm(
      x,
      *_onto_features(x, self.feature_axes, scale, bias),
      feature_axes=self.feature_axes,
      **_common(self, mask),
    )
