"""Flax linen modules: drop-in replacements for ``flax.linen``'s norms, thin over the maths.

Each module subclasses its ``flax.linen`` namesake, so it has every constructor attribute
in Flax's order with Flax's defaults, and ``isinstance``/``issubclass`` checks against
Flax's classes hold; it has the same ``__call__`` signature and the same variable tree
(``params``: ``scale``, ``bias``; ``batch_stats``: ``mean``, ``var``), so swapping
``nn.BatchNorm`` for ``jaxnorm.BatchNorm`` keeps a model's checkpoints and its results equal
to float32 rounding. A module only creates its variables and calls a pure function
(:mod:`jaxnorm._norms`, :mod:`jaxnorm._batch`); jaxnorm's own attributes come after Flax's.

Differences that go beyond Flax, never changing what Flax's arguments mean: the variance is
always the accurate centred one (``use_fast_variance`` is accepted for compatibility; see
``benchmarks/RESULTS.md`` for what it costs); masked groups with no valid element give no
NaN; running statistics skip features whose batch has no valid element or non-finite
statistics; BatchNorm refuses to train on one value per feature; BatchNorm can reduce over
a subset of the non-feature axes (``reduction_axes``); GroupNorm takes a ``feature_axis``
(channels-first data); RMSNorm can add a bias, put epsilon outside the root and use a
zero-centred scale.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.nn import initializers

from jaxnorm import _norms as F
from jaxnorm._axes import Axes, batch_norm_axes, canonicalize_axes, channel_axis, kept_shape
from jaxnorm._batch import (
  check_step,
  check_track_running_stats,
  counts_batches,
  frozen_batch_norm,
  merge_use_running_average,
  renorm_schedule,
  renorm_training,
  step,
  training,
)
from jaxnorm._config import Config, configure
from jaxnorm._dtypes import running_stats_dtypes
from jaxnorm._linen_params import declare_affine
from jaxnorm._modern_linen import (  # noqa: F401 (the Linen set)
  AdaLayerNorm,
  AdaRMSNorm,
  ConditionalBatchNorm,
  DyT,
  LocalResponseNorm,
)
from jaxnorm._running import check_momentum
from jaxnorm._wrappers_linen import SpectralNorm, WeightNorm  # noqa: F401 (the Linen set)

Initializer = Any
Dtype = Any


def _layer_name(module: nn.Module) -> str:
  """The module's class and path (``BatchNorm 'block1/bn'``), for warnings."""
  path = "/".join(module.path)
  return f"{type(module).__name__} {path!r}" if path else type(module).__name__


def _batch_norm_variables(module: Any, x: jax.Array) -> tuple[Any, ...]:
  """A BatchNorm-family module's axes and variables, as Flax's BatchNorm declares them:
  ``(feature axes, reduction axes, mean, var, scale, bias)`` (the statistics as Flax
  variables, the parameters as values or None)."""
  features, reduced = batch_norm_axes(x.ndim, module.axis, module.reduction_axes)
  stats_shape = kept_shape(x.shape, reduced)
  mean_dtype, var_dtype = running_stats_dtypes(
    module.param_dtype, x.dtype, module.dtype, module.force_float32_reductions
  )
  ra_mean = ra_var = None
  track = getattr(module, "track_running_stats", True)  # (BatchRenorm has no such field)
  if check_track_running_stats(type(module).__name__, track, type(module) is BatchNorm):
    ra_mean = module.variable("batch_stats", "mean", jnp.zeros, stats_shape, mean_dtype)
    ra_var = module.variable("batch_stats", "var", jnp.ones, stats_shape, var_dtype)
  scale, bias = declare_affine(module, tuple(x.shape[a] for a in features), module.use_bias)
  return features, reduced, ra_mean, ra_var, scale, bias


def _batch_config(module: Any, x: jax.Array, use_ra: bool, variables: tuple) -> Config:
  """A BatchNorm-family module's :class:`~jaxnorm._config.Config`, built once from its
  ``_batch_norm_variables``: axes, devices, dtypes (the running mean joins the dtypes at
  inference, as in Flax)."""
  features, reduced, ra_mean, _, scale, bias = variables
  given = ra_mean.value if use_ra and ra_mean is not None else None
  return configure(
    x, reduced, features, scale, bias, given, dtype=module.dtype,
    force_float32_reductions=module.force_float32_reductions, axis_name=module.axis_name,
    axis_index_groups=module.axis_index_groups,
  )  # fmt: skip


def _common(module: Any, mask: jax.Array | None) -> dict[str, Any]:
  """The keyword arguments every module passes on to its pure function unchanged."""
  return dict(
    epsilon=module.epsilon,
    mask=mask,
    axis_name=module.axis_name,
    axis_index_groups=module.axis_index_groups,
    dtype=module.dtype,
    force_float32_reductions=module.force_float32_reductions,
  )


class BatchNorm(nn.BatchNorm):
  """Batch normalization (Ioffe & Szegedy 2015), drop-in for ``flax.linen.BatchNorm``.

  ``y = γ·(x − μ)/sqrt(σ² + ε) + β`` with ``μ, σ²`` the batch statistics per feature in
  training and the running averages in ``batch_stats`` at inference. In training (called
  with ``mutable=['batch_stats']``) the running averages are updated as
  ``ra = momentum·ra + (1 − momentum)·batch`` (biased variance, Flax's convention; PyTorch's
  ``momentum=0.1`` is ``momentum=0.9`` here); a feature whose batch has no valid element or
  non-finite statistics (a NaN in the batch) keeps its running values. ``init`` does not
  update them, and a dummy batch with one value per feature is accepted there (the output
  is then ``β``, as in Flax). The logic is :func:`jaxnorm.batch_norm_step`'s.

  >>> import jax, jaxnorm
  >>> bn = jaxnorm.BatchNorm(use_running_average=False, momentum=0.9)
  >>> x = jax.random.normal(jax.random.key(0), (8, 3))
  >>> variables = bn.init(jax.random.key(1), x)
  >>> jax.tree_util.tree_map(jnp.shape, variables)
  {'batch_stats': {'mean': (3,), 'var': (3,)}, 'params': {'bias': (3,), 'scale': (3,)}}
  >>> y, updates = bn.apply(variables, x, mutable=['batch_stats'])

  Attributes:
    use_running_average: if True, normalize with the stored running statistics instead of
      the batch's (give it here or in the call, exactly once).
    axis: the feature axis or axes (default -1).
    momentum: decay rate of the running averages, in [0, 1] (default 0.99).
    epsilon: constant >= 0 added to the variance (default 1e-5).
    dtype: the output dtype and the minimum dtype of the statistics (default: inferred
      from the input and parameters, as in Flax).
    param_dtype: dtype of ``scale`` and ``bias`` (default float32).
    use_bias: add the learned bias ``β``.
    use_scale: multiply by the learned scale ``γ``.
    bias_init: initializer of ``β`` (default zeros).
    scale_init: initializer of ``γ`` (default ones).
    axis_name: mapped axis (``pmap``/``shard_map``) to combine batch statistics across;
      they are weighted by each device's valid count. Not used during ``init``.
    axis_index_groups: groups of indices along ``axis_name`` to normalize separately.
    use_fast_variance: accepted for compatibility with Flax. jaxnorm always computes the
      accurate centred variance (its cost against Flax's ``E[x²] − E[x]²`` is measured in
      ``benchmarks/RESULTS.md``).
    force_float32_reductions: compute statistics in at least float32 and store the running
      averages in the promotion of float32 and ``param_dtype`` (float64 with
      ``param_dtype=float64`` under ``jax_enable_x64``) (default True). If False, statistics
      use the input's (or ``dtype``'s) precision, summed in float32, and the running
      averages use ``param_dtype``. The running mean is complex for complex inputs.
    reduction_axes: (jaxnorm) the axes of the statistics, a subset of the non-feature axes
      (default: all of them). For a sequence ``(B, T, D)`` with ``reduction_axes=0``, the
      statistics are kept per time step and feature; ``batch_stats`` then has shape
      ``(T, D)`` while ``scale`` and ``bias`` stay ``(D,)``.
    unbiased_running_var: (jaxnorm) store the unbiased batch variance ``n/(n − 1)·var``
      in the running average, PyTorch's convention (``n``: the valid count across devices
      and masks); the output still uses the biased one, as PyTorch's (default False).
      ``batch_stats`` then holds PyTorch's counter of updates ``num_batches_tracked``
      (int32), and ``momentum=None`` is PyTorch's cumulative average (which also keeps
      the counter).
    virtual_batch_size: (jaxnorm) in training, normalize each consecutive sub-batch of
      this many examples along the batch axis (the first reduction axis) with its own
      statistics: ghost batch normalization (Hoffer et al. 2017). The batch on each device
      must be a multiple of it; the running averages follow the mean of the sub-batch
      statistics; ``init`` and inference are unchanged (default None: the whole batch).
    track_running_stats: (jaxnorm) False: keep no running statistics (no ``batch_stats``)
      and normalize with the batch statistics in training and at inference alike, as
      PyTorch's ``track_running_stats=False``; ``use_running_average`` is then optional
      and changes nothing (default True).
    count_batches: (jaxnorm) False: no ``num_batches_tracked`` counter even with
      ``unbiased_running_var``, as PyTorch's InstanceNorm with running statistics, which
      never counts (``momentum=None``, which reads the counter, is then refused)
      (default True).
  """

  reduction_axes: Axes | None = None
  virtual_batch_size: int | None = None
  unbiased_running_var: bool = False
  track_running_stats: bool = True
  count_batches: bool = True

  @nn.compact
  def __call__(
    self, x: jax.Array, use_running_average: bool | None = None, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` with batch statistics (training) or running averages.

    Args:
      x: the input.
      use_running_average: if True, use the running averages (overrides nothing: give it
        either here or as the attribute).
      mask: optional boolean array broadcastable to ``x``: only True positions enter the
        batch statistics; a feature with no valid element keeps its running averages.

    Returns:
      The normalized input, of ``x``'s shape.
    """
    use_ra = False  # without running statistics the mode changes nothing
    if self.track_running_stats:
      use_ra = merge_use_running_average(self.use_running_average, use_running_average)
    x = jnp.asarray(x)
    variables = _batch_norm_variables(self, x)
    _, _, ra_mean, ra_var, scale, bias = variables
    tracked = None
    if counts_batches(self):
      tracked = self.variable("batch_stats", "num_batches_tracked", jnp.zeros, (), jnp.int32)
    counter = None if tracked is None else tracked.value
    check_step(self.momentum, counter)
    cfg = _batch_config(self, x, use_ra, variables)
    running = (None, None) if ra_mean is None else (ra_mean.value, ra_var.value)
    y, updated = step(
      training(self.virtual_batch_size), x, scale, bias, running, cfg, self.epsilon, mask,
      use_running_average=use_ra, initializing=self.is_initializing(),
      momentum=self.momentum, unbiased=self.unbiased_running_var, counter=counter,
      layer=_layer_name(self),
    )  # fmt: skip
    if updated is not None:  # (None without running statistics)
      ra_mean.value, ra_var.value = updated[:2]
      if tracked is not None:
        tracked.value = updated[2]
    return y


class BatchRenorm(nn.BatchNorm):
  """Batch Renormalization (Ioffe 2017): BatchNorm whose training output is corrected
  toward the running statistics (:func:`jaxnorm.batch_renorm`), for small or non-i.i.d.
  batches.

  In training ``y = γ·((x − μ_B)/σ_B·r + d) + β`` with ``r = sg(clip(σ_B/σ, 1/r_max,
  r_max))`` and ``d = sg(clip((μ_B − μ)/σ, −d_max, d_max))`` against the running ``μ`` and
  ``σ = sqrt(var + ε)``; at inference BatchNorm's ``γ·(x − μ)/σ + β``. ``r_max`` and
  ``d_max`` follow :func:`jaxnorm.renorm_limits` (by default the paper's schedule: plain
  BatchNorm for 5k steps, then ``r_max`` relaxed to 3 by step 40k and ``d_max`` to 5 by
  25k; ``warmup_steps=0, r_max_steps=None, d_max_steps=None`` fixes them). The number of
  training updates is kept in ``batch_stats`` as ``steps`` (an int32 scalar, next to
  ``mean`` and ``var``), so a restored checkpoint resumes the schedule.

  >>> import jax, jaxnorm
  >>> brn = jaxnorm.BatchRenorm(use_running_average=False, warmup_steps=0,
  ...                           r_max_steps=None, d_max_steps=None)
  >>> x = jax.random.normal(jax.random.key(0), (4, 3))
  >>> variables = brn.init(jax.random.key(1), x)
  >>> jax.tree_util.tree_map(jnp.shape, variables["batch_stats"])
  {'mean': (3,), 'steps': (), 'var': (3,)}
  >>> y, updates = brn.apply(variables, x, mutable=["batch_stats"])
  >>> int(updates["batch_stats"]["steps"])
  1

  Attributes:
    use_running_average, axis, momentum, epsilon, dtype, param_dtype, use_bias, use_scale,
    bias_init, scale_init, axis_name, axis_index_groups, use_fast_variance,
    force_float32_reductions, reduction_axes: as in :class:`BatchNorm` (the batch
      statistics are exact across devices and with masks).
    r_max: the final bound of ``r`` (>= 1; default 3).
    d_max: the final bound of ``|d|`` (>= 0; default 5).
    warmup_steps: training steps of plain BatchNorm first (default 5000).
    r_max_steps: the step at which ``r_max`` is reached, linearly from the end of the
      warm-up (default 40000; None: at once).
    d_max_steps: the same for ``d_max`` (default 25000).
  """

  reduction_axes: Axes | None = None
  r_max: float = 3.0
  d_max: float = 5.0
  warmup_steps: int = 5000
  r_max_steps: int | None = 40000
  d_max_steps: int | None = 25000

  @nn.compact
  def __call__(
    self, x: jax.Array, use_running_average: bool | None = None, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x``: renormalized batch statistics in training (updating ``mean``,
    ``var`` and ``steps``), the running averages otherwise; arguments as in
    :meth:`BatchNorm.__call__`."""
    use_ra = merge_use_running_average(self.use_running_average, use_running_average)
    x = jnp.asarray(x)
    variables = _batch_norm_variables(self, x)
    _, _, ra_mean, ra_var, scale, bias = variables
    steps = self.variable("batch_stats", "steps", jnp.zeros, (), jnp.int32)
    check_momentum(self.momentum)  # (a number: Batch Renorm keeps no counter)
    cfg = _batch_config(self, x, use_ra, variables)
    train = renorm_training(steps.value, **renorm_schedule(self))
    y, updated = step(
      train, x, scale, bias, (ra_mean.value, ra_var.value),
      cfg, self.epsilon, mask, use_running_average=use_ra,
      initializing=self.is_initializing(), momentum=self.momentum, layer=_layer_name(self),
    )  # fmt: skip
    if updated is not None:
      ra_mean.value, ra_var.value = updated
      steps.value = steps.value + 1
    return y


class FrozenBatchNorm(BatchNorm):
  """BatchNorm with fixed statistics and affine parameters
  (:func:`jaxnorm.frozen_batch_norm`): ``γ·(x − μ)·rsqrt(var + ε) + β``, never updated,
  never trained.

  It takes every :class:`BatchNorm` attribute and call argument, so a model written for
  BatchNorm builds it unchanged; ``use_running_average``, ``momentum``, ``mask``,
  ``axis_name`` and ``virtual_batch_size`` have no effect (there are no batch statistics).
  Its variables are BatchNorm's (``params``: ``scale``, ``bias``; ``batch_stats``:
  ``mean``, ``var``), and an unnamed one is auto-named ``BatchNorm_<i>`` as a BatchNorm in
  its place would be, so a trained BatchNorm's variables load without renaming. No gradient reaches
  them; :func:`jaxnorm.freeze_batch_norm` labels them for an optimizer that must also
  leave them out of weight decay.

  >>> import jax, jaxnorm
  >>> x = jax.random.normal(jax.random.key(0), (4, 3))
  >>> variables = jaxnorm.BatchNorm(use_running_average=True).init(jax.random.key(1), x)
  >>> y = jaxnorm.FrozenBatchNorm().apply(variables, x)
  """

  def __post_init__(self):
    # Unnamed, it takes its parent's next BatchNorm_<i> (swapping keeps every path); Flax names by
    # class with no public hook, so this reads its internals (tested on lowest and newest Flax).
    parent = self.parent
    if parent is nn.module._unspecified_parent:
      stack = nn.module._context.module_stack
      parent = stack[-1] if stack else None
    if self.name is None and isinstance(parent, nn.Module) and not parent._state.in_setup:
      cursor = parent._state.autoname_cursor.get("BatchNorm", 0)
      object.__setattr__(self, "name", f"BatchNorm_{cursor}")
      parent._state.autoname_cursor["BatchNorm"] = cursor + 1
    super().__post_init__()

  @nn.compact
  def __call__(
    self, x: jax.Array, use_running_average: bool | None = None, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` with the stored statistics; the arguments are accepted and unused."""
    del use_running_average, mask
    x = jnp.asarray(x)
    features, reduced, ra_mean, ra_var, scale, bias = _batch_norm_variables(self, x)
    return frozen_batch_norm(
      x,
      scale,
      bias,
      ra_mean.value,
      ra_var.value,
      axis=features,
      reduction_axes=reduced,
      epsilon=self.epsilon,
      dtype=self.dtype,
      force_float32_reductions=self.force_float32_reductions,
    )


class LayerNorm(nn.LayerNorm):
  """Layer normalization (Ba et al. 2016), drop-in for ``flax.linen.LayerNorm``.

  ``y = γ·(x − μ)/sqrt(σ² + ε) + β`` with statistics per sample over ``reduction_axes``
  (by default the last axis: per token of a ``(B, T, D)`` sequence).

  >>> import jax, jaxnorm
  >>> ln = jaxnorm.LayerNorm()
  >>> x = jnp.array([[1., 2., 3., 4.]])
  >>> variables = ln.init(jax.random.key(0), x)
  >>> print(ln.apply(variables, x))
  [[-1.3416 -0.4472  0.4472  1.3416]]

  Attributes:
    epsilon: constant >= 0 added to the variance (default 1e-6).
    dtype: the output dtype and the minimum dtype of the statistics (default: inferred).
    param_dtype: dtype of ``scale`` and ``bias`` (default float32).
    use_bias: add the learned bias ``β``.
    use_scale: multiply by the learned scale ``γ``.
    bias_init: initializer of ``β`` (default zeros).
    scale_init: initializer of ``γ`` (default ones).
    reduction_axes: axes of the statistics (default -1).
    feature_axes: axes the scale and bias run along (default -1).
    axis_name: mapped axis to combine statistics across (count-weighted).
    axis_index_groups: groups of indices along ``axis_name``.
    use_fast_variance: accepted for compatibility; the variance is always the accurate one.
    force_float32_reductions: compute statistics in at least float32 (default True).
    residual_dtype: (jaxnorm) the dtype of the residual stream ``h`` returned when called
      with a ``residual`` (Add & Norm), e.g. float32 under bfloat16 activations (default:
      the promotion of the input's and the residual's).
    implementation: (jaxnorm) ``"xla"``, ``"pallas"`` (the fused row kernels) or None
      (default; see :func:`jaxnorm.layer_norm`).
  """

  residual_dtype: Dtype | None = None
  implementation: str | None = None

  @nn.compact
  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None, residual: jax.Array | None = None
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Applies layer normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`).

    With a ``residual`` (jaxnorm), Add & Norm: returns ``(y, h)`` with ``h = x + residual``
    in ``residual_dtype`` and ``y`` the norm of ``h`` (see :func:`jaxnorm.add_layer_norm`).
    """
    x = jnp.asarray(x)
    features = canonicalize_axes(self.feature_axes, x.ndim, name="feature_axes")
    scale, bias = declare_affine(self, tuple(x.shape[a] for a in features), self.use_bias)
    kw = dict(
      reduction_axes=self.reduction_axes,
      feature_axes=features,
      implementation=self.implementation,
      **_common(self, mask),
    )
    if residual is None:
      return F.layer_norm(x, scale, bias, **kw)
    return F.add_layer_norm(x, residual, scale, bias, residual_dtype=self.residual_dtype, **kw)


class RMSNorm(nn.RMSNorm):
  """RMS normalization (Zhang & Sennrich 2019), drop-in for ``flax.linen.RMSNorm``.

  ``y = γ·x / sqrt(mean(x²) + ε)``, statistics per sample over ``reduction_axes``. Beyond
  Flax: an optional bias, epsilon outside the root (``x / (rms + ε)``), and a zero-centred
  scale ``(1 + γ)`` as in Gemma.

  >>> import jax, jaxnorm
  >>> rms = jaxnorm.RMSNorm(zero_centered_scale=True)
  >>> variables = rms.init(jax.random.key(0), jnp.ones((2, 4)))
  >>> variables['params']['scale'].tolist()   # stored γ − 1: the effective scale is 1
  [0.0, 0.0, 0.0, 0.0]

  Attributes:
    epsilon: constant >= 0 added to the mean square (default 1e-6).
    dtype: the output dtype and the minimum dtype of the statistics (default: inferred).
    param_dtype: dtype of ``scale`` (and ``bias``) (default float32).
    use_scale: multiply by the learned scale ``γ``.
    scale_init: initializer of the effective scale (default ones). With
      ``zero_centered_scale`` the stored parameter is ``scale_init(...) − 1`` (zeros).
    reduction_axes: axes of the mean square (default -1).
    feature_axes: axes the scale (and bias) run along (default -1).
    axis_name: mapped axis to combine statistics across (count-weighted).
    axis_index_groups: groups of indices along ``axis_name``.
    use_fast_variance: accepted for compatibility (the mean square has one formula).
    force_float32_reductions: compute statistics in at least float32 (default True).
    use_bias: (jaxnorm) add a learned bias ``β`` (default False, as in Flax).
    bias_init: (jaxnorm) initializer of ``β`` (default zeros).
    epsilon_in_root: (jaxnorm) ``x / sqrt(ms + ε)`` if True (default, Flax's), else
      ``x / (sqrt(ms) + ε)``.
    zero_centered_scale: (jaxnorm) multiply by ``1 + γ`` with γ stored zero-centred.
    residual_dtype: (jaxnorm) the dtype of ``h`` in Add & Norm (see :class:`LayerNorm`).
    implementation: (jaxnorm) ``"xla"``, ``"pallas"`` or None (see :class:`LayerNorm`).
  """

  use_bias: bool = False
  bias_init: Initializer = initializers.zeros
  epsilon_in_root: bool = True
  zero_centered_scale: bool = False

  residual_dtype: Dtype | None = None
  implementation: str | None = None

  @nn.compact
  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None, residual: jax.Array | None = None
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Applies RMS normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`); with a
    ``residual``, Add & Norm returning ``(y, h)`` (see :func:`jaxnorm.add_rms_norm`)."""
    x = jnp.asarray(x)
    features = canonicalize_axes(self.feature_axes, x.ndim, name="feature_axes")
    scale_init = self.scale_init
    if self.zero_centered_scale:
      scale_init = F.zero_centered_init(scale_init)
    scale, bias = declare_affine(
      self, tuple(x.shape[a] for a in features), self.use_bias, scale_init
    )
    kw = dict(
      reduction_axes=self.reduction_axes,
      feature_axes=features,
      epsilon_in_root=self.epsilon_in_root,
      zero_centered_scale=self.zero_centered_scale,
      implementation=self.implementation,
      **_common(self, mask),
    )
    if residual is None:
      return F.rms_norm(x, scale, bias, **kw)
    return F.add_rms_norm(x, residual, scale, bias, residual_dtype=self.residual_dtype, **kw)


class GroupNorm(nn.GroupNorm):
  """Group normalization (Wu & He 2018), drop-in for ``flax.linen.GroupNorm``.

  Channels are split into ``num_groups`` contiguous groups; statistics run per sample
  over each group and the other reduction axes. ``num_groups=1`` is LayerNorm over
  ``(H, W, C)``; one channel per group is InstanceNorm. Beyond Flax, ``feature_axis=1``
  handles channels-first (NCHW) data.

  >>> import jax, jaxnorm
  >>> gn = jaxnorm.GroupNorm(num_groups=2)
  >>> x = jnp.array([[1., 2., 3., 10., 20., 30.]])
  >>> variables = gn.init(jax.random.key(0), x)
  >>> print(gn.apply(variables, x))
  [[-1.2247  0.      1.2247 -1.2247  0.      1.2247]]

  Attributes:
    num_groups: number of channel groups (default 32); None when ``group_size`` is given.
    group_size: channels per group, instead of ``num_groups``.
    epsilon: constant >= 0 added to the variance (default 1e-6).
    dtype: the output dtype and the minimum dtype of the statistics (default: inferred).
    param_dtype: dtype of ``scale`` and ``bias`` (default float32).
    use_bias: add the learned bias ``β``.
    use_scale: multiply by the learned scale ``γ``.
    bias_init: initializer of ``β`` (default zeros).
    scale_init: initializer of ``γ`` (default ones).
    reduction_axes: axes of the statistics; must include the channel axis (default: all
      axes except the leading batch axis).
    axis_name: mapped axis to combine statistics across (count-weighted).
    axis_index_groups: groups of indices along ``axis_name``.
    use_fast_variance: accepted for compatibility; the variance is always the accurate one.
    force_float32_reductions: compute statistics in at least float32 (default True).
    feature_axis: (jaxnorm) the channel axis (default -1; 1 for NCHW).
  """

  feature_axis: int = -1

  @nn.compact
  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Applies group normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`)."""
    x = jnp.asarray(x)
    f = channel_axis(self.feature_axis, x.ndim)
    scale, bias = declare_affine(self, (x.shape[f],), self.use_bias)
    return F.group_norm(
      x,
      scale,
      bias,
      num_groups=self.num_groups,
      group_size=self.group_size,
      feature_axis=f,
      reduction_axes=self.reduction_axes,
      **_common(self, mask),
    )


class InstanceNorm(nn.InstanceNorm):
  """Instance normalization (Ulyanov et al. 2016), drop-in for ``flax.linen.InstanceNorm``.

  Statistics per (sample, channel) over every axis except the leading batch axis and
  ``feature_axes``; ``feature_axes=1`` handles channels-first (NCHW) data.

  >>> import jax, jaxnorm
  >>> inorm = jaxnorm.InstanceNorm(feature_axes=1)        # NCHW
  >>> x = jnp.arange(8.).reshape(1, 2, 2, 2)
  >>> variables = inorm.init(jax.random.key(0), x)
  >>> print(inorm.apply(variables, x)[0, 0])
  [[-1.3416 -0.4472]
   [ 0.4472  1.3416]]

  Attributes:
    epsilon: constant >= 0 added to the variance (default 1e-6).
    dtype: the output dtype and the minimum dtype of the statistics (default: inferred).
    param_dtype: dtype of ``scale`` and ``bias`` (default float32).
    use_bias: add the learned bias ``β``.
    use_scale: multiply by the learned scale ``γ``.
    bias_init: initializer of ``β`` (default zeros).
    scale_init: initializer of ``γ`` (default ones).
    feature_axes: the channel axes (default -1; must not include the batch axis 0).
    axis_name: mapped axis to combine statistics across (count-weighted).
    axis_index_groups: groups of indices along ``axis_name``.
    use_fast_variance: accepted for compatibility; the variance is always the accurate one.
    force_float32_reductions: compute statistics in at least float32 (default True).
  """

  @nn.compact
  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Applies instance normalization to ``x`` (``mask``: see :func:`jaxnorm.normalize`)."""
    x = jnp.asarray(x)
    features = canonicalize_axes(self.feature_axes, x.ndim, name="feature_axes")
    scale, bias = declare_affine(self, tuple(x.shape[a] for a in features), self.use_bias)
    return F.instance_norm(
      x,
      scale,
      bias,
      feature_axes=features,
      **_common(self, mask),
    )
