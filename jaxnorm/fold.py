"""BatchNorm after training: folded into the layer before it for deployment, or frozen for
fine-tuning (:func:`jaxnorm.freeze_batch_norm`).

A BatchNorm at inference is an affine map per feature, ``y = h·s + (β − μ·s)`` with
``s = γ·rsqrt(var + ε)``; after a ``Dense`` or ``Conv`` (``h = x·W + b``) it folds into
that layer: ``W' = W·s`` per output feature and ``b' = (b − μ)·s + β``. Flax kernels keep
the output features on their last axis (``Dense``: ``(in, out)``; ``Conv``:
``(*window, in/groups, out)``, grouped and depthwise ones too), so the same rule holds for
all of them. The folded model is the same model without those norms and with a bias on the
folded layers; it computes the same outputs to float32 rounding, with one pass less.

Freezing keeps the norms and labels their parameters for an optimizer that leaves them
alone, next to :func:`~jaxnorm.frozen_batch_norm` (which stops their gradients).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from jax import lax

from jaxnorm._dtypes import promote
from jaxnorm._engine import check_epsilon


def fold_batch_norm(
  layer: Mapping[str, Any], norm: Mapping[str, Any], *, epsilon: float | None = None
) -> dict[str, jax.Array]:
  """``{"kernel": W·s, "bias": (b − μ)·s + β}``: a BatchNorm folded into the preceding
  ``Dense``/``Conv``.

  Args:
    layer: the layer's parameters, ``{"kernel": W}`` with or without ``"bias"``.
    norm: the BatchNorm's (or FrozenBatchNorm's) variables: ``{"params": {"scale",
      "bias"}, "batch_stats": {"mean", "var"}}`` (scale and bias optional).
    epsilon: the BatchNorm's ε, required: the variables do not hold it, and a wrong one
      folds silently wrong (MobileNetV3's norms have ε = 1e-3, BatchNorm's default is 1e-5).

  Returns:
    The folded layer's parameters, in the kernel's dtype.

  Raises:
    ValueError: for no ``epsilon``, or statistics that do not match the kernel's output
      features.

  >>> folded = fold_batch_norm(
  ...   {"kernel": jnp.ones((2, 3))},
  ...   {"params": {"scale": jnp.full(3, 2.0)},
  ...    "batch_stats": {"mean": jnp.ones(3), "var": jnp.full(3, 4.0)}}, epsilon=0.0)
  >>> folded["kernel"].tolist(), folded["bias"].tolist()
  ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [-1.0, -1.0, -1.0])
  """
  if epsilon is None:
    raise ValueError(
      "fold_batch_norm needs the BatchNorm's epsilon (its variables do not hold it, and a "
      "default would fold other norms silently wrong): pass epsilon=module.epsilon, or "
      "for a whole model use fold_batch_norms with batch_norm_epsilons(model, x)."
    )
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
  acc = promote(kernel.dtype, jnp.float32)
  gamma, beta = (
    None if k not in params else jnp.asarray(params[k], acc) for k in ("scale", "bias")
  )
  s = lax.rsqrt(var.astype(acc) + eps)
  s = s if gamma is None else gamma * s
  shift = -mean.astype(acc) * s
  shift = shift if beta is None else beta + shift
  bias = shift if "bias" not in layer else jnp.asarray(layer["bias"], acc) * s + shift
  folded = kernel.astype(acc) * s.reshape((1,) * (kernel.ndim - 1) + (out,))
  return {"kernel": folded.astype(kernel.dtype), "bias": bias.astype(kernel.dtype)}


def fold_batch_norms(
  variables: Mapping[str, Any],
  pairs: Mapping[str, str],
  *,
  epsilon: float | Mapping[str, Any] | None = None,
) -> dict:
  """Folds every ``layer → BatchNorm`` pair of a Linen model's variables.

  Args:
    variables: the model's variables (``params`` and ``batch_stats``).
    pairs: ``{layer path: BatchNorm path}``, paths with ``/`` between module names, e.g.
      ``{"Conv_0": "BatchNorm_0", "block1/conv": "block1/bn"}``.
    epsilon: the BatchNorms' ε, required (the variables do not hold it): each norm's own,
      ``{BatchNorm path: ε}``, from :func:`batch_norm_epsilons` (the model's own) or the
      converted layers of :func:`jaxnorm.convert.norms_from_state_dict` (its ``layers``,
      whose ε is used); or one number for all, where every norm has that one.

  Returns:
    The variables of the same model built without those BatchNorms and with a bias on
    each folded layer (``use_bias=True``): the norms' entries removed, the layers'
    ``kernel``/``bias`` replaced; ``batch_stats`` dropped when nothing is left in it.

  Raises:
    ValueError: for no ``epsilon``, a path with no such module, a norm without running
      statistics (it normalizes with each batch's own, so it is no fixed affine map), or a
      norm missing from a per-norm ``epsilon``.

  >>> v = {"params": {"Dense_0": {"kernel": jnp.ones((2, 3))},
  ...                 "BatchNorm_0": {"scale": jnp.ones(3), "bias": jnp.zeros(3)}},
  ...      "batch_stats": {"BatchNorm_0": {"mean": jnp.zeros(3), "var": jnp.ones(3)}}}
  >>> folded = fold_batch_norms(v, {"Dense_0": "BatchNorm_0"}, epsilon={"BatchNorm_0": 1e-5})
  >>> sorted(folded["params"]["Dense_0"])
  ['bias', 'kernel']
  """
  if epsilon is None:
    raise ValueError(
      "fold_batch_norms needs each BatchNorm's epsilon (the variables do not hold it, and "
      "a default would fold other norms silently wrong, e.g. a MobileNetV3's ε = 1e-3): "
      "pass epsilon=batch_norm_epsilons(model, x) for a Linen model, "
      "epsilon=layers (norms_from_state_dict's) for a PyTorch one, or one number that "
      "every norm has."
    )
  flat = {c: traverse_util.flatten_dict(tree) for c, tree in variables.items()}
  for layer_path, norm_path in pairs.items():
    eps = _epsilon_of(epsilon, norm_path)
    norm: dict[str, Any] = {
      c: _pop(flat[c], norm_path) for c in ("params", "batch_stats") if c in flat
    }
    if not norm.get("batch_stats"):
      if norm.get("params"):
        raise ValueError(
          f"the norm at {norm_path!r} has no running statistics (e.g. PyTorch's "
          f"track_running_stats=False): it normalizes with each batch's own statistics, "
          f"so it is not a fixed affine map and cannot be folded; keep it in the model."
        )
      raise ValueError(f"no BatchNorm statistics at {norm_path!r} in the variables.")
    prefix = tuple(layer_path.split("/"))
    layer = {k[-1]: v for k, v in flat["params"].items() if k[:-1] == prefix}
    if not layer:
      raise ValueError(f"no module {layer_path!r} with parameters in the variables.")
    for name, value in fold_batch_norm(layer, norm, epsilon=eps).items():
      flat["params"][(*prefix, name)] = value
  return {c: traverse_util.unflatten_dict(tree) for c, tree in flat.items() if tree}


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


def _pop(flat, path):
  """The entries directly under the module at ``path`` (``/``-separated), removed from the
  flattened collection ``flat``, by leaf name."""
  prefix = tuple(path.split("/"))
  keys = [k for k in flat if k[:-1] == prefix]
  return {k[-1]: flat.pop(k) for k in keys}


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
