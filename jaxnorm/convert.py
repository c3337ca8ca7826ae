"""From PyTorch: a norm layer (the module itself, or its ``state_dict``) as jaxnorm
variables and constructor arguments (:func:`from_torch`, :func:`norms_from_state_dict`:
the norms, DyT's ``DynamicTanh`` and ``LocalResponseNorm`` included), and weight- or
spectral-normalized ``Linear``/``Conv`` layers as jaxnorm's wrappers
(:func:`wrapped_from_torch`).

No import of ``torch``: a module is read through its attributes and ``state_dict()``, and
arrays can be tensors or anything NumPy reads. What a converter must get right and the
widely used ones do not:

- **names**: ``weight → scale``, ``bias → bias``, ``running_mean/var → batch_stats
  mean/var``, ``num_batches_tracked`` kept; every other or missing entry is refused;
- **momentum**: PyTorch's ``m`` weighs the new batch, Flax's the old average: ``1 − m``;
  PyTorch's ``momentum=None`` (a cumulative average) stays ``None``;
- **variance**: PyTorch's training stores the unbiased ``n/(n − 1)·var``:
  ``unbiased_running_var=True``, so a ported model trains step for step like the original;
- **ε**: 1e-5 for every PyTorch norm (Flax's LayerNorm/GroupNorm/RMSNorm default to
  1e-6), and ``RMSNorm(eps=None)`` means float32's machine epsilon (1.19e-7) for float32,
  bfloat16 and float16 inputs, float64's for float64 (:func:`torch_epsilon`);
- **no running statistics** (BatchNorm's ``track_running_stats=False``): batch statistics
  in every mode, ``BatchNorm(track_running_stats=False)``;
- **InstanceNorm with running statistics** (``track_running_stats=True``, which PyTorch
  uses at evaluation) is a ``BatchNorm`` with ``virtual_batch_size=1``;
- **layout**: PyTorch is channels-first; ``channels_first=True`` (default) puts the
  feature axis at 1 (``axis=1``, ``feature_axis=1``, ``feature_axes=1``), for inputs kept
  as NCHW; with ``channels_first=False`` (inputs transposed to NHWC) it is -1. LayerNorm
  and RMSNorm normalize trailing axes in PyTorch in either layout; timm's and
  torchvision's ``LayerNorm2d`` (ConvNeXt) normalizes the channel axis;
- **classes whose name says nothing reliable** (Hugging Face transformers' norms, a
  class named like PyTorch's from another code base, a subclass with its own
  ``forward``, a ``forward`` replaced on the instance) are run beside the forms they may
  compute and converted as the one that reproduces them (``jaxnorm._convert_identify``,
  :attr:`TorchNorm.identified`), or refused by name;
- **what would convert wrongly in silence** is refused by name: forward hooks and
  pre-hooks (global ones too), tensors on the meta device or without values (DTensor
  shards, FakeTensors), integer weights; a rule that converts nothing is named in a
  warning.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxnorm import _convert_identify as identify
from jaxnorm._convert_layers import META_DEVICE, TorchWrapped, on_meta, wrapped_from_torch
from jaxnorm._convert_layers import tensor_to_numpy as _numpy
from jaxnorm._dtypes import promote, real_dtype

__all__ = [
  "TorchNorm",
  "TorchWrapped",
  "from_torch",
  "norms_from_state_dict",
  "torch_epsilon",
  "torch_kind",
  "wrapped_from_torch",
]

KINDS = (
  "BatchNorm1d",
  "BatchNorm2d",
  "BatchNorm3d",
  "SyncBatchNorm",
  "FrozenBatchNorm2d",
  "LayerNorm",
  "LayerNorm2d",
  "GroupNorm",
  "InstanceNorm1d",
  "InstanceNorm2d",
  "InstanceNorm3d",
  "RMSNorm",
  "RMSNorm2d",
  "DynamicTanh",
  "LocalResponseNorm",
)
TORCH_EPS = 1e-5  # every PyTorch norm's default
# Other libraries' norm classes by class name, as the kind they compute: torchvision's
# FrozenBatchNorm2d and timm's (its *Act classes add an activation, named in a warning).
# Subclasses of PyTorch's own norms (timm's BatchNormAct2d, GroupNorm1, ...) are found
# by their class hierarchy; these names come first, as some subclass nn.LayerNorm to
# normalize the channel axis instead.
ALIASES = {
  "DyT": "DynamicTanh",  # the DyT paper's reference class is DynamicTanh
  "LigerDyT": "DynamicTanh",  # Liger-Kernel's (gamma/beta for weight/bias)
  "FrozenBatchNormAct2d": "FrozenBatchNorm2d",
  "LayerNorm2dFp32": "LayerNorm2d",
  "LayerNormExp2d": "LayerNorm2d",  # timm's, over the channels of NCHW in its own forward
  "LayerNormAct2d": "LayerNorm2d",
  "LayerNormAct2dFp32": "LayerNorm2d",
  "RmsNorm": "RMSNorm",
  "RmsNormFp32": "RMSNorm",
  "RmsNormAct": "RMSNorm",
  "RmsNormActFp32": "RMSNorm",
  "RmsNorm2d": "RMSNorm2d",
  "RmsNorm2dFp32": "RMSNorm2d",
  "RmsNormAct2d": "RMSNorm2d",
  "RmsNormAct2dFp32": "RMSNorm2d",
}
# Other libraries' subclasses of PyTorch's norms whose own ``forward`` computes their
# base's norm (timm's fast-norm and float32 variants; its *Act classes then apply the
# activation :func:`_carried` names). Any other subclass with its own forward is run to
# find what it computes, or refused (timm's LayerNormExp2d, a LayerNorm over the channels).
_SAME_MATHS = frozenset({
  "GroupNorm1", "LayerNormFp32", "BatchNormAct2d", "SyncBatchNormAct", "GroupNormAct",
  "GroupNorm1Act", "LayerNormAct", "LayerNormActFp32",
})  # fmt: skip
# The state_dict entries each kind can have (anything else is refused, by name).
_KEYS = {
  "BatchNorm": ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"),
  "FrozenBatchNorm": ("weight", "bias", "running_mean", "running_var"),
  "InstanceNorm": ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"),
  "GroupNorm": ("weight", "bias"),
  "LayerNorm": ("weight", "bias"),
  "RMSNorm": ("weight",),
  "DyT": ("alpha", "weight", "bias"),
  "LocalResponseNorm": (),
}
_FAMILIES = {"SyncBatchNorm": "BatchNorm", "DynamicTanh": "DyT"}
_DEFAULTS = dict(eps=TORCH_EPS, momentum=0.1, num_groups=None, normalized_shape=None,
                 num_features=None, zero_centered_scale=False)  # fmt: skip
# Classes named by their maths alone, whatever code base defines them (DyT's reference
# class lives in users' code; its learned alpha says what it is).
_ANY_ORIGIN = frozenset({"DynamicTanh", "DyT", "LigerDyT"})
# The module attributes read from a PyTorch module, by from_torch's option they fill.
_ATTRIBUTES = {
  "eps": "eps",
  "momentum": "momentum",
  "num_groups": "num_groups",
  "normalized_shape": "normalized_shape",
  "num_features": ("num_features", "num_channels"),
}


class TorchNorm(NamedTuple):
  """A converted PyTorch norm layer.

  Attributes:
    module: the jaxnorm class name (``"BatchNorm"``, ``"LayerNorm"``, ...).
    kwargs: the Linen constructor arguments (``jaxnorm.<module>(**kwargs)``).
    nnx_kwargs: the NNX constructor arguments but ``rngs``
      (``jaxnorm.nnx.<module>(**nnx_kwargs, rngs=...)``).
    variables: the Linen variables, ``{"params": ..., "batch_stats": ...}`` (only the
      collections the layer has).
    activation: what the PyTorch module applies after the norm and the converted layer
      does not (timm's ``BatchNormAct2d(act_layer=nn.SiLU)``: ``"SiLU"``; its
      ``drop_layer`` too), for the caller to apply; None for a plain norm.
    identified: for a class jaxnorm does not know by name (transformers' ``LlamaRMSNorm``,
      a look-alike of a PyTorch class), the form its ``forward`` was measured to compute
      (``"RMSNorm, x·(1 + w) over the last axis, ε = 1e-06"``); None otherwise.
  """

  module: str
  kwargs: dict
  nnx_kwargs: dict
  variables: dict
  activation: str | None = None
  identified: str | None = None

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
  the dtype PyTorch computes in, which is float32 for float32, bfloat16 and float16 inputs
  (1.19e-7; PyTorch's documentation says ``x.dtype``, but its half-precision RMSNorm is
  bit-identical to ``eps=torch.finfo(torch.float32).eps``, measured with PyTorch 2.13)
  and float64's (2.2e-16) for float64.

  >>> torch_epsilon(None, jnp.bfloat16)
  1.1920928955078125e-07
  """
  if eps is not None:
    return float(eps)
  return float(jnp.finfo(promote(real_dtype(dtype), jnp.float32)).eps)


def torch_kind(module: Any) -> str | None:
  """The kind (one of ``KINDS``) of a PyTorch module, by its class or, for a subclass of a
  norm (timm's ``BatchNormAct2d``, ``GroupNorm1``), its base classes; ``ALIASES`` name
  other libraries' classes. None for a module that is no norm jaxnorm knows by name (a
  norm-like one, such as transformers' ``LlamaRMSNorm``, is identified by running it:
  :func:`from_torch`)."""
  return _match(module)[0]


def _match(module: Any) -> tuple[str | None, tuple[type, ...], type | None]:
  """:func:`torch_kind`, the classes of ``module``'s hierarchy below the one that named
  the kind (its subclasses, whose own ``forward`` may compute something else), and that
  class."""
  mro = type(module).__mro__
  for i, cls in enumerate(mro):
    if cls.__name__ in ALIASES:
      return ALIASES[cls.__name__], mro[:i], cls
    if cls.__name__ in KINDS:
      return cls.__name__, mro[:i], cls
  return None, (), None


def _label(prefix: str | None) -> str:
  return "the module" if prefix is None else repr(prefix)


def _unknown_maths(module: Any) -> str | None:
  """Why the class name cannot say what ``module`` computes, or None where it can: no
  known name; a known name from another code base (the ConvNeXt repository's
  ``LayerNorm(data_format="channels_first")``, gemma_pytorch's ``RMSNorm``: x·(1 + w)); a
  subclass with its own ``forward``; a ``forward`` replaced on the instance."""
  kind, below, named = _match(module)
  if kind is None or named is None:
    return "no norm jaxnorm knows by name"
  if "forward" in getattr(module, "__dict__", {}):
    return "its forward is replaced on the instance"
  for sub in below:
    own = [m for m in ("forward", "_forward") if m in vars(sub)]
    if own and sub.__name__ not in _SAME_MATHS:
      return f"a subclass of {kind} whose class {sub.__name__} defines its own {own[0]}"
  where = identify.package(named)
  if named.__name__ not in _ANY_ORIGIN and where not in identify.TRUSTED_PACKAGES:
    return (
      f"a {named.__name__} from {named.__module__!r}, not PyTorch's, torchvision's or "
      f"timm's class of that name"
    )
  return None


def _check_module(module: Any, prefix: str | None) -> None:
  """Refuses what would convert wrongly in silence: forward hooks (the module's or
  PyTorch's global ones) and tensors on PyTorch's meta device."""
  cls = type(module).__name__
  for what, changes, attr in (("forward hook", "output", "_forward_hooks"),
                              ("forward pre-hook", "input", "_forward_pre_hooks")):  # fmt: skip
    hooks = _hooks(module, attr)
    if hooks:
      raise ValueError(
        f"{_label(prefix)} ({cls}) has {len(hooks)} {what}(s), {hooks}: PyTorch passes the "
        f"module's {changes} through them, which the converted layer would not do. Remove "
        f"them before converting (the handle's .remove(); a global one with its own handle) "
        f"and apply what they do around the converted layer."
      )
  meta = [k for k, v in _own_entries(module).items() if on_meta(v)]
  if meta:
    raise ValueError(f"{_label(prefix)} ({cls}) has {meta} {META_DEVICE}")


def _hooks(module: Any, attr: str) -> list[str]:
  """The names of ``module``'s hooks in ``attr`` and of PyTorch's global ones (read from
  ``torch.nn.modules.module`` where torch is imported; nothing imports it here)."""
  torch_module = sys.modules.get("torch.nn.modules.module")
  found = [(h, "") for h in dict(getattr(module, attr, None) or {}).values()]
  found += [
    (h, "global ") for h in dict(getattr(torch_module, f"_global{attr}", None) or {}).values()
  ]
  return [f"{where}{getattr(h, '__qualname__', repr(h))}" for h, where in found]


def _family(kind: str) -> str:
  """Which entries a kind has and how it converts: BatchNorm, FrozenBatchNorm, ..."""
  return _FAMILIES.get(kind) or next(f for f in _KEYS if kind.startswith(f))


def _own_entries(module: Any) -> dict[str, Any]:
  """A module's own parameters and buffers (not its children's), by name."""
  own: dict[str, Any] = {}
  for method in ("named_parameters", "named_buffers"):
    if hasattr(module, method):
      own.update(getattr(module, method)(recurse=False))
  return own


def _norm_like(module: Any) -> bool:
  """Whether a module jaxnorm does not know by name looks like a norm: running statistics
  of its own; or parameters of its own, "norm" in the name of its class or a base class
  and no child with parameters (a residual block such as timm's NormFreeBlock is none);
  or no parameters, no children and a class name ending in "Norm" (transformers'
  ``OlmoLayerNorm``)."""
  own = _own_entries(module)
  if {"running_mean", "running_var"} & set(own):
    return True
  names = [c.__name__.lower() for c in type(module).__mro__[:-1] if c.__name__ != "Module"]
  children = [m for _, m in module.named_modules() if m is not module]
  if not own:
    return not children and names[0].endswith("norm")
  weighty = [m for m in children if _own_entries(m)]
  return not weighty and any("norm" in n for n in names)


def _unconvertible(module: Any, prefix: str | None, why: str = "") -> ValueError:
  """The error for a norm-like module that cannot be converted, naming it (by its name in
  the model, ``prefix``, where it has one), why (``why``), and the routes that work."""
  cls, label = type(module).__name__, _label(prefix)
  lazy = [k for k, v in _own_entries(module).items() if type(v).__name__.startswith("Uninit")]
  if lazy:
    return ValueError(
      f"{label} is an uninitialised lazy module ({cls}: {lazy} have no shape yet); run one "
      f"forward pass through the PyTorch model first, which gives them their shapes."
    )
  skip = (
    ""
    if prefix is None
    else f"; or leave it out with skip=[{prefix!r}] (its entries then stay in rest)"
  )
  why = why or (
    f"it has running statistics or a norm's parameters but is no norm jaxnorm knows by "
    f"name (PyTorch's {list(KINDS)}, their subclasses, and {sorted(ALIASES)})"
  )
  return ValueError(
    f"{label} is a {cls} ({type(module).__module__}): {why}. Where you know what it "
    f"computes, convert its state_dict with from_torch('LayerNorm' or 'RMSNorm', "
    f"state_dict, eps=..., normalized_shape=..., zero_centered_scale=...) (Gemma's x·(1 + w) "
    f"is zero_centered_scale=True; a weight per head, normalized_shape=(head_dim,)), or "
    f"build the jaxnorm layer by hand{skip}."
  )


def _carried(module: Any) -> str | None:
  """What a module applies after its norm that the converted layer does not: timm's
  ``drop`` and ``act`` layers (in that order), unless ``Identity``; None otherwise."""
  names = []
  for attr in ("drop", "act"):
    sub = getattr(module, attr, None)
    if hasattr(sub, "state_dict") and type(sub).__name__ != "Identity":
      names.append(type(sub).__name__)
  return ", then ".join(names) or None


_AS_NAMED = "as its class name says"


def _lookalike(module: Any, layer: TorchNorm) -> bool:
  """Whether a module's class is named as one jaxnorm knows but computes another form,
  found by running it (the ConvNeXt repository's channels-first ``LayerNorm``)."""
  named = not isinstance(module, dict) and _match(module)[0] is not None
  return named and not (layer.identified or _AS_NAMED).endswith(_AS_NAMED)


def _lookalike_message(layers: Mapping[str, TorchNorm], sources: Mapping[str, Any]) -> str:
  shown = "; ".join(
    f"{p!r} ({type(sources[p]).__name__} from {type(sources[p]).__module__!r}, "
    f"{_unknown_maths(sources[p])}): {layer.identified}"
    for p, layer in list(layers.items())[:4]
  )
  more = f"; and {len(layers) - 4} more" if len(layers) > 4 else ""
  return (
    f"{len(layers)} module(s) named like a norm jaxnorm knows compute another form: "
    f"converted as what running their forward showed, not as their name says: "
    f"{shown}{more}. TorchNorm.identified says what each computes."
  )


def _activation_message(carried: Mapping[str, str]) -> str:
  shown = ", ".join(f"{a} at {p!r}" for p, a in list(carried.items())[:4])
  more = f" and {len(carried) - 4} more" if len(carried) > 4 else ""
  return (
    f"{len(carried)} converted norm layer(s) apply after the norm what the converted layer "
    f"does not: {shown}{more}. Apply it after the norm (e.g. jax.nn.silu for SiLU, "
    f"jax.nn.relu for ReLU; a drop layer only in training); TorchNorm.activation names it."
  )


def _check_keys(kind, family, state_dict):
  unknown = sorted(set(state_dict) - set(_KEYS[family]))
  if unknown:
    raise ValueError(
      f"{kind}'s state_dict has unexpected entries {unknown}; a {kind} has only "
      f"{list(_KEYS[family])}. Pass one layer's entries with their prefix removed "
      f"(norms_from_state_dict does that for a whole model)."
    )
  if family == "FrozenBatchNorm":
    absent = [k for k in _KEYS[family] if k not in state_dict]
    if absent:
      raise ValueError(
        f"{kind}'s state_dict lacks {absent}: a frozen BatchNorm keeps all of "
        f"{list(_KEYS[family])}; pass the complete state_dict of the layer."
      )
  pairs = [("running_mean", "running_var")]
  # (a weight alone: LayerNorm(bias=False), timm's GroupNorm1NoBias and LayerNorm2dNoBias)
  if family not in ("LayerNorm", "RMSNorm", "DyT", "GroupNorm"):
    pairs.append(("weight", "bias"))
  for a, b in pairs:
    if (a in state_dict) != (b in state_dict):
      have, missing = (a, b) if a in state_dict else (b, a)
      raise ValueError(
        f"{kind}'s state_dict has {have!r} but no {missing!r}: PyTorch saves both or "
        f"neither; pass the complete state_dict of the layer."
      )
  if "num_batches_tracked" in state_dict and "running_mean" not in state_dict:
    raise ValueError(
      f"{kind}'s state_dict has 'num_batches_tracked' but no 'running_mean'/'running_var': "
      f"a layer with running statistics (track_running_stats=True) saves all three, one "
      f"without saves none; pass the complete state_dict of the layer."
    )
  if family in ("LayerNorm", "GroupNorm") and "bias" in state_dict and "weight" not in state_dict:
    raise ValueError(f"{kind}'s state_dict has 'bias' but no 'weight': pass the complete one.")


def _from_module(module: Any, options: dict, prefix: str | None = None) -> tuple[str, dict]:
  """The kind, ``state_dict`` and options of a PyTorch module whose class name says what
  it computes (duck-typed; ``prefix``: its name in the model, for errors)."""
  kind = _match(module)[0]
  assert kind is not None  # (_module_layer identifies the others)
  state_dict = dict(module.state_dict())
  _read_attributes(module, options)
  affine = getattr(module, "affine", getattr(module, "elementwise_affine", None))
  if affine is not None and bool(affine) != ("weight" in state_dict):
    raise ValueError(
      f"the {kind} has affine={bool(affine)} but its state_dict "
      f"{'lacks' if affine else 'has'} 'weight'."
    )
  track = getattr(module, "track_running_stats", None)
  if track is not None and bool(track) != ("running_mean" in state_dict):
    raise ValueError(
      f"the {kind} has track_running_stats={bool(track)} but its state_dict "
      f"{'lacks' if track else 'has'} 'running_mean'."
    )
  return kind, state_dict


def _read_attributes(module: Any, options: dict) -> None:
  """``options`` filled from the module's constructor attributes (``eps``, ...)."""
  for option, names in _ATTRIBUTES.items():
    for attr in (names,) if isinstance(names, str) else names:
      if hasattr(module, attr):
        options[option] = getattr(module, attr)
        break


def _module_layer(module, options, channels_first, torch_training, prefix):
  """A PyTorch module converted: by its class name where that says what it computes,
  else by running its ``forward`` beside each form it may compute
  (``jaxnorm._convert_identify``); refused, naming it, where neither can."""
  if not hasattr(module, "state_dict"):
    raise TypeError(
      f"from_torch converts a PyTorch module (anything with state_dict()), or a class name "
      f"with its state_dict; got a {type(module).__name__} from {type(module).__module__!r}"
      f"{', which is already a JAX layer' if 'flax' in type(module).__module__ else ''}."
    )
  why = _unknown_maths(module)
  if why is not None and not _norm_like(module):
    raise ValueError(
      f"{_label(prefix)} is a {type(module).__name__}, which is no norm jaxnorm converts "
      f"(PyTorch's {list(KINDS)}, their subclasses, and {sorted(ALIASES)}; other norms "
      f"where running their forward shows what they compute)."
    )
  if any(type(v).__name__.startswith("Uninit") for v in _own_entries(module).values()):
    raise _unconvertible(module, prefix)
  _check_module(module, prefix)
  if why is None:
    kind, state_dict = _from_module(module, options, prefix)
    return _convert(kind, state_dict, options, channels_first, torch_training, prefix, module)
  if not identify.runnable(module):
    raise _unconvertible(
      module, prefix, f"{why}; jaxnorm tells what such a module computes only by running it"
    )
  extra = identify.extra_inputs(module)
  if extra:
    raise _unconvertible(
      module, prefix,
      f"{why}, and its forward takes {extra} besides the input (Mamba's gated RMSNorm "
      f"multiplies x by silu(gate) before normalizing, in groups), which a jaxnorm norm "
      f"does not. Apply that by hand before a jaxnorm RMSNorm over the groups "
      f"(x reshaped to (..., groups, group_size), reduction_axes=-1, feature_axes=(-2, -1))",
    )  # fmt: skip
  state_dict = dict(module.state_dict())
  if set(state_dict) <= {"gamma", "beta"}:  # (some codebases' names for weight and bias)
    state_dict = {{"gamma": "weight", "beta": "bias"}[k]: v for k, v in state_dict.items()}
  cls = type(module).__name__
  arrays = _arrays(cls if prefix is None else f"{prefix!r} ({cls})", state_dict)
  read, named = dict(options), None
  if _match(module)[0] is not None:  # a PyTorch class with its forward replaced
    kind, _ = _from_module(module, read, prefix)  # (its attributes read into ``read``)
    named = (f"{kind}, {_AS_NAMED}", kind, {})
  else:
    _read_attributes(module, read)

  def build(kind, form):
    options = {**read, **form}
    return _convert(kind, state_dict, options, channels_first, torch_training, prefix, module)

  layer, description, tried = identify.identify(module, arrays, build, channels_first, named)
  if layer is None:
    shown = "; ".join(f"{d}: {r:.2g}" for d, r in tried.items())
    raise _unconvertible(
      module, prefix,
      f"{why}. jaxnorm ran its forward beside each form it could compute (max|Δ|/max|y| on "
      f"a probe input: {shown or f'none applies to its entries {sorted(arrays)}'}), and "
      f"none reproduced it",
    )  # fmt: skip
  return layer._replace(identified=description)


def from_torch(
  kind: Any,
  state_dict: Mapping[str, Any] | None = None,
  *,
  eps: float | None = TORCH_EPS,
  momentum: float | None = 0.1,
  num_groups: int | None = None,
  normalized_shape: Any = None,
  channels_first: bool = True,
  dtype: Any = None,
  torch_training: bool = True,
  num_features: int | None = None,
  zero_centered_scale: bool = False,
) -> TorchNorm:
  """Converts one PyTorch norm layer: the module itself, or its class name and
  ``state_dict`` with the constructor arguments ``state_dict`` does not hold.

  Given the module (``from_torch(model.bn1)``; torch is not imported: its class and base
  classes, ``state_dict()``, ``eps``, ``momentum``, ``num_groups``, ``normalized_shape``,
  ``affine``/``elementwise_affine`` and ``track_running_stats`` are read), nothing is
  copied by hand; a subclass converts as the norm it is (timm's ``BatchNormAct2d`` as a
  BatchNorm, with a warning that names the activation it also applies, see
  :attr:`TorchNorm.activation`). Given arrays, every entry is checked: a partial or
  foreign ``state_dict`` is refused, naming the key.

  A module whose class name does not say what it computes is converted by running it:
  Hugging Face transformers' norms (``LlamaRMSNorm``, ``Qwen3RMSNorm``, Gemma's x·(1 + w)
  ``GemmaRMSNorm``, ``CohereLayerNorm``'s weight per head, the parameterless
  ``OlmoLayerNorm``, ...), a class named like PyTorch's from another code base (the
  ConvNeXt repository's channels-first ``LayerNorm``), a subclass with its own
  ``forward``, or a ``forward`` replaced on the instance. Each form it may compute
  (LayerNorm or RMSNorm; trailing axes, a weight per head or the channel axis; x·w or
  x·(1 + w); its ε from ``eps``/``variance_epsilon``) is run beside it on a probe input
  whose variance is about ε, and the one that reproduces it is returned, described in
  :attr:`TorchNorm.identified`; where none does, or its ``forward`` takes a second input
  (Mamba's ``gate``), it is refused, naming what was tried.

  Args:
    kind: a PyTorch norm module (an instance), or its class name: one of
      ``convert.KINDS`` (``"LayerNorm2d"``/``"RMSNorm2d"`` normalize the channel axis, as
      timm's and torchvision's ``LayerNorm2d`` of ConvNeXt and timm's ``RmsNorm2d``;
      ``"FrozenBatchNorm2d"`` is torchvision's, converted to jaxnorm's
      ``FrozenBatchNorm``); ``convert.ALIASES`` maps timm's class names to them.
    state_dict: the layer's arrays, for a class name (tensors or any array-like;
      bfloat16 tensors are read as bfloat16).
    eps: the layer's ``eps`` (PyTorch's default 1e-5; ``None`` for ``RMSNorm(eps=None)``,
      see :func:`torch_epsilon`).
    momentum: the BatchNorm's PyTorch momentum (default 0.1; ``None``: cumulative; for
      an InstanceNorm ``None`` means PyTorch's 0, running statistics that never move).
    num_groups: GroupNorm's number of groups (required for ``GroupNorm``).
    normalized_shape: LayerNorm/RMSNorm's normalized shape, the trailing axes the
      statistics are over: needed without a ``weight``; shorter than the weight's shape
      for a weight per head (Cohere's QK-norm: weight ``(heads, head_dim)``,
      ``normalized_shape=(head_dim,)``).
    channels_first: inputs stay channels-first (PyTorch's layout) in JAX: the feature
      axis of BatchNorm, InstanceNorm, GroupNorm and LayerNorm2d is 1 (False: -1, for
      inputs transposed to NHWC). LayerNorm and RMSNorm normalize the trailing
      ``normalized_shape`` axes in PyTorch, whatever the layout: it does not apply.
    dtype: the layer's ``dtype`` (its output's and computation's); default None: the
      input's and the parameters' promoted, as PyTorch's output (bfloat16 weights on
      float32 activations give float32). ``RMSNorm(eps=None)`` takes the machine epsilon
      of this dtype, else of the parameters'.
    torch_training: BatchNorm trains with PyTorch's convention (unbiased running
      variance and the ``num_batches_tracked`` counter; ``momentum=None`` as PyTorch's
      cumulative average). False gives Flax's.
    num_features: the number of channels, for a layer without parameters or running
      statistics (e.g. ``InstanceNorm``'s default ``affine=False``), which NNX needs.
    zero_centered_scale: an RMSNorm that multiplies by ``1 + w`` (Gemma, Gemma 2 and 3's
      ``GemmaRMSNorm``), with the weight stored zero-centred as Gemma's checkpoints
      hold it.

  Returns:
    A :class:`TorchNorm`. A BatchNorm without running statistics
    (``track_running_stats=False``) becomes a ``BatchNorm(track_running_stats=False)``,
    which normalizes with the batch statistics in every mode, as PyTorch's.

  Raises:
    ValueError: for an unknown kind, unexpected, missing or inconsistent ``state_dict``
      entries (``num_batches_tracked`` without running statistics), arrays of
      inconsistent shapes, integer parameters, a missing constructor argument (named), an
      uninitialised lazy module, a module whose maths neither its class name nor running
      it identifies, a forward hook or pre-hook, tensors on the meta device, or tensors
      that hold no values here (DTensor shards, FakeTensors).
    TypeError: for a class instead of a module or a class name, or an object that is no
      PyTorch module (a Flax layer).

  Warns:
    UserWarning: for a module that applies an activation (or a drop layer) after its
      norm, naming it.

  >>> import numpy as np
  >>> bn = from_torch("BatchNorm2d", {"weight": np.ones(3), "bias": np.zeros(3),
  ...   "running_mean": np.zeros(3), "running_var": np.ones(3), "num_batches_tracked": 7})
  >>> bn.module, bn.kwargs["axis"], bn.kwargs["momentum"], sorted(bn.variables)
  ('BatchNorm', 1, 0.9, ['batch_stats', 'params'])
  """
  options = dict(eps=eps, momentum=momentum, num_groups=num_groups, dtype=dtype)
  options.update(normalized_shape=normalized_shape, num_features=num_features)
  options.update(zero_centered_scale=zero_centered_scale)
  if isinstance(kind, type):
    raise TypeError(
      f"from_torch takes a PyTorch norm module, an instance (from_torch(model.bn1), or "
      f"from_torch(torch.nn.{kind.__name__}(...)) for a fresh one), or a class name with its "
      f"state_dict (from_torch({kind.__name__!r}, state_dict)); got the class "
      f"{kind.__name__} itself."
    )
  layer = _convert(kind, state_dict, options, channels_first, torch_training)
  if layer.activation is not None:
    warnings.warn(_activation_message({type(kind).__name__: layer.activation}), stacklevel=2)
  if not isinstance(kind, str) and _lookalike(kind, layer):
    warnings.warn(_lookalike_message({"the module": layer}, {"the module": kind}), stacklevel=2)
  return layer


def _convert(kind, state_dict, options, channels_first, torch_training, prefix=None, source=None):
  """:func:`from_torch`'s conversion, without its warning (``prefix``: the module's name
  in the model, for errors; ``source``: the module a class name and state_dict come
  from, for the attributes only a module has: DyT's layout, LocalResponseNorm's size)."""
  if not isinstance(kind, str):
    given = [k for k, v in options.items() if k != "dtype" and v != _DEFAULTS[k]]
    if state_dict is not None or given:
      raise TypeError(
        f"from_torch(module) reads the state_dict and {sorted(_ATTRIBUTES)} from the module "
        f"itself; got {'a state_dict' if state_dict is not None else given} as well. Pass "
        f"them only with a class name: from_torch('BatchNorm2d', state_dict, eps=...)."
      )
    layer = _module_layer(kind, options, channels_first, torch_training, prefix)
    return layer._replace(activation=layer.activation or _carried(kind))
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS} (PyTorch's class name), got {kind!r}.")
  if state_dict is None:
    raise TypeError(f"from_torch({kind!r}, ...) needs the layer's state_dict.")
  family = _family(kind)
  arrays = _arrays(kind if prefix is None else f"{prefix!r} ({kind})", state_dict)
  if options.get("zero_centered_scale") and kind not in ("RMSNorm", "RMSNorm2d"):
    raise ValueError(
      f"zero_centered_scale=True (Gemma's x·(1 + w)) is an RMSNorm option; got it for a "
      f"{kind}. Pass kind='RMSNorm' for Gemma's norms."
    )
  if family == "DyT":  # (Liger's names)
    arrays = {{"gamma": "weight", "beta": "bias"}.get(k, k): v for k, v in arrays.items()}
  _check_keys(kind, family, arrays)  # (a None entry counts as missing)
  if family in ("DyT", "LocalResponseNorm"):
    return _pointwise(kind, family, arrays, source, channels_first)
  eps, momentum, dtype = options["eps"], options["momentum"], options["dtype"]
  weight, bias = arrays.get("weight"), arrays.get("bias")
  x64 = jax.config.read("jax_enable_x64")
  param_dtype = jnp.dtype(jnp.float32 if weight is None else weight.dtype)
  if param_dtype == np.float64 and not x64:
    param_dtype = jnp.dtype(jnp.float32)  # what JAX holds without x64
  act = jnp.dtype(param_dtype if dtype is None else dtype)
  channel = 1 if channels_first else -1
  params = {k: v for k, v in (("scale", weight), ("bias", bias)) if v is not None}
  common = dict(use_scale=weight is not None, use_bias=bias is not None, param_dtype=param_dtype)
  if dtype is not None:  # else the output's dtype is the input's and the parameters'
    common["dtype"] = act  # promoted, as PyTorch's (bfloat16 weights, float32 x: float32)
  if options.get("zero_centered_scale"):
    common["zero_centered_scale"] = True
  c = options["num_features"]
  if family in ("BatchNorm", "FrozenBatchNorm", "InstanceNorm", "GroupNorm"):
    c = _features(kind, arrays, c)
  if family == "FrozenBatchNorm":  # fixed statistics and affine (torchvision's)
    kw = dict(axis=channel, epsilon=torch_epsilon(eps), **common)
    stats = {k: arrays[f"running_{k}"].astype(_stats_dtype(arrays, x64)) for k in ("mean", "var")}
    return TorchNorm("FrozenBatchNorm", kw, dict(num_features=c, **kw), _vars(params, stats))
  if family == "BatchNorm" or (family == "InstanceNorm" and "running_mean" in arrays):
    if family == "InstanceNorm" and momentum is None:
      momentum = 0.0  # PyTorch's InstanceNorm takes None as 0: the statistics never move
    bn = _batch_norm(arrays, params, common, eps, momentum, channel, torch_training, c, x64)
    if family == "InstanceNorm":
      # Running averages of instance statistics, used at evaluation: a BatchNorm whose
      # sub-batches are single examples (instance statistics in training). PyTorch's
      # InstanceNorm never advances num_batches_tracked: no counter (its value unused).
      for kw in (bn.kwargs, bn.nnx_kwargs):
        kw.update(virtual_batch_size=1, count_batches=False)
      bn.variables.get("batch_stats", {}).pop("num_batches_tracked", None)
    return bn
  if family == "InstanceNorm":
    kw = dict(epsilon=torch_epsilon(eps), feature_axes=channel, **common)
    return TorchNorm("InstanceNorm", kw, dict(num_features=c, **kw), _vars(params))
  if family == "GroupNorm":
    if options["num_groups"] is None:
      raise ValueError("GroupNorm needs num_groups (PyTorch's first constructor argument).")
    kw = dict(num_groups=int(options["num_groups"]), epsilon=torch_epsilon(eps),
              feature_axis=channel, **common)  # fmt: skip
    return TorchNorm("GroupNorm", kw, dict(num_features=c, **kw), _vars(params))
  if kind in ("LayerNorm2d", "RMSNorm2d"):  # over the channels of an NCHW (or NHWC) input
    shape = options["normalized_shape"]
    if weight is not None:
      c = int(weight.shape[0])
    elif shape is not None:
      c = int(np.atleast_1d(shape)[0])
    elif c is None:
      raise ValueError(f"{kind} without a weight needs normalized_shape (its channels).")
    kw = dict(reduction_axes=channel, feature_axes=channel, epsilon=torch_epsilon(eps, act),
              **common)  # fmt: skip
    module = "RMSNorm" if kind == "RMSNorm2d" else "LayerNorm"
    return TorchNorm(module, kw, dict(num_features=c, **kw), _vars(params))
  if options["normalized_shape"] is not None:
    shape = tuple(int(d) for d in np.atleast_1d(options["normalized_shape"]))
  elif weight is not None:
    shape = tuple(weight.shape)
  else:
    raise ValueError(
      f"{kind} without a weight (elementwise_affine=False) needs normalized_shape=, "
      f"its constructor's first argument."
    )
  features = shape
  for name in ("weight", "bias"):
    have = arrays[name].shape if name in arrays else None
    if have is not None and (len(have) < len(shape) or have[len(have) - len(shape) :] != shape):
      raise ValueError(
        f"{kind}'s {name} has shape {have}, but normalized_shape is {shape}: the weight's "
        f"shape is normalized_shape, or ends with it (a weight per head: Cohere's QK-norm, "
        f"weight (heads, head_dim), normalized_shape=(head_dim,))."
      )
    features = have or features
  axes = tuple(range(-len(shape), 0))
  kw = dict(reduction_axes=axes, feature_axes=tuple(range(-len(features), 0)),
            epsilon=torch_epsilon(eps, act), **common)  # fmt: skip
  nnx_kw = dict(num_features=math.prod(features), **kw)
  module = "RMSNorm" if kind == "RMSNorm" else "LayerNorm"
  return TorchNorm(module, kw, nnx_kw, _vars(params))


def _arrays(kind: str, state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """A layer's entries as NumPy arrays (a None entry counts as missing), each named in
  the error if it cannot be read; parameters and statistics must be floating-point."""
  arrays = {}
  for key, value in state_dict.items():
    if value is None:
      continue
    try:
      arrays[key] = _numpy(value)
    except ValueError as error:
      raise ValueError(f"{kind}'s entry {key!r}: {error}") from None
    floating = jnp.issubdtype(arrays[key].dtype, jnp.inexact)
    if key != "num_batches_tracked" and arrays[key].size and not floating:
      raise ValueError(
        f"{kind}'s entry {key!r} has dtype {arrays[key].dtype}; a norm's parameters and "
        f"statistics are floating-point (PyTorch computes in float32 or wider). Pass the "
        f"float tensor (a quantized checkpoint: dequantize it first)."
      )
  return arrays


def _pointwise(kind, family, arrays, source, channels_first):
  """DyT (the paper's ``DynamicTanh``, Liger's ``LigerDyT``) and ``LocalResponseNorm``."""
  if family == "LocalResponseNorm":
    if source is None:
      raise TypeError(
        "LocalResponseNorm has no state_dict entries to convert from: pass the module "
        "itself, from_torch(model.lrn), whose size, alpha, beta and k are read."
      )
    kw = dict(size=int(source.size), alpha=float(source.alpha), beta=float(source.beta),
              k=float(source.k), channel_axis=1 if channels_first else -1)  # fmt: skip
    return TorchNorm("LocalResponseNorm", kw, dict(kw), {})
  if "alpha" not in arrays:
    raise ValueError(f"{kind}'s state_dict lacks 'alpha', its learned scalar.")
  weight, bias = arrays.get("weight"), arrays.get("bias")
  features = next((v.shape for v in (weight, bias) if v is not None), None)
  alpha, per_feature = arrays["alpha"], arrays["alpha"].size > 1
  if per_feature and (features is None or alpha.squeeze().shape != features):
    raise ValueError(
      f"{kind}'s alpha has shape {alpha.shape}: one value, or one per feature of the "
      f"weight's shape {features}, is what DyT computes with."
    )
  alpha = alpha.reshape(features if per_feature else ())
  params = {"alpha": alpha}
  params.update({k: v for k, v in (("scale", weight), ("bias", bias)) if v is not None})
  # The reference DynamicTanh(channels_last=False) scales channels-first (NCHW) inputs.
  channels_last = bool(getattr(source, "channels_last", True))
  axis = -1 if channels_last or not channels_first else 1
  kw = dict(use_scale=weight is not None, use_bias=bias is not None, feature_axes=axis,
            param_dtype=jnp.dtype(alpha.dtype))  # fmt: skip
  if per_feature:
    kw["alpha_per_feature"] = True
  else:
    kw["alpha_init_value"] = float(alpha)
  if features is None:
    raise ValueError(f"{kind} without weight and bias: build jaxnorm.DyT by hand.")
  return TorchNorm("DyT", kw, dict(num_features=int(features[0]), **kw), _vars(params))


def _features(kind, arrays, num_features):
  """The channel count, from the per-channel arrays (which must agree) or ``num_features``."""
  shapes = {k: a.shape for k, a in arrays.items() if k != "num_batches_tracked"}
  if len(set(shapes.values())) > 1 or any(len(s) != 1 for s in shapes.values()):
    raise ValueError(f"{kind}'s per-channel entries must all have one shape (C,), got {shapes}.")
  if shapes:
    c = int(next(iter(shapes.values()))[0])
    if num_features is not None and int(num_features) != c:
      raise ValueError(f"num_features={num_features}, but {kind}'s arrays have {c} channels.")
    return c
  if num_features is None:
    raise ValueError(
      f"{kind} without weight, bias or running statistics: pass num_features= (the number "
      f"of channels), which the NNX module needs."
    )
  return int(num_features)


def _stats_dtype(arrays, x64):
  """float64 running statistics stay float64 where JAX holds them (x64), else float32."""
  return np.float64 if x64 and arrays["running_mean"].dtype == np.float64 else np.float32


def _vars(params, stats=None):
  out = {}
  if params:
    out["params"] = params
  if stats:
    out["batch_stats"] = stats
  return out


def _batch_norm(arrays, params, common, eps, momentum, channel, torch_training, c, x64):
  if momentum is not None and not 0 <= momentum <= 1:
    raise ValueError(f"momentum must be PyTorch's, in [0, 1] (e.g. 0.1), got {momentum!r}.")
  if "running_mean" not in arrays:
    # track_running_stats=False: batch statistics in training and at evaluation alike;
    # no running averages, so momentum and the variance convention play no part.
    kw = dict(axis=channel, epsilon=torch_epsilon(eps), track_running_stats=False, **common)
    return TorchNorm("BatchNorm", kw, dict(num_features=c, **kw), _vars(params))
  kw = dict(
    axis=channel,
    momentum=None if momentum is None else 1.0 - float(momentum),
    epsilon=torch_epsilon(eps),
    **common,
  )
  if torch_training:
    kw["unbiased_running_var"] = True
  elif momentum is None:
    raise ValueError("momentum=None is PyTorch's cumulative average: keep torch_training=True.")
  stats = {k: arrays[f"running_{k}"].astype(_stats_dtype(arrays, x64)) for k in ("mean", "var")}
  if torch_training:  # PyTorch's counter of updates, kept (momentum=None reads it)
    stats["num_batches_tracked"] = np.asarray(arrays.get("num_batches_tracked", 0), np.int32)
  nnx_kw = dict(num_features=c, **kw)
  return TorchNorm("BatchNorm", kw, nnx_kw, _vars(params, stats))


def norms_from_state_dict(
  state_dict: Any,
  rules: Mapping[str, Any],
  *,
  skip: Collection[str] = (),
  **options: Any,
) -> tuple[dict, dict[str, TorchNorm], list[str]]:
  """Converts every norm of a whole model by name pattern: of the model itself (a PyTorch
  module: each norm with its own ``eps``, ``momentum``, groups, ... read from it), or of
  its ``state_dict``.

  ``rules`` maps a regular expression matching a PyTorch module's whole name (a key without
  its last ``.weight``/``.bias``/...) to ``(kind, flax_path)``: the PyTorch class and the
  Flax path of the module, a match template (``\\1`` or ``\\g<name>`` for the pattern's
  groups, as in ``re.Match.expand``) with ``/`` between names; for a model, ``flax_path``
  alone will do (the kind is the module's own, subclasses and other libraries' norms
  included: :func:`torch_kind`). Other entries (convolutions, linear layers) are left to
  the caller (a Conv kernel ``OIHW`` becomes Flax's ``HWIO`` with ``w.transpose(2, 3, 1,
  0)``, a Linear ``(out, in)`` weight ``w.T``).

  Nothing is skipped silently: a module a rule matches that looks like a norm (running
  statistics, or parameters and "norm" in its class's name) but is none jaxnorm converts
  is an error naming it, unless ``skip`` names it; two modules mapped to one Flax path are
  an error; a norm that applies an activation too (timm's ``BatchNormAct2d``) is converted
  with one warning for the model naming each activation.

  Args:
    state_dict: a PyTorch model (anything with ``named_modules()`` and ``state_dict()``)
      or its ``state_dict`` (a mapping of names to arrays).
    rules: ``{pattern: (kind, flax_path)}``; for a model also ``{pattern: flax_path}``,
      which matches only the model's norm modules (e.g. ``{r"(.*)": r"\\1"}``: every one).
    skip: PyTorch module names (or patterns matching whole names) to leave unconverted;
      their entries stay in ``rest``.
    **options: :func:`from_torch`'s options for every converted layer (with a model,
      only those a module does not hold: ``channels_first``, ``dtype``,
      ``torch_training``).

  Returns:
    ``(variables, layers, rest)``: the norms' Linen variables nested at their Flax paths
    (``{"params": ..., "batch_stats": ...}``), each converted layer by Flax path, and the
    ``state_dict`` keys no rule consumed.

  Raises:
    ValueError: for a matched norm-like module that cannot be converted, two modules
      mapped to one Flax path, or :func:`from_torch`'s errors (naming the module).

  >>> import numpy as np
  >>> sd = {"layer1.0.bn1.weight": np.ones(2), "layer1.0.bn1.bias": np.zeros(2),
  ...       "layer1.0.bn1.running_mean": np.zeros(2), "layer1.0.bn1.running_var": np.ones(2),
  ...       "layer1.0.conv1.weight": np.ones((2, 2, 3, 3))}
  >>> variables, layers, rest = norms_from_state_dict(
  ...   sd, {r"layer(\\d)\\.(\\d)\\.bn(\\d)": ("BatchNorm2d", r"layer\\1_\\2/bn\\3")})
  >>> sorted(variables["params"]["layer1_0"]["bn1"]), rest
  (['bias', 'scale'], ['layer1.0.conv1.weight'])
  """
  channels_first = options.pop("channels_first", True)
  torch_training = options.pop("torch_training", True)
  model = None
  if hasattr(state_dict, "named_modules"):
    model = state_dict
    state_dict = dict(model.state_dict())
    # (remove_duplicate=False: a module registered under two names has keys under both)
    sources: dict[str, Any] = dict(model.named_modules(remove_duplicate=False))
  elif not isinstance(state_dict, Mapping):
    raise TypeError(
      f"norms_from_state_dict takes a PyTorch model (anything with named_modules() and "
      f"state_dict()) or its state_dict (a mapping of names to arrays); got a "
      f"{type(state_dict).__name__} from {type(state_dict).__module__!r}."
    )
  else:
    sources = {}
    for key, value in state_dict.items():
      prefix, _, leaf = key.rpartition(".")
      sources.setdefault(prefix, {})[leaf] = value
  flat: dict[tuple[str, ...], Any] = {}  # (collection, *module path, leaf): value
  layers: dict[str, TorchNorm] = {}
  origin: dict[str, str] = {}  # Flax path: PyTorch name
  used: set[str] = set()
  converting: set[str] = set()  # the rules that converted a module
  for prefix, source in sources.items():
    if any(re.fullmatch(name, prefix) for name in skip):
      continue
    for pattern, rule in rules.items():
      kind, path = rule if isinstance(rule, tuple) else (None, rule)
      match = re.fullmatch(pattern, prefix)
      if match is None:
        continue
      module = not isinstance(source, dict)
      found = torch_kind(source) if module else kind
      if module and found is None and kind is None and not _norm_like(source):
        continue  # a path-only rule matches a model's norms only
      if not module and kind is None:
        raise ValueError(f"rule {pattern!r} needs (kind, flax_path) for a state_dict.")
      if kind is not None and found != kind:
        cls = type(source).__name__
        named = cls if found in (None, cls) else f"{cls} (a {found})"
        raise ValueError(f"{prefix!r} is a {named}, but rule {pattern!r} says {kind}.")
      flax_path = match.expand(path) if isinstance(path, str) else path(prefix)
      if flax_path in origin:
        raise ValueError(
          f"{origin[flax_path]!r} and {prefix!r} both map to the Flax path {flax_path!r}; "
          f"give each module its own path (e.g. the pattern's groups in the template: "
          f"r'bn(\\d)' -> r'bn\\1')."
        )
      if module:
        given = {**_DEFAULTS, "dtype": None, **options}
        layer = _convert(source, None, given, channels_first, torch_training, prefix)
        leaves = list(source.state_dict())
      else:
        layer = from_torch(kind, source, channels_first=channels_first,
                           torch_training=torch_training, **options)  # fmt: skip
        leaves = list(source)
      layers[flax_path], origin[flax_path] = layer, prefix
      for collection, values in layer.variables.items():
        for leaf, value in values.items():
          flat[(collection, *flax_path.split("/"), leaf)] = value
      used.update(f"{prefix}.{leaf}" if prefix else leaf for leaf in leaves)
      converting.add(pattern)
      break
  idle = [p for p in rules if p not in converting]
  if idle:
    what = "norm of the model" if model is not None else "module name of the state_dict"
    warnings.warn(
      f"rule(s) {idle} matched no {what}, so they converted nothing "
      f"({len(layers)} norm(s) converted in all); check each pattern against the names "
      f"(it must match a whole name: {list(sources)[:3]}...).",
      stacklevel=2,
    )
  carried = {origin[p]: layer.activation for p, layer in layers.items() if layer.activation}
  if carried:
    warnings.warn(_activation_message(carried), stacklevel=2)
  lookalikes = {
    origin[p]: layer for p, layer in layers.items() if _lookalike(sources[origin[p]], layer)
  }
  if lookalikes:
    warnings.warn(_lookalike_message(lookalikes, sources), stacklevel=2)
  variables = traverse_util.unflatten_dict(flat)
  return variables, layers, [k for k in state_dict if k not in used]
