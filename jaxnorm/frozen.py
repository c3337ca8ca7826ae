"""Frozen BatchNorm: fixed statistics and affine parameters, never updated, never trained.

The fine-tuning recipe of detection and segmentation (a pretrained backbone trained on at
batch 1–2, where batch statistics are noise): ``y = x·s + (β − μ·s)`` with
``s = γ·rsqrt(var + ε)`` formed at the feature shape, as torchvision's
``FrozenBatchNorm2d``. The variables are a BatchNorm's (``params``: ``scale``, ``bias``;
``batch_stats``: ``mean``, ``var``), so a trained BatchNorm's load unchanged; no gradient
reaches them, and :func:`~jaxnorm.freeze_batch_norm` labels them for an optimizer that must not
touch them at all (weight decay included).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._axes import Axes, canonicalize_axes
from jaxnorm._kernel import check_epsilon
from jaxnorm.functional import _params, batch_norm_axes, compute_dtype, given_stats, output_dtype


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
  """``y = x·s + (β − μ·s)``, ``s = γ·rsqrt(var + ε)``: BatchNorm at inference with every
  statistic and parameter held constant (``stop_gradient``; the gradient w.r.t. ``x`` is
  ``s·dy``).

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
  feat = canonicalize_axes(axis, x.ndim, name="axis")
  red = batch_norm_axes(x.ndim, feat, reduction_axes)
  eps = check_epsilon(epsilon)
  cdt = compute_dtype(x, scale, bias, mean, dtype=dtype, force_float32=force_float32_reductions)
  mean, var = given_stats(x.shape, red, mean, var, cdt)
  gamma, beta = _params(scale, bias, x.shape, feat, cdt)
  s, shift = map(lax.stop_gradient, scale_and_shift(gamma, beta, mean, var, eps))
  y = x.astype(cdt) * s + shift
  complex_mean = mean if jnp.iscomplexobj(mean) else None
  return y.astype(output_dtype(x, scale, bias, complex_mean, dtype=dtype))


def scale_and_shift(
  scale: jax.Array | None, bias: jax.Array | None, mean: jax.Array, var: jax.Array, eps: float
) -> tuple[jax.Array, jax.Array]:
  """An inference BatchNorm as the affine map ``x·s + shift``: ``s = γ·rsqrt(var + ε)``,
  ``shift = β − μ·s`` (``γ``, ``β`` None: 1 and 0); shared by :func:`frozen_batch_norm`
  and the folding of :mod:`jaxnorm.fold`."""
  s = lax.rsqrt(var + eps) if scale is None else scale * lax.rsqrt(var + eps)
  return s, (-mean * s if bias is None else bias - mean * s)


def freeze_batch_norm(variables: Any, frozen: str = "frozen", trainable: str = "trainable") -> Any:
  """Labels of a model's ``params`` for an optimizer that leaves every BatchNorm alone.

  A BatchNorm (of any kind: flax's, jaxnorm's BatchNorm, BatchRenorm, FrozenBatchNorm) is
  found by its running statistics: wherever ``variables["batch_stats"]`` holds ``mean`` and
  ``var``, the ``scale`` and ``bias`` at the same path in ``variables["params"]`` are
  labelled ``frozen``, every other parameter ``trainable``. Use the labels with
  ``optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels)``: the
  frozen parameters then get exactly zero updates, weight decay included. This is also the
  way to freeze a model that keeps plain BatchNorm layers called with
  ``use_running_average=True``; ``optax.masked(tx, mask)`` alone would not do (it passes the
  gradients of masked-out leaves through unchanged).

  Args:
    variables: a Linen variables dict with ``params`` and ``batch_stats``.
    frozen: the label of BatchNorm parameters.
    trainable: the label of the others.

  Returns:
    A pytree of labels with the structure of ``variables["params"]``.

  >>> labels = freeze_batch_norm({
  ...   "params": {"conv": {"kernel": 0}, "bn": {"scale": 0, "bias": 0}},
  ...   "batch_stats": {"bn": {"mean": 0, "var": 0}}})
  >>> labels
  {'bn': {'bias': 'frozen', 'scale': 'frozen'}, 'conv': {'kernel': 'trainable'}}
  """
  if "params" not in variables:
    raise ValueError(
      f"freeze_batch_norm takes a model's variables dict with 'params' and 'batch_stats' "
      f"(what model.init returns), got one with keys {sorted(variables)}; for a flax.nnx "
      f"model use jaxnorm.nnx.freeze_batch_norm(model)."
    )
  return batch_norm_labels(
    variables.get("batch_stats", {}), variables["params"], frozen=frozen, trainable=trainable
  )


def batch_norm_labels(
  stats: Any, params: Any, *, frozen: str, trainable: str, is_leaf: Any = None
) -> Any:
  """Labels of ``params``: ``frozen`` for the ``scale``/``bias`` beside a ``mean`` in
  ``stats`` (the same path), ``trainable`` for the rest (``is_leaf`` as in ``jax.tree``)."""
  norms = set()
  for path, _ in jax.tree_util.tree_flatten_with_path(stats, is_leaf=is_leaf)[0]:
    keys = tuple(_key(k) for k in path)
    if keys and keys[-1] == "mean":
      norms.add(keys[:-1])

  def label(path, _):
    keys = tuple(_key(k) for k in path)
    return frozen if keys[:-1] in norms and keys[-1] in ("scale", "bias") else trainable

  return jax.tree_util.tree_map_with_path(label, params, is_leaf=is_leaf)


def _key(entry):
  """The name in one step of a pytree path (a dict key, an attribute, an index)."""
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return str(entry)
