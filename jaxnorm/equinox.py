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
only when every example counts equally), and clear errors.

Equinox is an optional dependency: ``pip install "jaxnorm[equinox]"``; only this module
imports it.
"""

from __future__ import annotations

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

from jaxnorm._batch import batch_norm
from jaxnorm._norms import group_norm, layer_norm, rms_norm
from jaxnorm._stats import moments

__all__ = ["BatchNorm", "GroupNorm", "LayerNorm", "RMSNorm"]

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


class BatchNorm(eqx.nn.BatchNorm):
  """Batch normalization across a ``vmap``-ped (or ``pmap``-ped) batch: a drop-in for
  ``eqx.nn.BatchNorm`` over :func:`jaxnorm.batch_norm` (Ioffe & Szegedy 2015).

  Called on one example ``x`` of shape ``(input_size, ...)`` inside a ``jax.vmap`` with
  ``axis_name``: the statistics per channel cover the example's other axes and every example
  of the mapped axis (each weighted by its valid count). Equinox's two modes:

  - ``"batch"``: training normalizes with the batch statistics and keeps debiased
    exponential averages (``hidden ← m·hidden + (1 − m)·batch``, divided by ``1 − m^t`` at
    inference); the choice for new code.
  - ``"ema"`` (the default, with Equinox's warning): training normalizes with the running
    averages themselves, updated first (the first batch fills them).

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

  >>> import jax, jax.numpy as jnp, equinox as eqx, jaxnorm.equinox as jeqx
  >>> bn, state = eqx.nn.make_with_state(jeqx.BatchNorm)(2, "batch", mode="batch")
  >>> x = jnp.array([[1.0, 10.0], [3.0, 30.0]])
  >>> y, state = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
  >>> y.round(3)
  Array([[-1., -1.],
         [ 1.,  1.]], dtype=float32)
  """

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
    if x.ndim < 1 or x.shape[0] != self.input_size:
      raise ValueError(
        f"BatchNorm(input_size={self.input_size}) takes one example of shape "
        f"({self.input_size}, ...), got {x.shape}: call it inside "
        f"jax.vmap(bn, axis_name={self.axis_name!r}, in_axes=(0, None), out_axes=(0, None))."
      )
    inference = self.inference if inference is None else inference
    xb, mask = x[None], _batched_mask(mask)
    common: dict[str, Any] = dict(axis=1, epsilon=self.eps, mask=mask)
    with jax.named_scope("jaxnorm.equinox.BatchNorm"):
      if self.mode == "ema":
        assert self.ema_state_index is not None and self.ema_first_time_index is not None
        mean, var = state.get(self.ema_state_index)
        if not inference:
          first = state.get(self.ema_first_time_index)
          state = state.set(self.ema_first_time_index, jnp.array(False))
          batch = moments(xb, (0, *range(2, xb.ndim)), mask=mask, axis_name=self.axis_name)
          m = self.momentum
          mean = lax.select(first, batch.mean, (1 - m) * batch.mean + m * mean).astype(mean.dtype)
          var = lax.select(first, batch.var, (1 - m) * batch.var + m * var).astype(var.dtype)
          state = state.set(self.ema_state_index, (mean, var))
        y = batch_norm(xb, self.weight, self.bias, mean=mean, var=var, **common)
        return y[0], state
      assert self.batch_state_index is not None and self.batch_counter is not None
      counter = state.get(self.batch_counter)
      hidden_mean, hidden_var = state.get(self.batch_state_index)
      if inference:
        debias = jnp.where(counter == 0, 1, 1 - self.momentum**counter)
        y = batch_norm(
          xb, self.weight, self.bias, mean=hidden_mean / debias, var=hidden_var / debias, **common
        )
        return y[0], state
      y, batch = batch_norm(xb, self.weight, self.bias, axis_name=self.axis_name, **common)
      m = self.momentum
      state = state.set(self.batch_counter, counter + 1)
      state = state.set(
        self.batch_state_index,
        (
          (m * hidden_mean + (1 - m) * batch.mean).astype(hidden_mean.dtype),
          (m * hidden_var + (1 - m) * batch.var).astype(hidden_var.dtype),
        ),
      )
      return y[0], state
