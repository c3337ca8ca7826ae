"""From PyTorch: weight-normalized and spectral-normalized ``Linear``/``Conv`` layers as
jaxnorm's :class:`~jaxnorm.WeightNorm`/:class:`~jaxnorm.SpectralNorm` around Flax's
``Dense``/``Conv`` (Linen and NNX), re-exported by :mod:`jaxnorm.convert`.

Both PyTorch forms are read, without importing torch: the old hooks
(``torch.nn.utils.weight_norm``: ``weight_g``/``weight_v``; ``spectral_norm``:
``weight_orig``/``weight_u``/``weight_v``) and the parametrizations
(``torch.nn.utils.parametrizations``: ``parametrizations.weight.original0/1``, and
``original``/``0._u``/``0._v``). Layouts: a ``Linear`` weight ``(out, in)`` becomes Flax's
kernel ``(in, out)``, a ``ConvNd`` weight ``(out, in, *k)`` the kernel ``(*k, in, out)``;
Flax's ``Conv`` takes channels-last inputs. PyTorch's spectral ``u`` (its left singular
vector estimate) is Flax's ``u``; ``sigma`` is PyTorch's ``uᵀWv`` (see
:func:`jaxnorm.convert.wrapped_from_torch` on the order of the iteration's two half-steps).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

_LAYERS = ("Linear", "Conv1d", "Conv2d", "Conv3d")


class TorchWrapped(NamedTuple):
  """A converted weight-normalized or spectral-normalized PyTorch layer.

  Attributes:
    wrapper: ``"WeightNorm"`` or ``"SpectralNorm"`` (jaxnorm's class).
    layer: ``"Dense"`` or ``"Conv"`` (Flax's class, wrapped).
    layer_kwargs: the Linen layer's constructor arguments (``nn.<layer>(**layer_kwargs)``).
    kwargs: the wrapper's constructor arguments but the layer.
    variables: the Linen variables of ``wrapper(layer)``.
    nnx_layer_kwargs: ``flax.nnx``'s layer's arguments but ``rngs``.
  """

  wrapper: str
  layer: str
  layer_kwargs: dict
  kwargs: dict
  variables: dict
  nnx_layer_kwargs: dict

  def linen(self) -> Any:
    """The Linen module (apply it with :attr:`variables`)."""
    import flax.linen as nn

    import jaxnorm

    return getattr(jaxnorm, self.wrapper)(
      getattr(nn, self.layer)(**self.layer_kwargs), **self.kwargs
    )

  def nnx(self, rngs: Any) -> Any:
    """The NNX module with the converted values loaded."""
    from flax import nnx

    from jaxnorm import nnx as jnnx

    cls = nnx.Linear if self.layer == "Dense" else nnx.Conv
    layer = cls(**self.nnx_layer_kwargs, rngs=rngs)
    module = getattr(jnnx, self.wrapper)(layer, **self.kwargs, rngs=rngs)
    inner = self.variables["params"]["layer_instance"]
    for name, value in inner.items():
      getattr(layer, name)[...] = jnp.asarray(value)
    if self.wrapper == "WeightNorm":
      module.scales[("kernel",)][...] = jnp.asarray(self.variables["params"][_SCALE])
    else:
      stats = self.variables["batch_stats"]
      module.batch_stats[("kernel", "u")][...] = jnp.asarray(stats[_U])
      module.batch_stats[("kernel", "sigma")][...] = jnp.asarray(stats[_SIGMA])
    return module


_SCALE, _U, _SIGMA = ("layer_instance/kernel/" + s for s in ("scale", "u", "sigma"))


# The end of the error for tensors on PyTorch's meta device, after what holds them.
META_DEVICE = (
  "on PyTorch's meta device, which holds shapes but no values. Materialize the weights "
  "first: model.to_empty(device='cpu'), then load its state_dict (or "
  "load_state_dict(sd, assign=True))."
)


def on_meta(tensor: Any) -> bool:
  """Whether ``tensor`` is a PyTorch tensor on the meta device (read without torch)."""
  return bool(getattr(tensor, "is_meta", False))


def tensor_to_numpy(value: Any) -> np.ndarray:
  """A tensor (without importing torch: ``detach``/``float``/``numpy`` duck-typed) or any
  array-like as a NumPy array; a bfloat16 tensor, which NumPy cannot hold, becomes an
  ``ml_dtypes`` bfloat16 array (as JAX's). A copy: ``Tensor.numpy()`` shares the tensor's
  memory, which PyTorch updates in place (running statistics, power-iteration vectors)."""
  if on_meta(value):
    raise ValueError(f"a tensor of shape {tuple(value.shape)} is {META_DEVICE}")
  if hasattr(value, "detach"):
    kind = type(value).__name__
    try:
      value = value.detach().cpu()
      if str(value.dtype) == "torch.bfloat16":
        return value.float().numpy().astype(jnp.bfloat16)
      return value.numpy().copy()
    except (RuntimeError, TypeError) as error:  # a tensor subclass that holds no values
      raise ValueError(
        f"a {kind} of shape {tuple(value.shape)} cannot be read as an array ({error}). "
        f"A DTensor (FSDP2's fully_shard, tensor parallelism) holds one shard: pass "
        f"tensor.full_tensor(), or a full state_dict (torch.distributed.checkpoint."
        f"state_dict.get_model_state_dict(model, options=StateDictOptions("
        f"full_state_dict=True, cpu_offload=True))); a FakeTensor holds no values: load "
        f"the real weights first."
      ) from None
  return np.asarray(value)


_numpy = tensor_to_numpy


def _layer_kind(module: Any) -> str:
  for cls in type(module).__mro__:
    if cls.__name__ in _LAYERS:
      return cls.__name__
  raise ValueError(
    f"wrapped_from_torch converts weight-normalized or spectral-normalized "
    f"{list(_LAYERS)} layers, got a {type(module).__name__}; convert other layers by hand "
    f"(a ConvTranspose's weight is (in, out, ...), which Flax's SpectralNorm does not see "
    f"as a matrix of its last axis)."
  )


def _reparameterization(module: Any) -> tuple[str, Any, dict[str, np.ndarray]]:
  """``(kind, the object holding its settings, its arrays)`` of a PyTorch layer's weight:
  kind ``"weight"`` or ``"spectral"``; the arrays as ``g``/``v`` or ``weight``/``u``/``v``."""
  state = {k: _numpy(v) for k, v in dict(module.state_dict()).items()}
  listed = getattr(getattr(module, "parametrizations", None), "weight", None)
  if listed is not None:
    found = [p for p in listed if type(p).__name__ in ("_WeightNorm", "_SpectralNorm")]
    if len(found) != 1 or len(listed) != 1:
      raise ValueError(
        f"the layer's weight has the parametrizations {[type(p).__name__ for p in listed]}; "
        f"wrapped_from_torch converts exactly one weight_norm or spectral_norm."
      )
    pre = "parametrizations.weight."
    if type(found[0]).__name__ == "_WeightNorm":
      return "weight", found[0], {"g": state[pre + "original0"], "v": state[pre + "original1"]}
    arrays = {"weight": state[pre + "original"], "u": state[pre + "0._u"], "v": state[pre + "0._v"]}
    return "spectral", found[0], arrays
  for hook in getattr(module, "_forward_pre_hooks", {}).values():
    if type(hook).__name__ == "WeightNorm" and getattr(hook, "name", None) == "weight":
      return "weight", hook, {"g": state["weight_g"], "v": state["weight_v"]}
    if type(hook).__name__ == "SpectralNorm" and getattr(hook, "name", None) == "weight":
      arrays = {"weight": state["weight_orig"], "u": state["weight_u"], "v": state["weight_v"]}
      return "spectral", hook, arrays
  raise ValueError(
    f"the {type(module).__name__} has no weight_norm or spectral_norm on its weight "
    f"(neither torch.nn.utils.parametrizations' nor the older hooks'); convert a plain "
    f"layer's weight by hand (Linear: w.T; ConvNd: w.transpose(2, ..., 1, 0))."
  )


def _flax_axes(ndim: int) -> list[int]:
  """PyTorch's weight axes in Flax's order: ``(*k, in, out)`` from ``(out, in, *k)``."""
  return [*range(2, ndim), 1, 0]


def _pairs(value: Any, n: int) -> tuple[int, ...]:
  return tuple(int(v) for v in np.broadcast_to(np.asarray(value), (n,)))


def _layer(module: Any, kind: str, weight: np.ndarray, bias: Any) -> tuple[str, dict, dict]:
  """Flax's layer class, its Linen and its NNX arguments, from the PyTorch layer's."""
  out_features = int(weight.shape[0])
  dtype = jnp.dtype(weight.dtype)
  common = dict(use_bias=bias is not None, param_dtype=dtype)
  if kind == "Linear":
    nnx_kw = dict(in_features=int(weight.shape[1]), out_features=out_features, **common)
    return "Dense", dict(features=out_features, **common), nnx_kw
  n = weight.ndim - 2
  if getattr(module, "padding_mode", "zeros") != "zeros":
    raise ValueError(
      f"the {kind} pads with padding_mode={module.padding_mode!r}; Flax's Conv pads with "
      f"zeros only ('CIRCULAR' aside): pad the input yourself (jnp.pad) and convert a "
      f"layer without padding."
    )
  padding = getattr(module, "padding", 0)
  if isinstance(padding, str):
    padding = padding.upper()
  else:
    padding = [(p, p) for p in _pairs(padding, n)]
  conv: dict[str, Any] = dict(
    kernel_size=tuple(int(k) for k in weight.shape[2:]),
    strides=_pairs(getattr(module, "stride", 1), n),
    padding=padding,
    kernel_dilation=_pairs(getattr(module, "dilation", 1), n),
    feature_group_count=int(getattr(module, "groups", 1)),
    **common,
  )
  nnx_kw = dict(in_features=int(weight.shape[1]) * conv["feature_group_count"],
                out_features=out_features, **conv)  # fmt: skip
  return "Conv", dict(features=out_features, **conv), nnx_kw


def wrapped_from_torch(module: Any) -> TorchWrapped:
  """Converts a PyTorch ``Linear``/``ConvNd`` with ``weight_norm`` or ``spectral_norm`` on
  its weight (either PyTorch API) into jaxnorm's wrapper around Flax's ``Dense``/``Conv``.

  The module is read without importing torch (its class, ``state_dict()``, its
  parametrization or hook and the convolution's attributes). Weight normalization keeps
  ``v`` as the kernel and ``g`` as the wrapper's ``scale`` (PyTorch's ``dim`` 0, one norm
  per output feature, is Flax's last axis; ``dim=None`` one norm for the whole weight);
  spectral normalization keeps the raw weight, PyTorch's ``u`` and ``σ = uᵀWv``, and its
  ``n_power_iterations`` and ``eps``. Flax's ``Conv`` is channels-last: transpose NCHW
  inputs to NHWC.

  The power iteration carries over, with one difference of order. Flax's SpectralNorm
  (so jaxnorm's drop-in) steps ``v = ℓ2(Wᵀu)``, then ``u = ℓ2(Wv)``, as PyTorch's older
  ``torch.nn.utils.spectral_norm``: a converted layer's training steps (``update_stats=True``)
  are PyTorch's, to float32 rounding. ``torch.nn.utils.parametrizations.spectral_norm``
  steps ``u`` first, then ``v``: the next ``u`` is still PyTorch's, but ``σ`` takes the
  ``v`` half a step behind, so outputs agree once the iteration has converged (as in a
  trained model) and differ by its remaining progress before. At evaluation PyTorch reuses
  its stored ``u``, ``v`` while Flax's runs ``n_steps`` from ``u`` without storing them:
  the same condition.

  Args:
    module: the PyTorch layer.

  Returns:
    A :class:`TorchWrapped`; ``.linen()`` and ``.variables``, or ``.nnx(rngs)``.

  Raises:
    ValueError: for another layer, a weight without either reparameterization, a
      ``dim`` Flax cannot express, or a padding mode other than zeros.
  """
  kind = _layer_kind(module)
  reparam, settings, arrays = _reparameterization(module)
  state = dict(module.state_dict())
  bias = None if state.get("bias") is None else _numpy(state["bias"])
  dim = getattr(settings, "dim", 0)
  raw = arrays["v"] if reparam == "weight" else arrays["weight"]
  axes = _flax_axes(raw.ndim)
  kernel = np.transpose(raw, axes)
  layer, layer_kw, nnx_layer_kw = _layer(module, kind, raw, bias)
  inner = {"kernel": kernel} if bias is None else {"kernel": kernel, "bias": bias}
  if reparam == "weight":
    if dim is None or dim == -1:  # (PyTorch's -1: one norm of the whole weight)
      feature_axes, scale = None, arrays["g"].reshape(())
    else:
      d = int(dim) % raw.ndim
      feature_axes = axes.index(d)
      scale = arrays["g"].reshape(raw.shape[d])
    variables: dict[str, Any] = {"params": {"layer_instance": inner, _SCALE: scale}}
    kwargs: dict[str, Any] = dict(feature_axes=feature_axes, param_dtype=jnp.dtype(scale.dtype))
    return TorchWrapped("WeightNorm", layer, layer_kw, kwargs, variables, nnx_layer_kw)
  if int(dim) % raw.ndim != 0:
    raise ValueError(
      f"the spectral_norm uses dim={dim}; Flax's SpectralNorm sees the weight as a matrix "
      f"of its output axis (PyTorch's dim=0), which a {kind} with dim={dim} is not."
    )
  u, v = arrays["u"], arrays["v"]
  w64 = raw.astype(np.float64).reshape(raw.shape[0], -1)
  sigma = np.asarray(u.astype(np.float64) @ w64 @ v.astype(np.float64), u.dtype)
  stats = {_U: u.reshape(1, -1), _SIGMA: sigma}
  kwargs = dict(n_steps=int(settings.n_power_iterations), epsilon=float(settings.eps),
                param_dtype=jnp.dtype(u.dtype))  # fmt: skip
  variables = {"params": {"layer_instance": inner}, "batch_stats": stats}
  return TorchWrapped("SpectralNorm", layer, layer_kw, kwargs, variables, nnx_layer_kw)
