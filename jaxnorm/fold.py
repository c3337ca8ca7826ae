"""Folding an inference-mode BatchNorm into the layer before it, for deployment.

A BatchNorm at inference is an affine map per feature, ``y = h·s + (β − μ·s)`` with
``s = γ·rsqrt(var + ε)``; after a ``Dense`` or ``Conv`` (``h = x·W + b``) it folds into
that layer: ``W' = W·s`` per output feature and ``b' = (b − μ)·s + β``. Flax kernels keep
the output features on their last axis (``Dense``: ``(in, out)``; ``Conv``:
``(*window, in/groups, out)``, grouped and depthwise ones too), so the same rule holds for
all of them. The folded model is the same model without those norms and with a bias on the
folded layers; it computes the same outputs to float32 rounding, with one pass less.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm._kernel import check_epsilon
from jaxnorm.frozen import scale_and_shift


def fold_batch_norm(
  layer: Mapping[str, Any], norm: Mapping[str, Any], *, epsilon: float = 1e-5
) -> dict[str, jax.Array]:
  """``{"kernel": W·s, "bias": (b − μ)·s + β}``: a BatchNorm folded into the preceding
  ``Dense``/``Conv``.

  Args:
    layer: the layer's parameters, ``{"kernel": W}`` with or without ``"bias"``.
    norm: the BatchNorm's (or FrozenBatchNorm's) variables: ``{"params": {"scale",
      "bias"}, "batch_stats": {"mean", "var"}}`` (scale and bias optional).
    epsilon: the BatchNorm's ε (default 1e-5, BatchNorm's).

  Returns:
    The folded layer's parameters, in the kernel's dtype.

  Raises:
    ValueError: for statistics that do not match the kernel's output features.

  >>> folded = fold_batch_norm(
  ...   {"kernel": jnp.ones((2, 3))},
  ...   {"params": {"scale": jnp.full(3, 2.0)},
  ...    "batch_stats": {"mean": jnp.ones(3), "var": jnp.full(3, 4.0)}}, epsilon=0.0)
  >>> folded["kernel"].tolist(), folded["bias"].tolist()
  ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [-1.0, -1.0, -1.0])
  """
  eps = check_epsilon(epsilon)
  kernel = jnp.asarray(layer["kernel"])
  stats, params = norm["batch_stats"], norm.get("params", {})
  mean, var = jnp.asarray(stats["mean"]), jnp.asarray(stats["var"])
  out = kernel.shape[-1]
  if mean.shape != (out,) or var.shape != (out,):
    raise ValueError(
      f"the BatchNorm's statistics have shape {mean.shape}, but the kernel of shape "
      f"{kernel.shape} has {out} output features; fold a BatchNorm over the layer's output "
      f"features (statistics of shape ({out},)) that directly follows it."
    )
  acc = jnp.promote_types(kernel.dtype, jnp.float32)
  gamma, beta = (
    None if k not in params else jnp.asarray(params[k], acc) for k in ("scale", "bias")
  )
  s, shift = scale_and_shift(gamma, beta, mean.astype(acc), var.astype(acc), eps)
  bias = shift if "bias" not in layer else jnp.asarray(layer["bias"], acc) * s + shift
  folded = kernel.astype(acc) * s.reshape((1,) * (kernel.ndim - 1) + (out,))
  return {"kernel": folded.astype(kernel.dtype), "bias": bias.astype(kernel.dtype)}


def fold_batch_norms(
  variables: Mapping[str, Any],
  pairs: Mapping[str, str],
  *,
  epsilon: float | Mapping[str, Any] = 1e-5,
) -> dict:
  """Folds every ``layer → BatchNorm`` pair of a Linen model's variables.

  Args:
    variables: the model's variables (``params`` and ``batch_stats``).
    pairs: ``{layer path: BatchNorm path}``, paths with ``/`` between module names, e.g.
      ``{"Conv_0": "BatchNorm_0", "block1/conv": "block1/bn"}``.
    epsilon: the BatchNorms' ε: one number for all (default 1e-5, BatchNorm's), or each
      norm's own, ``{BatchNorm path: ε}``, e.g. from :func:`batch_norm_epsilons` (the
      model's own) or the converted layers of :func:`jaxnorm.convert.norms_from_state_dict`
      (its ``layers``, whose ε is used).

  Returns:
    The variables of the same model built without those BatchNorms and with a bias on
    each folded layer (``use_bias=True``): the norms' entries removed, the layers'
    ``kernel``/``bias`` replaced; ``batch_stats`` dropped when nothing is left in it.

  Raises:
    ValueError: for a path with no such module, a norm without running statistics (it
      normalizes with each batch's own, so it is no fixed affine map), or a norm missing
      from a per-norm ``epsilon``.

  >>> v = {"params": {"Dense_0": {"kernel": jnp.ones((2, 3))},
  ...                 "BatchNorm_0": {"scale": jnp.ones(3), "bias": jnp.zeros(3)}},
  ...      "batch_stats": {"BatchNorm_0": {"mean": jnp.zeros(3), "var": jnp.ones(3)}}}
  >>> sorted(fold_batch_norms(v, {"Dense_0": "BatchNorm_0"})["params"]["Dense_0"])
  ['bias', 'kernel']
  """
  out = _copy(variables)  # new containers, the same arrays
  for layer_path, norm_path in pairs.items():
    eps = _epsilon_of(epsilon, norm_path)
    norm = {c: _pop(out[c], norm_path) for c in ("params", "batch_stats") if c in out}
    if norm.get("batch_stats") is None:
      if norm.get("params") is not None:
        raise ValueError(
          f"the norm at {norm_path!r} has no running statistics (e.g. PyTorch's "
          f"track_running_stats=False): it normalizes with each batch's own statistics, "
          f"so it is not a fixed affine map and cannot be folded; keep it in the model."
        )
      raise ValueError(f"no BatchNorm statistics at {norm_path!r} in the variables.")
    norm = {c: v for c, v in norm.items() if v is not None}
    layer = _get(out["params"], layer_path)
    layer.update(fold_batch_norm(layer, norm, epsilon=eps))
  out = {c: _prune(tree) for c, tree in out.items()}
  return {c: tree for c, tree in out.items() if tree != {}}


def batch_norm_epsilons(model: nn.Module, *args: Any, **kwargs: Any) -> dict[str, float]:
  """Each BatchNorm's (and FrozenBatchNorm's) ε in a Linen model, by path (``/`` between
  module names), for :func:`fold_batch_norms`: the model is traced on ``args`` and
  ``kwargs`` (its call's arguments; shapes only, nothing is computed).

  >>> import jaxnorm
  >>> class Net(nn.Module):
  ...   @nn.compact
  ...   def __call__(self, x):
  ...     x = nn.Dense(3)(x)
  ...     return jaxnorm.BatchNorm(use_running_average=True, epsilon=1e-3)(x)
  >>> batch_norm_epsilons(Net(), jnp.ones((2, 4)))
  {'BatchNorm_0': 0.001}
  """
  found: dict[str, float] = {}

  def record(next_fun, call_args, call_kwargs, context):
    module = context.module
    if isinstance(module, nn.BatchNorm) and context.method_name == "__call__":
      found["/".join(module.path)] = module.epsilon
    return next_fun(*call_args, **call_kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(lambda *a: model.init(jax.random.key(0), *a, **kwargs), *args)
  return found


def _epsilon_of(epsilon, norm_path):
  """The ε of the norm at ``norm_path``: the one number, or its entry of the mapping."""
  if not isinstance(epsilon, Mapping):
    return epsilon
  if norm_path not in epsilon:
    raise ValueError(
      f"epsilon gives no value for the norm at {norm_path!r} (it has {sorted(epsilon)}); "
      f"give each folded norm its own ε."
    )
  value = epsilon[norm_path]
  kwargs = getattr(value, "kwargs", None)  # a converted layer (jaxnorm.convert.TorchNorm)
  return value if kwargs is None else kwargs["epsilon"]


def _copy(tree):
  return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def _prune(tree):
  """``tree`` without the dicts that the removals left empty."""
  if not isinstance(tree, Mapping):
    return tree
  pruned = {k: _prune(v) for k, v in tree.items()}
  return {k: v for k, v in pruned.items() if not (isinstance(v, dict) and not v)}


def _get(tree, path):
  for name in path.split("/"):
    if name not in tree:
      raise ValueError(f"no module {path!r} in the variables (missing {name!r}).")
    tree = tree[name]
  return tree


def _pop(tree, path):
  *parents, last = path.split("/")
  for name in parents:
    tree = tree.get(name, {})
  value = tree.pop(last, None) if isinstance(tree, dict) else None
  return value
