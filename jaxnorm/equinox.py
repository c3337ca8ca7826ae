"""Equinox modules: drop-in replacements for ``eqx.nn``'s norms, thin over the same maths.

:class:`LayerNorm`, :class:`RMSNorm`, :class:`GroupNorm` and :class:`BatchNorm` subclass
their ``equinox.nn`` namesakes: the same constructor arguments and defaults, the same fields
in the same order (so ``eqx.tree_serialise_leaves`` checkpoints load either way), the same
``eqx.nn.State`` protocol for BatchNorm (``eqx.nn.make_with_state``, its ``StateIndex``
fields, the ``"ema"`` and ``"batch"`` modes), and Equinox's per-sample convention: a module
sees one example and is mapped over the batch with ``jax.vmap`` (BatchNorm's statistics
cross the mapped axis through its ``axis_name``). Only ``__call__`` differs: it calls
:func:`jaxnorm.layer_norm`, :func:`jaxnorm.rms_norm`, :func:`jaxnorm.group_norm`,
:func:`jaxnorm.batch_norm` and :func:`jaxnorm.moments` on the example (as a batch of one).

Beyond Equinox: statistics in at least float32 (Equinox's BatchNorm takes bfloat16 batch
statistics in bfloat16), a ``mask=`` keyword on every call (positions that do not count;
a fully masked group gives the bias, not NaN), BatchNorm statistics across the mapped axis
weighted by each example's valid count (Equinox averages per-example means, which is exact
only when every example counts equally), the ``"batch"`` mode's running statistics
debiased without Equinox's inflated variance (:func:`jaxnorm.debiased_average`), the
small-batch family (ghost batches through ``virtual_batch_size``, :class:`BatchRenorm`,
:class:`FrozenBatchNorm`), and clear errors.

The weight wrappers :class:`SpectralNorm` and :class:`WeightNorm` subclass ``eqx.nn``'s
too; the modern norms Equinox lacks (:class:`DyT`, :class:`AdaLayerNorm`,
:class:`AdaRMSNorm`, :class:`ConditionalBatchNorm`, :class:`LocalResponseNorm`) follow its
conventions (:mod:`jaxnorm._modern_equinox`).

Equinox is an optional dependency: ``pip install "jaxnorm[equinox]"``; only this module
imports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

try:
  import equinox as eqx
except ImportError as error:  # pragma: no cover - the message is the point
  raise ImportError(
    "jaxnorm.equinox needs Equinox, which is optional: pip install 'jaxnorm[equinox]' "
    "(or pip install equinox)."
  ) from error

from jaxnorm._batch import (
  batch_norm,
  batch_renorm_step,
  check_renorm_schedule,
  frozen_batch_norm,
  layer_step,
  mapped_ghost,
  renorm_schedule,
  training,
)
from jaxnorm._engine import moments
from jaxnorm._modern_equinox import (
  AdaLayerNorm,
  AdaRMSNorm,
  ConditionalBatchNorm,
  DyT,
  LocalResponseNorm,
  SpectralNorm,
  WeightNorm,
)
from jaxnorm._norms import group_norm, layer_norm, rms_norm
from jaxnorm._running import check_momentum, debiased_average, update_running_average

__all__ = [
  "AdaLayerNorm",
  "AdaRMSNorm",
  "BatchNorm",
  "BatchRenorm",
  "ConditionalBatchNorm",
  "DyT",
  "FrozenBatchNorm",
  "GroupNorm",
  "LayerNorm",
  "LocalResponseNorm",
  "RMSNorm",
  "SpectralNorm",
  "WeightNorm",
  "freeze_batch_norms",
]

_NO_STATE: Any = object()  # "no state passed": then only the output is returned


def _with_state(out: jax.Array, state: Any) -> Any:
  return out if state is _NO_STATE else (out, state)


def _check_shape(name: str, shape: tuple[int, ...], x: jax.Array) -> None:
  if x.shape != shape:
    raise ValueError(
      f"{name}(shape) normalizes one example of exactly that shape: expected x.shape == "
      f"{shape}, got {x.shape}. For a batch, map it over the batch axis: "
      f"jax.vmap({name.lower()})(x)."
    )


def _batched_mask(mask: jax.Array | None) -> jax.Array | None:
  return None if mask is None else jnp.asarray(mask)[None]


def _whole_example(name: str, fn: Any, module: Any, x: jax.Array, state: Any, mask: Any) -> Any:
  """LayerNorm's and RMSNorm's call: ``fn`` over every axis of one example of ``module.shape``
  (a batch of one), the elementwise weight and bias, the output in ``x``'s dtype."""
  _check_shape(name, module.shape, x)
  with jax.named_scope(f"jaxnorm.equinox.{name}"):
    axes = tuple(range(1, x.ndim + 1))  # every axis of the example; axis 0 is the batch of one
    y = fn(
      x[None],
      module.weight,
      module.bias,
      reduction_axes=axes,
      feature_axes=axes,
      epsilon=module.eps,
      mask=_batched_mask(mask),
      dtype=x.dtype,
    )[0]
  return _with_state(y, state)


class LayerNorm(eqx.nn.LayerNorm):
  """Layer normalization over the whole example: a drop-in for ``eqx.nn.LayerNorm`` over
  :func:`jaxnorm.layer_norm` (Ba et al. 2016).

  ``y = (x − mean(x)) / sqrt(var(x) + eps) · weight + bias``, the statistics over every
  axis of ``x`` (whose shape must be ``shape``), ``weight`` and ``bias`` of that shape.

  Attributes:
    shape: the shape of one example.
    eps: added to the variance (Equinox's default 1e-5).
    use_weight: whether there is a learnable ``weight`` (ones).
    use_bias: whether there is a learnable ``bias`` (zeros).
    weight (jax.Array | None): the scale, ``shape``, or None.
    bias (jax.Array | None): the shift, ``shape``, or None.

  >>> import jax, jax.numpy as jnp, jaxnorm.equinox as jeqx
  >>> norm = jeqx.LayerNorm(4)
  >>> jax.vmap(norm)(jnp.array([[1.0, 2.0, 3.0, 4.0]])).round(4)
  Array([[-1.3416, -0.4472,  0.4472,  1.3416]], dtype=float32)
  """

  def __call__(
    self, x: jax.Array, state: Any = _NO_STATE, *, key: Any = None, mask: Any = None
  ) -> Any:
    """Normalizes one example ``x`` of shape ``shape``.

    Args:
      x: one example.
      state: passed through unchanged (for interchangeability with BatchNorm); when given,
        ``(output, state)`` is returned.
      key: ignored (Equinox's convention).
      mask: optional booleans broadcastable to ``x``: the positions that count.

    Returns:
      The output in ``x``'s dtype, or ``(output, state)``.
    """
    return _whole_example("LayerNorm", layer_norm, self, x, state, mask)


class RMSNorm(eqx.nn.RMSNorm):
  """Root-mean-square normalization over the whole example: a drop-in for
  ``eqx.nn.RMSNorm`` over :func:`jaxnorm.rms_norm` (Zhang & Sennrich 2019).

  ``y = x / sqrt(mean(x²) + eps) · weight + bias`` over every axis of ``x``.

  Attributes:
    shape: the shape of one example.
    eps: added to the mean square (Equinox's default 1e-5).
    use_weight: whether there is a learnable ``weight`` (ones).
    use_bias: whether there is a learnable ``bias`` (zeros; Equinox's default True).
    weight (jax.Array | None): the scale, ``shape``, or None.
    bias (jax.Array | None): the shift, ``shape``, or None.

  >>> import jax, jax.numpy as jnp, jaxnorm.equinox as jeqx
  >>> jax.vmap(jeqx.RMSNorm(2))(jnp.array([[3.0, 4.0]])).round(4)
  Array([[0.8485, 1.1314]], dtype=float32)
  """

  def __call__(
    self, x: jax.Array, state: Any = _NO_STATE, *, key: Any = None, mask: Any = None
  ) -> Any:
    """Normalizes one example ``x`` of shape ``shape``; arguments as
    :meth:`LayerNorm.__call__`."""
    return _whole_example("RMSNorm", rms_norm, self, x, state, mask)


class GroupNorm(eqx.nn.GroupNorm):
  """Group normalization of one channels-first example: a drop-in for ``eqx.nn.GroupNorm``
  over :func:`jaxnorm.group_norm` (Wu & He 2018).

  The channels (axis 0 of ``x``) are split into ``groups`` groups; each is normalized over
  its channels and every other axis, then ``weight``/``bias`` apply per channel.

  Attributes:
    groups: the number of groups; divides the channels.
    channels: the number of channels (may be None without affine parameters).
    eps: added to the variance (Equinox's default 1e-5).
    channelwise_affine: whether there are per-channel ``weight`` and ``bias``.
    weight (jax.Array | None): the scale, ``(channels,)``, or None.
    bias (jax.Array | None): the shift, ``(channels,)``, or None.

  >>> import jax, jax.numpy as jnp, jaxnorm.equinox as jeqx
  >>> x = jnp.arange(8.0).reshape(1, 4, 2)
  >>> jax.vmap(jeqx.GroupNorm(2, 4))(x)[0, :, 0].round(4)
  Array([-1.3416,  0.4472, -1.3416,  0.4472], dtype=float32)
  """

  def __call__(
    self, x: jax.Array, state: Any = _NO_STATE, *, key: Any = None, mask: Any = None
  ) -> Any:
    """Normalizes one example ``x`` of shape ``(channels, ...)``; arguments as
    :meth:`LayerNorm.__call__`."""
    if x.ndim < 1 or (self.channels is not None and x.shape[0] != self.channels):
      raise ValueError(
        f"GroupNorm(groups={self.groups}, channels={self.channels}) takes one example of "
        f"shape (channels, ...) = ({self.channels}, ...), got {x.shape}. For a batch, map "
        f"it over the batch axis: jax.vmap(group_norm)(x)."
      )
    with jax.named_scope("jaxnorm.equinox.GroupNorm"):
      y = group_norm(
        x[None],
        self.weight,
        self.bias,
        num_groups=self.groups,
        feature_axis=1,
        epsilon=self.eps,
        mask=_batched_mask(mask),
        dtype=x.dtype,
      )[0]
    return _with_state(y, state)


def _check_example(name: str, input_size: int, axis_name: Any, x: jax.Array) -> None:
  if x.ndim < 1 or x.shape[0] != input_size:
    raise ValueError(
      f"{name}(input_size={input_size}) takes one example of shape ({input_size}, ...), "
      f"got {x.shape}: call it inside jax.vmap(bn, axis_name={axis_name!r}, "
      f"in_axes=(0, None), out_axes=(0, None))."
    )


def _running_statistics(bn: Any, state: Any) -> tuple[jax.Array, jax.Array]:
  """The statistics a BatchNorm normalizes with at inference: the "ema" mode's running
  averages, or the "batch" mode's hidden averages debiased (their start, mean 0 and
  variance 1, taken out: :func:`jaxnorm.debiased_average`)."""
  if bn.mode == "ema":
    return state.get(bn.ema_state_index)
  counter = state.get(bn.batch_counter)
  hidden_mean, hidden_var = state.get(bn.batch_state_index)
  return (
    debiased_average(hidden_mean, counter, bn.momentum, initial=0.0),
    debiased_average(hidden_var, counter, bn.momentum, initial=1.0),
  )


class BatchNorm(eqx.nn.BatchNorm):
  """Batch normalization across a ``vmap``-ped (or ``pmap``-ped) batch: a drop-in for
  ``eqx.nn.BatchNorm`` over :func:`jaxnorm.batch_norm_step` (Ioffe & Szegedy 2015).

  Called on one example ``x`` of shape ``(input_size, ...)`` inside a ``jax.vmap`` with
  ``axis_name``: the statistics per channel cover the example's other axes and every example
  of the mapped axis (each weighted by its valid count). Equinox's two modes:

  - ``"batch"``: training normalizes with the batch statistics and keeps exponential
    averages ``hidden ← m·hidden + (1 − m)·batch`` from Equinox's start (mean 0, variance
    1), debiased at inference (:func:`jaxnorm.debiased_average`: the start taken out, then
    divided by ``1 − m^t``; Equinox omits taking out the start, which inflates its
    variance by ``m^t/(1 − m^t)``); the choice for new code.
  - ``"ema"`` (the default, with Equinox's warning): training normalizes with the running
    averages themselves, updated first (the first batch fills them).

  A channel whose batch has no valid element (``mask``) or non-finite statistics keeps its
  running values. ``virtual_batch_size=k`` (jaxnorm, ``"batch"`` mode): ghost batches
  (Hoffer et al. 2017), each run of ``k`` consecutive examples of the mapped axis normalized
  with its own statistics; the running averages follow the sub-batches' count-weighted mean
  statistics. It is a static field, so checkpoints are Equinox's.

  Attributes:
    weight (jax.Array | None): the per-channel scale, or None.
    bias (jax.Array | None): the per-channel shift, or None.
    axis_name: the name (or names) of the mapped batch axis.
    inference: use the running statistics (toggled by ``eqx.nn.inference_mode``).
    input_size: the number of channels.
    eps: added to the variance (1e-5).
    channelwise_affine: whether there are ``weight`` and ``bias``.
    momentum: the running averages' momentum (0.99).
    mode: ``"ema"`` or ``"batch"``.
    virtual_batch_size: examples per ghost batch, or None (the whole mapped axis).

  >>> import jax, jax.numpy as jnp, equinox as eqx, jaxnorm.equinox as jeqx
  >>> bn, state = eqx.nn.make_with_state(jeqx.BatchNorm)(2, "batch", mode="batch")
  >>> x = jnp.array([[1.0, 10.0], [3.0, 30.0]])
  >>> y, state = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
  >>> y.round(3)
  Array([[-1., -1.],
         [ 1.,  1.]], dtype=float32)
  """

  virtual_batch_size: int | None = eqx.field(static=True)

  def __init__(self, *args: Any, virtual_batch_size: int | None = None, **kwargs: Any) -> None:
    """Equinox's arguments (``input_size, axis_name, eps=1e-5, channelwise_affine=True,
    momentum=0.99, inference=False, dtype=None, mode``), and ``virtual_batch_size``."""
    super().__init__(*args, **kwargs)
    if virtual_batch_size is not None and self.mode != "batch":
      raise ValueError(
        f"virtual_batch_size={virtual_batch_size!r} needs mode='batch': ghost batches "
        f"normalize each sub-batch with its own statistics, while mode={self.mode!r} "
        f"normalizes with the running averages."
      )
    self.virtual_batch_size = virtual_batch_size

  def __call__(
    self,
    x: jax.Array,
    state: Any,
    *,
    key: Any = None,
    inference: bool | None = None,
    mask: Any = None,
  ) -> tuple[jax.Array, Any]:
    """Normalizes one example and returns ``(output, updated state)``.

    Args:
      x: one example, ``(input_size, ...)``, inside a ``vmap``/``pmap`` over ``axis_name``.
      state: the ``eqx.nn.State`` holding the running statistics.
      key: ignored (Equinox's convention).
      inference: overrides ``self.inference`` when not None.
      mask: optional booleans broadcastable to ``x``: the positions that count.

    Returns:
      ``(output, state)``; the output in the promotion of ``x``'s and the parameters' dtype
      (Equinox's).
    """
    _check_example("BatchNorm", self.input_size, self.axis_name, x)
    inference = self.inference if inference is None else inference
    xb, mask = x[None], _batched_mask(mask)
    common: dict[str, Any] = dict(axis=1, epsilon=self.eps, mask=mask)
    with jax.named_scope("jaxnorm.equinox.BatchNorm"):
      if inference:
        mean, var = _running_statistics(self, state)
        return batch_norm(xb, self.weight, self.bias, mean=mean, var=var, **common)[0], state
      if self.mode == "ema":
        assert self.ema_state_index is not None and self.ema_first_time_index is not None
        running_mean, running_var = state.get(self.ema_state_index)
        first = state.get(self.ema_first_time_index)
        batch = moments(xb, (0, *range(2, xb.ndim)), mask=mask, axis_name=self.axis_name)
        updated = update_running_average(running_mean, running_var, batch, self.momentum)
        mean, var = (lax.select(first, b.astype(u.dtype), u) for b, u in
                     zip((batch.mean, batch.var), updated, strict=True))  # fmt: skip
        state = state.set(self.ema_first_time_index, jnp.array(False))
        state = state.set(self.ema_state_index, (mean, var))
        return batch_norm(xb, self.weight, self.bias, mean=mean, var=var, **common)[0], state
      assert self.batch_state_index is not None and self.batch_counter is not None
      ghost = self.virtual_batch_size
      train = training(None) if ghost is None else mapped_ghost(ghost)
      y, hidden = layer_step(
        train, xb, self.weight, self.bias, *state.get(self.batch_state_index),
        use_running_average=False, momentum=self.momentum, axis_name=self.axis_name, **common,
      )  # fmt: skip
      state = state.set(self.batch_counter, state.get(self.batch_counter) + 1)
      return y[0], state.set(self.batch_state_index, hidden)


class BatchRenorm(eqx.Module):
  """Batch Renormalization (Ioffe 2017) in Equinox's BatchNorm convention: one example per
  call inside a ``vmap`` over ``axis_name``, running statistics in an ``eqx.nn.State``
  (:func:`jaxnorm.batch_renorm_step`). Equinox has no such layer; the constructor is
  ``eqx.nn.BatchNorm``'s without ``mode``, plus the renormalization schedule.

  In training ``y = γ·((x − μ_B)/σ_B·r + d) + β`` with ``r = sg(clip(σ_B/σ, 1/r_max,
  r_max))``, ``d = sg(clip((μ_B − μ)/σ, −d_max, d_max))`` against the running ``μ`` and
  ``σ = sqrt(var + ε)``, which then move toward the batch's (``ra ← m·ra + (1 − m)·batch``,
  starting from mean 0 and variance 1); at inference ``γ·(x − μ)/σ + β``. ``r_max`` and
  ``d_max`` follow :func:`jaxnorm.renorm_limits` at the number of updates so far, kept in
  the state: plain BatchNorm for ``warmup_steps``, then relaxed linearly to ``r_max`` at
  ``r_max_steps`` and to ``d_max`` at ``d_max_steps`` (None: at once).

  Attributes:
    weight (jax.Array | None): the per-channel scale, or None.
    bias (jax.Array | None): the per-channel shift, or None.
    state_index: the ``StateIndex`` of ``(mean, var, steps)``.
    axis_name: the name (or names) of the mapped batch axis.
    inference: use the running statistics (toggled by ``eqx.nn.inference_mode``).
    input_size, eps, channelwise_affine, momentum: as in :class:`BatchNorm`.
    r_max, d_max, warmup_steps, r_max_steps, d_max_steps: the schedule, as in
      :class:`jaxnorm.BatchRenorm` (defaults 3, 5, 5000, 40000, 25000).

  >>> import jax, jax.numpy as jnp, equinox as eqx, jaxnorm.equinox as jeqx
  >>> brn, state = eqx.nn.make_with_state(jeqx.BatchRenorm)(2, "batch", warmup_steps=0)
  >>> x = jnp.array([[1.0, 10.0], [3.0, 30.0]])
  >>> run = jax.vmap(brn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
  >>> y, state = run(x, state)
  >>> int(state.get(brn.state_index)[2])
  1
  """

  weight: jax.Array | None
  bias: jax.Array | None
  state_index: Any
  axis_name: Any
  inference: bool
  input_size: int = eqx.field(static=True)
  eps: float = eqx.field(static=True)
  channelwise_affine: bool = eqx.field(static=True)
  momentum: float = eqx.field(static=True)
  r_max: float = eqx.field(static=True)
  d_max: float = eqx.field(static=True)
  warmup_steps: int = eqx.field(static=True)
  r_max_steps: int | None = eqx.field(static=True)
  d_max_steps: int | None = eqx.field(static=True)

  def __init__(
    self,
    input_size: int,
    axis_name: Any,
    eps: float = 1e-5,
    channelwise_affine: bool = True,
    momentum: float = 0.99,
    inference: bool = False,
    dtype: Any = None,
    *,
    r_max: float = 3.0,
    d_max: float = 5.0,
    warmup_steps: int = 5000,
    r_max_steps: int | None = 40000,
    d_max_steps: int | None = 25000,
  ) -> None:
    """Arguments as :class:`BatchNorm`'s (``dtype``: of the parameters and running
    statistics, default float32, float64 under ``jax_enable_x64``) and the schedule."""
    check_momentum(momentum)
    check_renorm_schedule(r_max, d_max, warmup_steps, r_max_steps, d_max_steps)
    dtype = jnp.zeros(()).dtype if dtype is None else dtype
    self.weight = jnp.ones(input_size, dtype) if channelwise_affine else None
    self.bias = jnp.zeros(input_size, dtype) if channelwise_affine else None
    running = (jnp.zeros(input_size, dtype), jnp.ones(input_size, dtype))
    self.state_index = eqx.nn.StateIndex((*running, jnp.array(0, jnp.int32)))
    self.axis_name, self.inference, self.input_size = axis_name, inference, input_size
    self.eps, self.channelwise_affine, self.momentum = eps, channelwise_affine, momentum
    self.r_max, self.d_max, self.warmup_steps = r_max, d_max, warmup_steps
    self.r_max_steps, self.d_max_steps = r_max_steps, d_max_steps

  def __call__(
    self,
    x: jax.Array,
    state: Any,
    *,
    key: Any = None,
    inference: bool | None = None,
    mask: Any = None,
  ) -> tuple[jax.Array, Any]:
    """Normalizes one example and returns ``(output, updated state)``; arguments as
    :meth:`BatchNorm.__call__`'s."""
    _check_example("BatchRenorm", self.input_size, self.axis_name, x)
    inference = self.inference if inference is None else inference
    mean, var, steps = state.get(self.state_index)
    with jax.named_scope("jaxnorm.equinox.BatchRenorm"):
      y, updated = batch_renorm_step(
        x[None], self.weight, self.bias, mean, var, steps, **renorm_schedule(self),
        use_running_average=inference, momentum=self.momentum, axis=1, epsilon=self.eps,
        mask=_batched_mask(mask), axis_name=None if inference else self.axis_name,
      )  # fmt: skip
    if updated is not None:
      state = state.set(self.state_index, updated)
    return y[0], state


class FrozenBatchNorm(BatchNorm):
  """A :class:`BatchNorm` frozen: it always normalizes with its running statistics
  (:func:`jaxnorm.frozen_batch_norm`: no gradient reaches ``weight``, ``bias`` or the
  statistics) and returns the state unchanged, whatever ``inference`` or ``mask`` say — the
  fine-tuning recipe for detection and segmentation, where batches of 1–2 make batch
  statistics noise. Its fields and state are BatchNorm's, so a BatchNorm checkpoint loads
  into it; :meth:`from_batch_norm` and :func:`freeze_batch_norms` convert trained layers.

  >>> import jax, jax.numpy as jnp, equinox as eqx, jaxnorm.equinox as jeqx
  >>> bn, state = eqx.nn.make_with_state(jeqx.BatchNorm)(2, "batch", mode="batch")
  >>> frozen = jeqx.FrozenBatchNorm.from_batch_norm(bn)
  >>> y, same = frozen(jnp.array([1.0, 2.0]), state)  # no vmap needed: no batch statistics
  >>> y
  Array([1., 2.], dtype=float32)
  """

  @classmethod
  def from_batch_norm(cls, bn: eqx.nn.BatchNorm) -> FrozenBatchNorm:
    """The frozen layer with ``bn``'s fields (a jaxnorm or Equinox BatchNorm); it reads the
    same ``State``."""
    if not isinstance(bn, eqx.nn.BatchNorm):
      raise TypeError(f"from_batch_norm takes an eqx.nn.BatchNorm, got {type(bn).__name__}.")
    frozen = object.__new__(cls)
    for field in dataclasses.fields(cls):
      object.__setattr__(frozen, field.name, getattr(bn, field.name, None))
    return frozen

  def __call__(
    self,
    x: jax.Array,
    state: Any,
    *,
    key: Any = None,
    inference: bool | None = None,
    mask: Any = None,
  ) -> tuple[jax.Array, Any]:
    """Normalizes ``x`` (one example, ``(input_size, ...)``) with the running statistics
    and returns ``(output, state)``; the other arguments are accepted and unused."""
    del key, inference, mask
    _check_example("FrozenBatchNorm", self.input_size, self.axis_name, x)
    mean, var = _running_statistics(self, state)
    with jax.named_scope("jaxnorm.equinox.FrozenBatchNorm"):
      y = frozen_batch_norm(x[None], self.weight, self.bias, mean, var, axis=1, epsilon=self.eps)
    return y[0], state


def freeze_batch_norms(model: Any) -> Any:
  """``model`` with every ``eqx.nn.BatchNorm`` (jaxnorm's or Equinox's) replaced by a
  :class:`FrozenBatchNorm` with its fields; the model's ``State`` is unchanged.

  >>> import equinox as eqx, jaxnorm.equinox as jeqx
  >>> model, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")
  >>> type(jeqx.freeze_batch_norms([model])[0]).__name__
  'FrozenBatchNorm'
  """

  def is_bn(node: Any) -> bool:
    return isinstance(node, eqx.nn.BatchNorm) and not isinstance(node, FrozenBatchNorm)

  return jax.tree_util.tree_map(
    lambda node: FrozenBatchNorm.from_batch_norm(node) if is_bn(node) else node,
    model,
    is_leaf=is_bn,
  )
