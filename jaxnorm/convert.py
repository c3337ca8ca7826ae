"""From PyTorch: a norm layer's ``state_dict`` as jaxnorm variables and constructor arguments.

No import of ``torch``: the arrays can be anything NumPy reads (``tensor.numpy()``, or the
values of a ``state_dict`` loaded elsewhere). What a converter must get right and the
widely used ones do not:

- **names**: ``weight → scale``, ``bias → bias``, ``running_mean/var → batch_stats
  mean/var``; ``num_batches_tracked`` is kept only where it matters (``momentum=None``);
- **momentum**: PyTorch's ``m`` weighs the new batch, Flax's the old average: ``1 − m``;
  PyTorch's ``momentum=None`` (a cumulative average) stays ``None``;
- **variance**: PyTorch's training stores the unbiased ``n/(n − 1)·var``:
  ``unbiased_running_var=True``, so a ported model trains step for step like the original;
- **ε**: 1e-5 for every PyTorch norm (Flax's LayerNorm/GroupNorm/RMSNorm default to
  1e-6), and ``RMSNorm(eps=None)`` means the input dtype's machine epsilon
  (1.19e-7 in float32, 7.8e-3 in bfloat16);
- **InstanceNorm with running statistics** (``track_running_stats=True``, which PyTorch
  uses at evaluation) is a ``BatchNorm`` with ``virtual_batch_size=1``;
- **layout**: PyTorch is channels-first; ``channels_first=True`` (default) puts the
  feature axis at 1 (``axis=1``, ``feature_axis=1``, ``feature_axes=1``), for inputs kept
  as NCHW; with ``channels_first=False`` (inputs transposed to NHWC) it is -1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

__all__ = ["TorchNorm", "from_torch", "norms_from_state_dict", "torch_epsilon"]

KINDS = (
  "BatchNorm1d",
  "BatchNorm2d",
  "BatchNorm3d",
  "LayerNorm",
  "GroupNorm",
  "InstanceNorm1d",
  "InstanceNorm2d",
  "InstanceNorm3d",
  "RMSNorm",
)
TORCH_EPS = 1e-5  # every PyTorch norm's default


class TorchNorm(NamedTuple):
  """A converted PyTorch norm layer.

  Attributes:
    module: the jaxnorm class name (``"BatchNorm"``, ``"LayerNorm"``, ...).
    kwargs: the Linen constructor arguments (``jaxnorm.<module>(**kwargs)``).
    nnx_kwargs: the NNX constructor arguments but ``rngs``
      (``jaxnorm.nnx.<module>(**nnx_kwargs, rngs=...)``).
    variables: the Linen variables, ``{"params": ..., "batch_stats": ...}`` (only the
      collections the layer has).
  """

  module: str
  kwargs: dict
  nnx_kwargs: dict
  variables: dict

  def linen(self) -> Any:
    """The Linen module (apply it with :attr:`variables`)."""
    import jaxnorm.linen

    return getattr(jaxnorm.linen, self.module)(**self.kwargs)

  def nnx(self, rngs: Any) -> Any:
    """The NNX module with the converted values loaded."""
    from jaxnorm import nnx as jnnx

    module = getattr(jnnx, self.module)(**self.nnx_kwargs, rngs=rngs)
    for collection in self.variables.values():
      for name, value in collection.items():
        getattr(module, name)[...] = jnp.reshape(value, getattr(module, name)[...].shape)
    return module


def torch_epsilon(eps: float | None, dtype: Any = jnp.float32) -> float:
  """PyTorch's ε: ``eps`` if given, else (``RMSNorm(eps=None)``) the machine epsilon of
  the input's ``dtype`` (1.19e-7 for float32, 7.8e-3 for bfloat16, 9.8e-4 for float16).

  >>> torch_epsilon(None, jnp.bfloat16)
  0.0078125
  """
  return float(jnp.finfo(dtype).eps) if eps is None else float(eps)


def _array(state_dict, key, dtype=None):
  if key not in state_dict or state_dict[key] is None:
    return None
  a = np.asarray(state_dict[key])
  return a if dtype is None else a.astype(dtype)


def from_torch(
  kind: str,
  state_dict: Mapping[str, Any],
  *,
  eps: float | None = TORCH_EPS,
  momentum: float | None = 0.1,
  num_groups: int | None = None,
  normalized_shape: Any = None,
  channels_first: bool = True,
  dtype: Any = None,
  torch_training: bool = True,
  num_features: int | None = None,
) -> TorchNorm:
  """Converts one PyTorch norm layer: its ``state_dict`` (``weight``, ``bias``,
  ``running_mean``, ``running_var``, ``num_batches_tracked``; missing ones are disabled
  features) and the constructor arguments ``state_dict`` does not hold.

  Args:
    kind: the PyTorch class name: one of ``convert.KINDS``.
    state_dict: the layer's arrays (PyTorch tensors' ``.numpy()`` or any array-like).
    eps: the layer's ``eps`` (PyTorch's default 1e-5; ``None`` for ``RMSNorm(eps=None)``,
      resolved for ``dtype``).
    momentum: the BatchNorm's PyTorch momentum (default 0.1; ``None``: cumulative).
    num_groups: GroupNorm's number of groups (required for ``GroupNorm``).
    normalized_shape: LayerNorm/RMSNorm's shape when they have no ``weight``.
    channels_first: inputs stay channels-first (PyTorch's layout) in JAX.
    dtype: the activations' dtype (for ``RMSNorm(eps=None)`` and the module's ``dtype``);
      default: the parameters' dtype, else float32.
    torch_training: BatchNorm trains with PyTorch's convention (unbiased running
      variance; ``momentum=None`` as PyTorch's cumulative average). False gives Flax's.
    num_features: the number of channels, for an ``InstanceNorm`` without parameters (its
      default, ``affine=False``), which the NNX module needs.

  Returns:
    A :class:`TorchNorm`.

  >>> import numpy as np
  >>> bn = from_torch("BatchNorm2d", {"weight": np.ones(3), "bias": np.zeros(3),
  ...   "running_mean": np.zeros(3), "running_var": np.ones(3), "num_batches_tracked": 7})
  >>> bn.module, bn.kwargs["axis"], bn.kwargs["momentum"], sorted(bn.variables)
  ('BatchNorm', 1, 0.9, ['batch_stats', 'params'])
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS} (PyTorch's class name), got {kind!r}.")
  weight, bias = _array(state_dict, "weight"), _array(state_dict, "bias")
  param_dtype = jnp.dtype(jnp.float32 if weight is None else weight.dtype)
  if weight is not None and weight.dtype == np.float64:
    param_dtype = jnp.dtype(jnp.float32)  # NumPy's default; jax keeps float32 without x64
  act = jnp.dtype(param_dtype if dtype is None else dtype)
  channel = 1 if channels_first else -1
  params = {k: v for k, v in (("scale", weight), ("bias", bias)) if v is not None}
  common = dict(use_scale=weight is not None, use_bias=bias is not None, param_dtype=param_dtype)
  if act != jnp.float32:
    common["dtype"] = act
  if kind.startswith("BatchNorm"):
    return _batch_norm(state_dict, params, common, eps, momentum, channel, torch_training)
  if kind.startswith("InstanceNorm"):
    if _array(state_dict, "running_mean") is not None:
      # Running averages of instance statistics, used at evaluation: a BatchNorm whose
      # sub-batches are single examples (instance statistics in training).
      bn = _batch_norm(state_dict, params, common, eps, momentum, channel, torch_training)
      bn.kwargs["virtual_batch_size"] = bn.nnx_kwargs["virtual_batch_size"] = 1
      return bn
    c = _features(weight, bias, None, num_features, kind)
    kw = dict(epsilon=torch_epsilon(eps), feature_axes=channel, **common)
    return TorchNorm("InstanceNorm", kw, dict(num_features=c, **kw), _vars(params))
  if kind == "GroupNorm":
    if num_groups is None:
      raise ValueError("GroupNorm needs num_groups (PyTorch's first constructor argument).")
    c = _features(weight, bias, None, num_features, kind)
    kw = dict(num_groups=int(num_groups), epsilon=torch_epsilon(eps), feature_axis=channel)
    kw.update(common)
    nnx_kw = dict(num_features=c, **kw)
    return TorchNorm("GroupNorm", kw, nnx_kw, _vars(params))
  shape = tuple(np.atleast_1d(normalized_shape)) if weight is None else weight.shape
  if not shape:
    raise ValueError(f"{kind} without a weight needs normalized_shape.")
  axes = tuple(range(-len(shape), 0))
  kw = dict(reduction_axes=axes, feature_axes=axes, epsilon=torch_epsilon(eps, act), **common)
  nnx_kw = dict(num_features=math.prod(shape), **kw)
  return TorchNorm("RMSNorm" if kind == "RMSNorm" else "LayerNorm", kw, nnx_kw, _vars(params))


def _features(weight, bias, running, num_features, kind):
  for a in (weight, bias, running):
    if a is not None:
      return int(a.shape[0])
  if num_features is None:
    raise ValueError(
      f"{kind} without weight, bias or running statistics: pass num_features= (the number "
      f"of channels), which the NNX module needs."
    )
  return int(num_features)


def _vars(params, stats=None):
  out = {}
  if params:
    out["params"] = params
  if stats:
    out["batch_stats"] = stats
  return out


def _batch_norm(state_dict, params, common, eps, momentum, channel, torch_training):
  mean, var = _array(state_dict, "running_mean"), _array(state_dict, "running_var")
  c = _features(params.get("scale"), params.get("bias"), mean, None, "BatchNorm")
  if momentum is not None and not 0 <= momentum <= 1:
    raise ValueError(f"momentum must be PyTorch's, in [0, 1] (e.g. 0.1), got {momentum!r}.")
  kw = dict(
    axis=channel,
    momentum=None if momentum is None else 1.0 - float(momentum),
    epsilon=torch_epsilon(eps),
    **common,
  )
  if mean is None:  # track_running_stats=False: batch statistics also at evaluation
    kw["use_running_average"] = False
    mean, var = np.zeros(c, np.float32), np.ones(c, np.float32)
  if torch_training:
    kw["unbiased_running_var"] = True
  elif momentum is None:
    raise ValueError("momentum=None is PyTorch's cumulative average: keep torch_training=True.")
  stats = {"mean": mean.astype(np.float32), "var": var.astype(np.float32)}
  if momentum is None:
    tracked = _array(state_dict, "num_batches_tracked")
    stats["num_batches_tracked"] = np.asarray(0 if tracked is None else tracked, np.int32)
  nnx_kw = dict(num_features=c, **kw)
  return TorchNorm("BatchNorm", kw, nnx_kw, _vars(params, stats))


def norms_from_state_dict(
  state_dict: Mapping[str, Any],
  rules: Mapping[str, tuple[str, str | Callable]],
  **options: Any,
) -> tuple[dict, dict[str, TorchNorm], list[str]]:
  """Converts every norm of a whole model's ``state_dict`` by name pattern.

  ``rules`` maps a regular expression matching a PyTorch module's name (a key without its
  last ``.weight``/``.bias``/...) to ``(kind, flax_path)``: the PyTorch class and the
  Flax path of the module, a ``re.sub`` replacement (groups allowed) with ``/`` between
  names. Other entries (convolutions, linear layers) are left to the caller (a Conv
  kernel ``OIHW`` becomes Flax's ``HWIO`` with ``w.transpose(2, 3, 1, 0)``, a Linear
  ``(out, in)`` weight ``w.T``).

  Returns:
    ``(variables, layers, rest)``: the norms' Linen variables nested at their Flax paths
    (``{"params": ..., "batch_stats": ...}``), each converted layer by Flax path, and the
    ``state_dict`` keys no rule consumed.

  >>> import numpy as np
  >>> sd = {"layer1.0.bn1.weight": np.ones(2), "layer1.0.bn1.bias": np.zeros(2),
  ...       "layer1.0.bn1.running_mean": np.zeros(2), "layer1.0.bn1.running_var": np.ones(2),
  ...       "layer1.0.conv1.weight": np.ones((2, 2, 3, 3))}
  >>> variables, layers, rest = norms_from_state_dict(
  ...   sd, {r"layer(\\d)\\.(\\d)\\.bn(\\d)": ("BatchNorm2d", r"layer\\1_\\2/bn\\3")})
  >>> sorted(variables["params"]["layer1_0"]["bn1"]), rest
  (['bias', 'scale'], ['layer1.0.conv1.weight'])
  """
  modules: dict[str, dict] = {}
  for key, value in state_dict.items():
    prefix, _, leaf = key.rpartition(".")
    modules.setdefault(prefix, {})[leaf] = value
  variables: dict = {}
  layers: dict[str, TorchNorm] = {}
  used: set[str] = set()
  for prefix, arrays in modules.items():
    for pattern, (kind, path) in rules.items():
      if re.fullmatch(pattern, prefix):
        flax_path = re.sub(pattern, path, prefix) if isinstance(path, str) else path(prefix)
        layer = from_torch(kind, arrays, **options)
        layers[flax_path] = layer
        for collection, values in layer.variables.items():
          node = variables.setdefault(collection, {})
          for name in flax_path.split("/"):
            node = node.setdefault(name, {})
          node.update(values)
        used.update(f"{prefix}.{leaf}" for leaf in arrays)
        break
  return variables, layers, [k for k in state_dict if k not in used]
