"""The BatchNorm family as pure functions, by composition.

One inference path (``_infer``: ``γ·(x − μ)/sqrt(var + ε) + β`` with given statistics)
and one layer step (``step``: the rules of ``init``, inference, training and the update
of the running averages) serve every member; what differs is the training normalization,
a ``Training`` function:

- BatchNorm (Ioffe & Szegedy 2015): ``_plain``, the batch's statistics;
- ghost batches (Hoffer, Hubara & Soudry 2017): ``_ghost``, the plain one over
  sub-batches of ``k`` examples, whose statistics are then pooled for the running averages;
- Batch Renormalization (Ioffe 2017): ``_renorm``, the plain one corrected toward the
  running statistics by the clipped ``r`` and ``d``;
- frozen BatchNorm: the inference path under ``stop_gradient``
  (:func:`jaxnorm.frozen_batch_norm`).

Every check and the unbiased running variance live here once.
"""

from __future__ import annotations

import contextvars
import math
import warnings
from collections.abc import Callable
from typing import Any, overload

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._axes import Axes, batch_norm_axes, complement
from jaxnorm._config import Config, configure, options
from jaxnorm._engine import (
  Moments,
  affine_normalize,
  affine_params,
  apply_statistics,
  broadcast_mask,
  check_epsilon,
  operand,
  psum,
)
from jaxnorm._running import check_momentum, unbiased_variance, update_running_average

Pool = Callable[[Moments], Moments]
# (x, scale, bias, running (mean, var) or None, cfg, ε, mask) → (y, batch moments, pool):
# the pool turns the moments into what the running averages follow.
Training = Callable[..., tuple[jax.Array, Moments, Pool]]


# --- checks ----------------------------------------------------------------------------


class SingleValueWarning(UserWarning):
  """A BatchNorm trained on one value per statistic (a batch of one, on one device): the
  variance is 0 and the output just the bias, as in Flax, whose idioms (``nnx.tabulate`` on
  a dummy batch, transforms' tests) rely on it running. Make it an error with
  ``warnings.filterwarnings("error", category=jaxnorm.SingleValueWarning)``."""


# The layer a module's step runs for, named in warnings (the pure functions' own name else).
_LAYER: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxnorm_layer", default=None)


def check_batch_values(
  x_shape: tuple[int, ...], reduced: tuple[int, ...], axis_name: Any, name: str = "batch_norm"
) -> None:
  """Warns (:class:`SingleValueWarning`, at trace time) if training statistics have one
  value each on one device."""
  if math.prod(x_shape[a] for a in reduced) == 1 and axis_name is None:
    warnings.warn(
      f"{_LAYER.get() or name} is training on one value per statistic: an input of shape "
      f"{x_shape} reduced over axes {reduced} has 1 each, so the variance is 0 and the "
      f"output is just the bias (as in Flax). Use a batch larger than 1, the running "
      f"statistics (use_running_average=True), or LayerNorm/GroupNorm; "
      f"warnings.filterwarnings('error', category=jaxnorm.SingleValueWarning) makes this "
      f"an error.",
      SingleValueWarning,
      stacklevel=2,
    )


def check_track_running_stats(name: str, track_running_stats: bool, plain: bool) -> bool:
  """``track_running_stats``, refused False for every BatchNorm-family class but the
  ``plain`` BatchNorm: Batch Renorm and frozen BatchNorm need the running statistics."""
  if not track_running_stats and not plain:
    raise ValueError(
      f"{name} needs running statistics: track_running_stats=False is for BatchNorm "
      f"(batch statistics in every mode)."
    )
  return bool(track_running_stats)


def counts_batches(module: Any) -> bool:
  """Whether a BatchNorm module keeps PyTorch's counter of updates ``num_batches_tracked``:
  with running statistics and PyTorch's convention (``unbiased_running_var``) or its
  cumulative average (``momentum=None``, which needs the counter), unless its
  ``count_batches`` is False (PyTorch's InstanceNorm, which never counts)."""
  return (
    bool(getattr(module, "track_running_stats", True))
    and bool(getattr(module, "count_batches", True))
    and (module.momentum is None or bool(getattr(module, "unbiased_running_var", False)))
  )


def check_renorm_schedule(
  r_max: Any, d_max: Any, warmup_steps: int, r_max_steps: int | None, d_max_steps: int | None
) -> None:
  """Raises a clear error for limits or a schedule the paper's formulas do not allow
  (traced limits pass unchecked)."""
  for name, value, low in (("r_max", r_max, 1.0), ("d_max", d_max, 0.0)):
    if isinstance(value, int | float) and not value >= low:
      raise ValueError(
        f"{name} must be >= {low} ({name} = {low} is plain BatchNorm), got {value!r}; the "
        f"paper relaxes them to r_max = 3 and d_max = 5."
      )
  if int(warmup_steps) < 0:
    raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}.")
  for name, end in (("r_max_steps", r_max_steps), ("d_max_steps", d_max_steps)):
    if end is not None and int(end) < int(warmup_steps):
      raise ValueError(
        f"{name}={end} comes before the end of the warm-up (warmup_steps={warmup_steps}); "
        f"it is the step at which the final value is reached, so give one >= "
        f"warmup_steps (or None to switch to the final value right after the warm-up)."
      )


def first_use_running_average(argument: bool | None, attribute: bool | None) -> bool:
  """An NNX BatchNorm-family module's mode: the call argument if given, else the attribute
  (``flax.nnx``'s rule)."""
  value = attribute if argument is None else argument
  if value is None:
    raise ValueError(
      "BatchNorm needs use_running_average: pass it to the constructor "
      "(jnnx.BatchNorm(..., use_running_average=False)), to the call "
      "(bn(x, use_running_average=True)), or set it with model.train() / model.eval() or "
      "nnx.view(model, use_running_average=...)."
    )
  return bool(value)


def merge_use_running_average(attribute: bool | None, argument: bool | None) -> bool:
  """A Linen BatchNorm-family module's mode, given exactly once: as the attribute or in
  the call."""
  if (attribute is None) == (argument is None):
    got = "neither" if attribute is None else f"both ({attribute} and {argument})"
    raise ValueError(
      f"BatchNorm needs use_running_average exactly once, in the constructor or in the "
      f"call, but got {got}; e.g. BatchNorm(use_running_average=not train) or "
      f"bn(x, use_running_average=not train)."
    )
  return bool(attribute if argument is None else argument)


def check_step(momentum: Any, num_batches_tracked: Any = None) -> None:
  """A BatchNorm step's momentum: in [0, 1] when concrete, or None (PyTorch's cumulative
  average) with the counter of updates."""
  if momentum is not None:
    check_momentum(momentum)
  elif num_batches_tracked is None:
    raise ValueError(
      "momentum=None (PyTorch's cumulative average) needs the num_batches_tracked counter; "
      "give a momentum in [0, 1] (PyTorch's m is 1 - m here) or the counter (a BatchNorm "
      "keeps it unless count_batches=False)."
    )


def _given_statistics(x_shape: tuple[int, ...], cfg: Config, mean: Any, var: Any) -> list[Any]:
  """``mean`` and ``var`` checked against the statistics' shape of an ``x_shape`` input,
  in ``cfg.dtype`` (a real variance stays real) and shaped to broadcast against ``x``."""
  error = (
    f"{{name}} has shape {{got}}, but the statistics of an input of shape {tuple(x_shape)} "
    f"reduced over {cfg.axes} have shape {{want}}; pass running statistics of that shape "
    f"(were they made with another axis or input layout?)."
  )
  kept = complement(cfg.axes, len(x_shape))
  return [operand(n, s, x_shape, kept, cfg.dtype, error) for n, s in (("mean", mean), ("var", var))]


def batch_config(
  x: jax.Array, axis: Axes, reduction_axes: Axes | None, *operands: Any, **options: Any
) -> Config:
  """The :class:`Config` of a BatchNorm-family call, for the pure functions (``options``:
  dtype, force_float32_reductions, axis_name, axis_index_groups); a module that has its
  axes already builds it with :func:`~jaxnorm._config.configure`."""
  features, reduced = batch_norm_axes(x.ndim, axis, reduction_axes)
  return configure(x, reduced, features, *operands, **options)


# --- inference and the training normalizations -------------------------------------------


def _infer(x, scale, bias, mean, var, cfg, epsilon):
  """BatchNorm with given statistics: the one inference path of the family, one compiled
  program per shape (an eager call dispatched its dozen operations one by one: 1.4x
  Flax's Linen call, 2.3x NNX's; ``benchmarks/RESULTS.md``, item 33)."""
  return _compiled_infer(x, scale, bias, mean, var, check_epsilon(epsilon), cfg)


def _infer_program(x, scale, bias, mean, var, epsilon, cfg):
  gamma, beta = affine_params(scale, bias, jnp.shape(x), cfg)
  mean, var = _given_statistics(jnp.shape(x), cfg, mean, var)
  return apply_statistics(x, gamma, beta, mean, var, cfg, epsilon=epsilon)


_compiled_infer = jax.jit(_infer_program, static_argnums=(6,))


def _same(stats: Moments) -> Moments:
  return stats


def _squeezed(stats: Moments, cfg: Config) -> Moments:
  """The kernel's moments (reduced dims kept) at the statistics' shape."""
  return Moments(*(jnp.squeeze(s, cfg.axes) for s in stats))


def _batch_statistics(x, scale, bias, cfg, epsilon, mask):
  """Normalized with its own statistics (no batch-size check): ``(y, moments)``, the
  moments squeezed to the statistics' shape."""
  gamma, beta = affine_params(scale, bias, x.shape, cfg, shaped=False)
  y, stats = affine_normalize(x, gamma, beta, cfg, epsilon=epsilon, mask=mask)
  return y, _squeezed(stats, cfg)


def _plain(x, scale, bias, running, cfg, epsilon, mask):
  """BatchNorm's training normalization: the batch's statistics."""
  del running
  check_batch_values(x.shape, cfg.axes, cfg.axis_name)
  return (*_batch_statistics(x, scale, bias, cfg, epsilon, mask), _same)


def _ghost(virtual_batch_size: Any) -> Training:
  """Ghost batches: the plain normalization of each consecutive sub-batch of ``k``
  examples along the batch axis (the first reduction axis) with its own statistics, on
  this device; the pool averages the sub-batch statistics over every sub-batch and device,
  weighted by their valid counts (a feature with no valid element anywhere gets count 0)."""

  def train(x, scale, bias, running, cfg, epsilon, mask):
    del running
    b = cfg.axes[0]
    where = f"axis {b} (the batch axis: the first reduction axis) on each device"
    k = _check_virtual_batch_size(virtual_batch_size, x.shape[b], where)
    if k * math.prod(x.shape[a] for a in cfg.axes[1:]) == 1:
      raise ValueError(
        f"virtual_batch_size={k} leaves one value per statistic in each sub-batch of an "
        f"input of shape {x.shape} reduced over axes {cfg.axes} (the variance would be "
        f"0); use virtual_batch_size >= 2."
      )
    # The batch axis split into (N/k, k): the sub-batch index is kept, the k examples reduced.
    shape = x.shape[:b] + (x.shape[b] // k, k) + x.shape[b + 1 :]
    if mask is not None:
      mask = broadcast_mask(mask, x.shape).reshape(shape)

    def shift(a):
      return a + 1 if a >= b else a

    reduced = tuple(b + 1 if a == b else shift(a) for a in cfg.axes)
    sub = cfg.local()._replace(axes=reduced, features=tuple(map(shift, cfg.features)))
    y, stats = _batch_statistics(x.reshape(shape), scale, bias, sub, epsilon, mask)
    group_axis = sum(1 for a in range(b) if a not in reduced)  # among the kept axes

    def pool(stats: Moments) -> Moments:
      def add(values):
        local = [jnp.sum(v, group_axis) for v in values]
        return psum(local, cfg.axis_name, cfg.axis_index_groups)

      return _count_weighted(stats, add)

    return y.reshape(x.shape), stats, pool

  return train


def _count_weighted(stats: Moments, add: Any, repeats: int = 1) -> Moments:
  """The sub-batches' statistics averaged, each weighted by its valid count (a feature with
  no valid element anywhere gets count 0); ``add`` sums a list of arrays over the
  sub-batches, which it sees ``repeats`` times each."""
  count = stats.count.astype(stats.var.dtype)
  mean_sum, var_sum, total = add([count * stats.mean, count * stats.var, count])
  safe = jnp.maximum(total, 1)
  return Moments(mean_sum / safe, var_sum / safe, (total / repeats).astype(stats.count.dtype))


def mapped_ghost(virtual_batch_size: Any) -> Training:
  """Ghost batches along the mapped axis ``cfg.axis_name`` (a ``vmap`` over examples, as
  in Equinox, or devices): each run of ``k`` consecutive members is normalized with its
  own statistics (``axis_index_groups``); the pool averages the sub-batches' statistics
  over the whole axis, weighted by their valid counts, as :func:`_ghost`'s."""

  def train(x, scale, bias, running, cfg, epsilon, mask):
    del running
    if cfg.axis_name is None or cfg.axis_index_groups is not None:
      raise ValueError(
        "ghost batches along a mapped axis need its axis_name and no axis_index_groups of "
        "their own (they are the sub-batches)."
      )
    size = lax.psum(1, cfg.axis_name)
    where = f"the mapped axis {cfg.axis_name!r}"
    k = _check_virtual_batch_size(virtual_batch_size, size, where)
    if k * math.prod(x.shape[a] for a in cfg.axes) == 1:
      raise ValueError(
        f"virtual_batch_size={k} leaves one value per statistic in each sub-batch of "
        f"{where} (the variance would be 0); use virtual_batch_size >= 2."
      )
    groups = tuple(tuple(range(i, i + k)) for i in range(0, size, k))
    y, stats = _batch_statistics(
      x, scale, bias, cfg._replace(axis_index_groups=groups), epsilon, mask
    )

    def pool(stats: Moments) -> Moments:
      return _count_weighted(stats, lambda values: psum(values, cfg.axis_name), repeats=k)

    return y, stats, pool

  return train


def training(virtual_batch_size: int | None = None) -> Training:
  """BatchNorm's training normalization: the whole batch, or ghost batches of
  ``virtual_batch_size`` examples."""
  return _plain if virtual_batch_size is None else _ghost(virtual_batch_size)


def _check_virtual_batch_size(virtual_batch_size: Any, batch: int, where: str) -> int:
  """``virtual_batch_size`` as an int that divides ``batch``, or a clear error."""
  if isinstance(virtual_batch_size, bool) or not isinstance(virtual_batch_size, int | jnp.integer):
    raise TypeError(
      f"virtual_batch_size must be a positive int (examples per sub-batch), got "
      f"{virtual_batch_size!r}."
    )
  k = int(virtual_batch_size)
  if k < 1 or batch % k:
    raise ValueError(
      f"virtual_batch_size={k} must be >= 1 and divide the batch, but {where} has "
      f"{batch} examples; use a batch that is a multiple of {k}, or a virtual_batch_size "
      f"among the divisors of {batch}."
    )
  return k


def _renorm(limits: Any) -> Training:
  """Batch Renormalization's training normalization: with the batch statistics ``μ_B``,
  ``σ_B = sqrt(var_B + ε)`` and the running ``μ``, ``σ = sqrt(var + ε)``,
  ``y = γ·((x − μ_B)/σ_B·r + d) + β`` with ``r = sg(clip(σ_B/σ, 1/r_max, r_max))`` and
  ``d = sg(clip((μ_B − μ)/σ, −d_max, d_max))`` (a feature with no valid element gets
  ``r = 1``, ``d = 0``); ``limits(var)`` gives ``(r_max, d_max)`` (an array of the running
  variance's shape: the schedule's arithmetic on it)."""

  def train(x, scale, bias, running, cfg, epsilon, mask):
    if any(jnp.iscomplexobj(a) for a in (x, scale, bias, running[0])):
      raise TypeError(
        "batch_renorm takes real inputs and parameters (r and d are ratios of real "
        "standard deviations); use batch_norm for complex data."
      )
    check_batch_values(x.shape, cfg.axes, cfg.axis_name, name="batch_renorm")
    mean, var = _given_statistics(x.shape, cfg, *running)
    xhat, stats = affine_normalize(
      x, None, None, cfg._replace(out_dtype=cfg.dtype), epsilon=epsilon, mask=mask
    )
    sigma = jnp.sqrt(var + epsilon)
    valid = stats.count > 0
    r_max, d_max = limits(var)
    r = jnp.clip(jnp.sqrt(stats.var + epsilon) / sigma, 1.0 / r_max, r_max)
    d = jnp.clip((stats.mean - mean) / sigma, -d_max, d_max)
    r = lax.stop_gradient(jnp.where(valid, r, 1.0).astype(cfg.dtype))
    d = lax.stop_gradient(jnp.where(valid, d, 0.0).astype(cfg.dtype))
    gamma, beta = affine_params(scale, bias, x.shape, cfg)
    if gamma is not None:
      r, d = gamma * r, gamma * d
    y = xhat * r + (d if beta is None else d + beta)
    return y.astype(cfg.out_dtype), _squeezed(stats, cfg), _same

  return train


# --- the layer step ----------------------------------------------------------------------


def step(
  train: Training,
  x: jax.Array,
  scale: Any,
  bias: Any,
  running: tuple[Any, Any],
  cfg: Config,
  epsilon: Any,
  mask: Any,
  *,
  use_running_average: bool,
  initializing: bool,
  momentum: Any,
  unbiased: bool = False,
  counter: Any = None,
  layer: str | None = None,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:
  """One call of a BatchNorm-family layer with the training normalization ``train``:
  ``(y, None)`` without an update, ``(y, (mean, var))`` (``+ (counter + 1,)`` with a
  counter) in training. ``layer`` names the module in warnings."""
  token = _LAYER.set(layer)
  try:
    return _step(train, x, scale, bias, running, cfg, epsilon, mask, use_running_average,
                 initializing, momentum, unbiased, counter)  # fmt: skip
  finally:
    _LAYER.reset(token)


def _step(
  train: Training, x: jax.Array, scale: Any, bias: Any, running: tuple[Any, Any], cfg: Config,
  epsilon: Any, mask: Any, use_running_average: bool, initializing: bool, momentum: Any,
  unbiased: bool, counter: Any,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:  # fmt: skip
  if running[0] is None and not initializing:  # no running statistics to use or update
    return train(x, scale, bias, None, cfg, epsilon, mask)[0], None
  if use_running_average:
    return _infer(x, scale, bias, *running, cfg, epsilon), None
  if initializing:  # the batch's statistics on this device alone; a batch of one is accepted
    return _batch_statistics(x, scale, bias, cfg.local(), epsilon, mask)[0], None
  y, stats, pool = train(x, scale, bias, running, cfg, epsilon, mask)
  if unbiased:  # (each sub-batch's own n/(n − 1), before pooling)
    stats = unbiased_variance(stats)
  new = update_running_average(*running, pool(stats), momentum, num_batches_tracked=counter)
  if counter is None:
    return y, new
  return y, (*new, jnp.asarray(counter) + 1)


# --- public functions --------------------------------------------------------------------


@overload
def batch_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  mean: None = None,
  var: None = None,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  virtual_batch_size: int | None = None,
) -> tuple[jax.Array, Moments]: ...


@overload
def batch_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  mean: jax.Array,
  var: jax.Array,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  virtual_batch_size: int | None = None,
) -> jax.Array: ...


def batch_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  mean: jax.Array | None = None,
  var: jax.Array | None = None,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  virtual_batch_size: int | None = None,
) -> jax.Array | tuple[jax.Array, Moments]:
  """Batch normalization (Ioffe & Szegedy 2015): statistics per feature over the batch.

  Training (``mean`` and ``var`` not given): normalizes with the batch statistics over
  ``reduction_axes`` (default: every axis but ``axis``) and returns ``(y, moments)``, the
  batch :class:`Moments` to feed :func:`update_running_average`. Inference (``mean`` and
  ``var`` given, e.g. running averages): normalizes with them and returns ``y`` only.

  Args:
    x: the input, e.g. ``(N, H, W, C)`` or ``(B, T, D)``.
    scale: optional ``γ`` of the feature shape ``[x.shape[a] for a in axis]``.
    bias: optional ``β`` of the feature shape.
    mean: statistics to use instead of the batch's, of the statistics' shape (the shape of
      ``x`` without ``reduction_axes``).
    var: the variance to go with ``mean``.
    axis: the feature axis or axes (default -1).
    reduction_axes: axes of the statistics (default: all axes not in ``axis``). For a
      sequence ``(B, T, D)``, ``reduction_axes=0`` keeps statistics per time step and feature.
    epsilon: constant >= 0 added to the variance (default 1e-5).
    mask: optional boolean mask broadcastable to ``x`` (see :func:`normalize`).
    axis_name: optional mapped axis to combine statistics across (count-weighted).
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.
    virtual_batch_size: in training, normalize each consecutive sub-batch of this many
      examples along the batch axis (the first of ``reduction_axes``) with its own
      statistics ("ghost" batches, Hoffer et al. 2017); sub-batches stay on their device.
      The returned moments are then the means of the sub-batch means and variances over
      every sub-batch (and device), weighted by their valid counts: what the running
      averages follow. Ignored at inference.

  Returns:
    ``(y, Moments)`` when training, ``y`` with given statistics.

  Raises:
    ValueError: in training with a single value per statistic (the variance would be 0
      and the output just ``β``), with only one of ``mean`` and ``var``, with statistics
      or parameters of the wrong shape, or with a ``virtual_batch_size`` that does not
      divide the batch.

  >>> x = jnp.array([[1., 10.], [3., 30.]])
  >>> y, stats = batch_norm(x, epsilon=1e-12)
  >>> y.tolist(), stats.mean.tolist(), stats.var.tolist()
  ([[-1.0, -1.0], [1.0, 1.0]], [2.0, 20.0], [1.0, 100.0])
  """
  with jax.named_scope("jaxnorm.batch_norm"):
    x = jnp.asarray(x)
    if (mean is None) != (var is None):
      raise ValueError(
        "batch_norm got only one of mean and var; pass both (inference with given "
        "statistics) or neither (training with the batch's statistics)."
      )
    opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
    cfg = batch_config(x, axis, reduction_axes, scale, bias, mean, **opts)
    if mean is not None:
      return _infer(x, scale, bias, mean, var, cfg, epsilon)
    y, stats, pool = training(virtual_batch_size)(x, scale, bias, None, cfg, epsilon, mask)
    return y, pool(stats)


def batch_norm_step(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  running_mean: jax.Array | None,
  running_var: jax.Array | None,
  *,
  use_running_average: bool,
  momentum: Any = 0.99,
  initializing: bool = False,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  virtual_batch_size: int | None = None,
  unbiased_running_var: bool = False,
  num_batches_tracked: Any = None,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:
  """One call of a BatchNorm layer, as a pure function: ``(y, new_running_stats)``.

  - ``use_running_average``: normalize with ``running_mean``/``running_var``; no update
    (``None`` is returned for the statistics).
  - ``initializing`` (a module's ``init``): normalize with the batch statistics, without
    ``axis_name`` (init may run outside the mapped axis) and without updating the running
    statistics. A dummy batch with one value per feature is accepted there and gives what
    Flax gives, ``β``.
  - training: normalize with the batch statistics (refusing one value per feature) and
    return the updated running averages (:func:`jaxnorm.update_running_average`: Flax's
    momentum convention; a feature whose batch has no valid element or non-finite
    statistics keeps its running values).

  Args:
    x: the input.
    scale: ``γ`` of the feature shape, or None.
    bias: ``β`` of the feature shape, or None.
    running_mean: the running mean, of the statistics' shape; None for a layer without
      running statistics (PyTorch's ``track_running_stats=False``): it normalizes with
      the batch statistics in every mode and returns no update.
    running_var: the running variance, of the statistics' shape (None with the mean).
    use_running_average: normalize with the running statistics (inference).
    momentum: decay rate of the running averages, in [0, 1] (checked when concrete).
    initializing: True while a module is being initialized.
    axis: the feature axis or axes.
    reduction_axes: the axes of the statistics (default: all but ``axis``).
    epsilon: constant >= 0 added to the variance.
    mask: optional boolean mask broadcastable to ``x`` (training only).
    axis_name: optional mapped axis to combine the batch statistics across.
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.
    virtual_batch_size: in training, statistics per sub-batch of this many examples
      (:func:`jaxnorm.batch_norm`); the running averages follow the sub-batches' mean
      statistics. Not used at ``init`` (whose dummy batch may be smaller) nor at inference.
    unbiased_running_var: store the unbiased batch variance in the running average
      (PyTorch's convention; with ``virtual_batch_size``, the mean of the sub-batches'
      unbiased variances).
    num_batches_tracked: the number of training updates so far (PyTorch's counter): with
      it the step also returns the counter plus one, and ``momentum=None`` is PyTorch's
      cumulative average.

  Returns:
    ``(y, (new_mean, new_var))`` in training (``(y, (new_mean, new_var,
    num_batches_tracked + 1))`` when ``num_batches_tracked`` is given), ``(y, None)``
    otherwise.

  >>> x = jnp.array([[1., 10.], [3., 30.]])
  >>> y, (mean, var) = batch_norm_step(
  ...   x, None, None, jnp.zeros(2), jnp.ones(2), use_running_average=False, momentum=0.5)
  >>> mean.tolist(), var.tolist()
  ([1.0, 10.0], [1.0, 50.5])
  """
  return layer_step(
    training(virtual_batch_size), x, scale, bias, running_mean, running_var,
    use_running_average=use_running_average, momentum=momentum, initializing=initializing,
    axis=axis, reduction_axes=reduction_axes, epsilon=epsilon, mask=mask,
    axis_name=axis_name, axis_index_groups=axis_index_groups, dtype=dtype,
    force_float32_reductions=force_float32_reductions, unbiased=unbiased_running_var,
    counter=num_batches_tracked,
  )  # fmt: skip


def layer_step(
  train: Training,
  x: jax.Array,
  scale: Any,
  bias: Any,
  running_mean: Any,
  running_var: Any,
  *,
  use_running_average: bool,
  momentum: Any = 0.99,
  initializing: bool = False,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: Any = 1e-5,
  mask: Any = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  unbiased: bool = False,
  counter: Any = None,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:
  """A step of the pure functions, from :func:`batch_norm_step`'s keywords: the checks,
  the record (the running mean's dtype joins at inference), then :func:`step`."""
  check_step(momentum, counter)
  x = jnp.asarray(x)
  given = running_mean if use_running_average else None
  opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
  cfg = batch_config(x, axis, reduction_axes, scale, bias, given, **opts)
  return step(train, x, scale, bias, (running_mean, running_var), cfg, epsilon, mask,
              use_running_average=use_running_average, initializing=initializing,
              momentum=momentum, unbiased=unbiased, counter=counter)  # fmt: skip


def renorm_limits(
  step: Any,
  *,
  r_max: float = 3.0,
  d_max: float = 5.0,
  warmup_steps: int = 5000,
  r_max_steps: int | None = 40000,
  d_max_steps: int | None = 25000,
) -> tuple[jax.Array, jax.Array]:
  """``(r_max, d_max)`` in force at training step ``step`` (0 for the first update).

  For the first ``warmup_steps`` steps they are 1 and 0 (plain BatchNorm); from there
  they grow linearly to ``r_max`` at step ``r_max_steps`` and to ``d_max`` at
  ``d_max_steps`` and stay there. ``None`` switches to the final value when the warm-up
  ends; ``warmup_steps=0`` with both ``None`` gives fixed limits from the first step.
  The defaults are the paper's schedule (Ioffe 2017, section 4: warm-up 5k steps,
  ``r_max = 3`` reached at 40k, ``d_max = 5`` at 25k).

  >>> [float(r) for r in renorm_limits(jnp.array([0, 5000, 22500, 40000, 90000]))[0]]
  [1.0, 1.0, 2.0, 3.0, 3.0]
  """
  check_renorm_schedule(r_max, d_max, warmup_steps, r_max_steps, d_max_steps)
  step = jnp.asarray(step, jnp.float32)

  def ramp(start, final, end):
    if end is None or end == warmup_steps:
      return jnp.where(step >= warmup_steps, final, start)
    frac = jnp.clip((step - warmup_steps) / (end - warmup_steps), 0.0, 1.0)
    return start + (final - start) * frac

  return ramp(1.0, r_max, r_max_steps), ramp(0.0, d_max, d_max_steps)


def batch_renorm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  mean: jax.Array,
  var: jax.Array,
  r_max: Any = 3.0,
  d_max: Any = 5.0,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> tuple[jax.Array, Moments]:
  """Batch Renormalization (Ioffe 2017) in training: the batch's statistics, corrected
  toward ``mean`` and ``var`` (the running statistics) by the clipped ``r`` and ``d``.

  With the batch statistics ``μ_B``, ``σ_B = sqrt(var_B + ε)`` and the running ``μ``,
  ``σ = sqrt(var + ε)``: ``y = γ·((x − μ_B)/σ_B·r + d) + β`` with
  ``r = sg(clip(σ_B/σ, 1/r_max, r_max))`` and ``d = sg(clip((μ_B − μ)/σ, −d_max, d_max))``
  (``sg``: stop_gradient; the gradient is BatchNorm's, with ``r`` and ``d`` held constant).
  Inference is :func:`jaxnorm.batch_norm` with the running statistics.

  Args:
    x: the input.
    scale: optional ``γ`` of the feature shape.
    bias: optional ``β`` of the feature shape.
    mean: the running mean, of the statistics' shape.
    var: the running variance, of the statistics' shape.
    r_max: the bound of ``r`` (>= 1; 1 gives BatchNorm), a number or a traced scalar
      (e.g. from :func:`renorm_limits`).
    d_max: the bound of ``|d|`` (>= 0; 0 gives BatchNorm).
    axis, reduction_axes, epsilon, mask, axis_name: as in :func:`jaxnorm.batch_norm` (the
      batch statistics are exact across devices and masks; a feature with no valid element
      gets ``r = 1``, ``d = 0``).
    axis_index_groups, dtype, force_float32_reductions: as in :func:`jaxnorm.batch_norm`.

  Returns:
    ``(y, Moments)``: the output and the batch moments (to feed
    :func:`jaxnorm.update_running_average`).

  >>> x = jnp.array([[0., 1.], [2., 5.]])
  >>> y, stats = batch_renorm(x, mean=jnp.zeros(2), var=jnp.ones(2), epsilon=0.0)
  >>> y.tolist()  # r = σ_B/σ clipped to [1/3, 3], d = μ_B/σ clipped to [-5, 5]
  [[0.0, 1.0], [2.0, 5.0]]
  """
  with jax.named_scope("jaxnorm.batch_renorm"):
    x = jnp.asarray(x)
    opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
    cfg = batch_config(x, axis, reduction_axes, scale, bias, **opts)
    train = _renorm(lambda _: (r_max, d_max))
    y, stats, _ = train(x, scale, bias, (mean, var), cfg, epsilon, mask)
    return y, stats


RENORM_SCHEDULE = ("r_max", "d_max", "warmup_steps", "r_max_steps", "d_max_steps")


def renorm_schedule(module: Any) -> dict[str, Any]:
  """A BatchRenorm module's schedule, the keywords of :func:`renorm_limits`."""
  return {name: getattr(module, name) for name in RENORM_SCHEDULE}


def renorm_training(steps: Any, **schedule: Any) -> Training:
  """Batch Renorm's training normalization at the limits :func:`renorm_limits` gives at
  ``steps`` (``schedule``: all five of its keywords)."""
  check_renorm_schedule(**schedule)  # (now, not when the limits are traced)

  def limits(var):
    # (the step on the running variance's shape, added and converted there: the schedule
    # then runs in the small arrays' kernel, not as XLA:TPU's scalar instructions: 5
    # kernels forward against 11, RESULTS items 53 and 58; 0·var's NaN converts to 0)
    step = jnp.asarray(steps)
    zero = (0.0 * var.astype(jnp.float32)).astype(step.dtype)
    return renorm_limits((step + zero).astype(jnp.float32), **schedule)

  return _renorm(limits)


# batch_norm_step's keywords that Batch Renorm's step takes too.
_RENORM_STEP_OPTIONS = {
  "use_running_average", "momentum", "initializing", "axis", "reduction_axes", "epsilon",
  "mask", "axis_name", "axis_index_groups", "dtype", "force_float32_reductions",
}  # fmt: skip


def batch_renorm_step(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  running_mean: jax.Array,
  running_var: jax.Array,
  steps: jax.Array,
  *,
  r_max: float = 3.0,
  d_max: float = 5.0,
  warmup_steps: int = 5000,
  r_max_steps: int | None = 40000,
  d_max_steps: int | None = 25000,
  **options: Any,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array] | None]:
  """One call of a BatchRenorm layer, as a pure function: ``(y, (mean, var, steps))``.

  :func:`jaxnorm.batch_norm_step` with Batch Renorm's training normalization
  (:func:`batch_renorm`) at the limits :func:`renorm_limits` gives at ``steps`` (the
  number of training updates so far, returned plus one); ``options`` are
  :func:`~jaxnorm.batch_norm_step`'s (``use_running_average`` is required; ghost batches
  and PyTorch's running-variance convention are BatchNorm's alone).

  >>> y, (mean, var, steps) = batch_renorm_step(
  ...   jnp.array([[1., 10.], [3., 30.]]), None, None, jnp.zeros(2), jnp.ones(2),
  ...   jnp.array(0), use_running_average=False, momentum=0.5)
  >>> mean.tolist(), var.tolist(), int(steps)
  ([1.0, 10.0], [1.0, 50.5], 1)
  """
  unknown = sorted(set(options) - _RENORM_STEP_OPTIONS)
  if unknown or "use_running_average" not in options:
    raise TypeError(
      f"batch_renorm_step takes use_running_average (required) and the options "
      f"{sorted(_RENORM_STEP_OPTIONS - {'use_running_average'})} of batch_norm_step, got "
      f"{unknown or 'no use_running_average'}; ghost batches and unbiased_running_var are "
      f"BatchNorm's (batch_norm_step)."
    )
  check_momentum(options.get("momentum", 0.99))  # (a number: Batch Renorm has no counter)
  schedule = dict(r_max=r_max, d_max=d_max, warmup_steps=warmup_steps,
                  r_max_steps=r_max_steps, d_max_steps=d_max_steps)  # fmt: skip
  train = renorm_training(steps, **schedule)
  y, new = layer_step(train, x, scale, bias, running_mean, running_var, **options)
  if new is None:
    return y, None
  return y, (new[0], new[1], jnp.asarray(steps) + 1)


def frozen_batch_norm(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  mean: jax.Array,
  var: jax.Array,
  *,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array:
  """Frozen BatchNorm: BatchNorm at inference, ``γ·(x − μ)·rsqrt(var + ε) + β``, with every
  statistic and parameter held constant (``stop_gradient``; the gradient w.r.t. ``x`` is
  ``γ·rsqrt(var + ε)·dy``), as torchvision's ``FrozenBatchNorm2d``: the fine-tuning recipe
  of detection and segmentation, where batches of 1–2 make batch statistics noise.

  Args:
    x: the input.
    scale: ``γ`` of the feature shape, or None.
    bias: ``β`` of the feature shape, or None.
    mean: the (running) mean, of the statistics' shape.
    var: the (running) variance, of the statistics' shape.
    axis, reduction_axes, epsilon, dtype, force_float32_reductions: as in
      :func:`jaxnorm.batch_norm`.

  >>> frozen_batch_norm(jnp.array([[1., 2.]]), jnp.array([2., 1.]), None,
  ...                   jnp.array([1., 0.]), jnp.array([4., 1.]), epsilon=0.0).tolist()
  [[0.0, 2.0]]
  """
  x = jnp.asarray(x)
  cfg = batch_config(x, axis, reduction_axes, scale, bias, mean,
                     **options(dtype, force_float32_reductions))  # fmt: skip
  gamma, beta, mu, sigma2 = (None if a is None else lax.stop_gradient(a)
                             for a in (scale, bias, mean, var))  # fmt: skip
  return _infer(x, gamma, beta, mu, sigma2, cfg, epsilon)
