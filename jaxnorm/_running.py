"""Running statistics: the exponential (or cumulative) averages a BatchNorm keeps, their
momentum's check, PyTorch's unbiased convention and a zero-debiased average."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._dtypes import count_dtype, promote
from jaxnorm._engine import Moments, concrete_value, with_sharding_of


def check_momentum(momentum: Any) -> None:
  """Raises a ``ValueError`` if a concrete ``momentum`` is not in [0, 1] (NaN included);
  traced values (e.g. a schedule under ``jit``) pass unchecked."""
  value = concrete_value(momentum)
  if value is None:
    return
  if not (np.issubdtype(value.dtype, np.number) or value.dtype == bool) or np.iscomplexobj(value):
    raise TypeError(f"momentum must be a real number in [0, 1], got {momentum!r}.")
  if not np.all((value >= 0) & (value <= 1)):
    raise ValueError(
      f"momentum must lie in [0, 1] (the weight kept by the running average), got "
      f"{momentum!r}; PyTorch's momentum m corresponds to 1 - m here (its 0.1 is 0.9)."
    )


def unbiased_variance(stats: Moments) -> Moments:
  """``stats`` with the unbiased variance ``n/(n − 1)·var`` (``n``: the valid count;
  ``n ≤ 1`` keeps ``var``), PyTorch's running-variance convention, applied here only."""
  n = stats.count.astype(stats.var.dtype)
  return stats._replace(var=stats.var * (n / jnp.maximum(n - 1, 1)))


def debiased_average(hidden: Any, counter: Any, momentum: float, initial: float = 0.0) -> Any:
  """The average of the batches alone in a zero-debiased exponential average (Adam's
  correction): after ``t = counter`` updates ``hidden = m^t·initial + (1 − m)·Σ m^(t−i)·bᵢ``,
  and the result is ``(hidden − m^t·initial)/(1 − m^t)``, whose weights on the ``bᵢ`` sum to
  1; ``hidden`` itself before the first update (or when ``m = 1``, which never moves it).

  Equinox's ``mode="batch"`` starts its hidden variance at 1 and divides by ``1 − m^t``
  without subtracting the start, which adds ``m^t/(1 − m^t)`` to the variance (0.58 after
  100 steps at m = 0.99); ``initial=1`` removes it.

  >>> float(debiased_average(jnp.array(0.5 * 1.0 + 0.5 * 4.0), 1, 0.5, initial=1.0))
  4.0
  """
  power = jnp.asarray(momentum, jnp.result_type(hidden)) ** counter
  unmoved = (counter == 0) | (power == 1)
  return jnp.where(unmoved, hidden, (hidden - power * initial) / jnp.where(unmoved, 1, 1 - power))


def update_running_average(
  running_mean: jax.Array,
  running_var: jax.Array,
  batch: Moments,
  momentum: float | None,
  *,
  unbiased: bool = False,
  num_batches_tracked: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """Exponential moving average of the statistics, Flax's convention.

  ``ra = momentum * ra + (1 - momentum) * batch`` for the mean and the (biased) variance.
  A statistic keeps its running value when its batch count is 0 (every element masked, or
  an empty batch) or when its batch mean or variance is not finite (a NaN or inf in the
  batch): one bad batch does not poison the running averages for good, while the output of
  that step still shows the NaN. PyTorch's ``momentum=0.1`` corresponds to
  ``momentum=0.9`` here.

  PyTorch's training convention, as options: ``unbiased=True`` stores the unbiased batch
  variance ``n/(n − 1)·var`` (``n``: the batch's valid count, across devices and masks;
  ``n = 1`` gives ``var``), and ``momentum=None`` with ``num_batches_tracked`` (the number
  of updates before this one) is PyTorch's ``momentum=None``, the cumulative average
  ``ra + (batch − ra)/(num_batches_tracked + 1)``.

  Args:
    running_mean: the running mean, of the statistics' shape (complex for complex data).
    running_var: the running variance, of the statistics' shape.
    batch: the batch :class:`Moments` (without kept dims), e.g. from :func:`moments`.
    momentum: the decay rate in [0, 1] (a traced value is accepted, not range-checked), or
      None for the cumulative average.
    unbiased: store the unbiased variance (PyTorch) instead of the biased one (Flax).
    num_batches_tracked: updates so far; required with ``momentum=None``.

  Returns:
    ``(new_mean, new_var)`` in the running statistics' dtypes (a real running mean
    becomes complex when the batch mean is complex, as in Flax).

  Raises:
    ValueError: for a concrete momentum outside [0, 1], ``momentum=None`` without
      ``num_batches_tracked``, or statistics of another shape.

  >>> m = Moments(jnp.array([2.0, 5.0]), jnp.array([4.0, 1.0]), jnp.array([8.0, 0.0]))
  >>> mean, var = update_running_average(jnp.zeros(2), jnp.ones(2), m, 0.9)
  >>> print(mean, var)
  [0.2 0. ] [1.3 1. ]
  """
  if momentum is None:
    if num_batches_tracked is None:
      raise ValueError(
        "momentum=None (PyTorch's cumulative average) needs num_batches_tracked, the number "
        "of updates so far (a BatchNorm keeps it in its statistics); or give a momentum."
      )
    # In the statistics' dtype (float64 ones: a float32 factor would be 4e-8 off).
    n = jnp.asarray(num_batches_tracked).astype(count_dtype(jnp.asarray(running_var).dtype))
    decay: Any = 1.0 - 1.0 / (n + 1.0)
  else:
    decay = momentum
  check_momentum(decay)
  for name, ra, b in (("mean", running_mean, batch.mean), ("var", running_var, batch.var)):
    if jnp.shape(ra) != jnp.shape(b):
      raise ValueError(
        f"running {name} has shape {jnp.shape(ra)} but the batch statistics have shape "
        f"{jnp.shape(b)}; the running statistics must be those of the same layer and axes."
      )
  # (1 − decay in Python when decay is a number, as Flax's: 0.1, not float32's 0.100000024)
  return _compiled_update(running_mean, running_var, batch, decay, 1.0 - decay, unbiased)


def _update(running_mean, running_var, batch, decay, complement, unbiased):
  if unbiased:
    batch = unbiased_variance(batch)
  use = (batch.count > 0) & jnp.isfinite(batch.mean) & jnp.isfinite(batch.var)

  def ema(ra, b):
    ra = jnp.asarray(ra)
    dtype = ra.dtype
    if jnp.iscomplexobj(b) and not jnp.iscomplexobj(ra):
      dtype = promote(dtype, b.dtype)
    new = decay * ra + complement * b
    return jnp.where(with_sharding_of(use, new), new, with_sharding_of(ra, new)).astype(dtype)

  return ema(running_mean, batch.mean), ema(running_var, batch.var)


# One compiled program per shape: eagerly, its dozen operations dispatched one by one made
# an NNX BatchNorm training call 1.27x Flax's (``benchmarks/RESULTS.md``, item 33).
_compiled_update = jax.jit(_update, static_argnums=(5,))
