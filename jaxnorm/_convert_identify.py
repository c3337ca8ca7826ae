"""Which norm a PyTorch module computes, found by running its ``forward``: for classes
jaxnorm does not know by name (Hugging Face transformers' ``LlamaRMSNorm``,
``GemmaRMSNorm``, ``CohereLayerNorm``, ...) and for look-alikes (a class named
``LayerNorm`` or ``RMSNorm`` from another code base, a ``forward`` replaced on the
instance), whose name says nothing reliable about their maths.

Each candidate form (LayerNorm or RMSNorm; over the trailing axes, over the last axis with
a weight per head, or over the channel axis; ``x·w`` or Gemma's ``x·(1 + w)``; each ε the
module could mean) is converted, run on a probe input beside the module itself, and kept
only if it reproduces it. The probe's rows have a variance of the order of ε and means
far from zero, so a wrong ε, centring, scale or axis differs by 10 % or more, far above
the tolerance of the module's dtype. Nothing here imports torch: a module is run with
torch taken from ``sys.modules``, which holds it wherever a PyTorch module exists.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxnorm._convert_layers import tensor_to_numpy

# Where a class's name says what it computes: PyTorch's, torchvision's and timm's classes.
TRUSTED_PACKAGES = ("torch", "torchvision", "timm")
# ε as transformers' norms name it (LlamaRMSNorm: variance_epsilon; GemmaRMSNorm: eps).
EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps")
# ε a module without an attribute may compute with (OlmoLayerNorm: PyTorch's 1e-5).
UNSTATED_EPS = (1e-5, 1e-6)
# Agreement with the module: float32 rounding (a few ulps of the statistics), or two
# roundings of a 16-bit output. A wrong form differs by 0.1 or more on the probe.
TOLERANCE = {2: 2e-2, 4: 1e-4, 8: 1e-4}


def package(cls: type) -> str:
  """The top-level package that defines ``cls`` (``"torch"``, ``"transformers"``, ...)."""
  return str(getattr(cls, "__module__", "") or "").partition(".")[0]


def runnable(module: Any) -> bool:
  """Whether ``module`` can be run here: a ``torch.nn.Module`` (torch is imported wherever
  one exists), or any other callable with a ``forward`` (the tests' NumPy stand-ins)."""
  torch = sys.modules.get("torch")
  if torch is not None and isinstance(module, torch.nn.Module):
    return True
  return callable(module) and callable(getattr(module, "forward", None))


def extra_inputs(module: Any) -> list[str]:
  """The names of ``forward``'s parameters after the input (Mamba's ``gate``)."""
  try:
    parameters = list(inspect.signature(module.forward).parameters.values())
  except (TypeError, ValueError):
    return []
  kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
  return [p.name for p in parameters[1:] if p.kind not in kinds]


def stated_eps(module: Any) -> float | None:
  """The module's ε, read from the attribute its class keeps it in; None if it has none."""
  for name in EPS_ATTRIBUTES:
    value = getattr(module, name, None)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
      return float(value)
  return None


def candidates(module: Any, arrays: dict[str, np.ndarray]) -> Iterator[tuple[str, str, dict]]:
  """``(description, kind, from_torch options)`` of every form the module may compute."""
  eps_values = (eps,) if (eps := stated_eps(module)) is not None else UNSTATED_EPS
  if set(arrays) == {"weight", "bias", "running_mean", "running_var"}:  # DETR's copies
    for e in eps_values:  # of torchvision's FrozenBatchNorm2d
      yield (
        f"FrozenBatchNorm2d over the channels (axis 1), ε = {e:g}",
        "FrozenBatchNorm2d",
        {"eps": e},
      )
    return
  if not set(arrays) <= {"weight", "bias"}:
    return
  weight, bias = arrays.get("weight"), arrays.get("bias")
  declared = getattr(module, "normalized_shape", None)
  anywide = declared is None and weight is None and bias is None
  if declared is not None:
    shape = tuple(int(d) for d in np.atleast_1d(declared))
  elif weight is not None:
    shape = tuple(weight.shape)
  elif anywide:  # no parameter, no size: it normalizes a last axis of any size
    shape = (16,)
  else:
    return
  last = "the last axis (any size)" if anywide else "the last axis"
  shapes = [(shape, "the trailing axes" if len(shape) > 1 else last)]
  if weight is not None and weight.ndim > 1:  # Cohere's QK-norm: a weight per head
    shapes.append((shape[-1:], f"the last axis, a weight per {weight.shape[:-1]}"))
  forms: list[tuple[str, dict, str]] = [("LayerNorm", {}, "")]
  if bias is None:
    forms.append(("RMSNorm", {}, ", x·w" if weight is not None else ""))
  if weight is not None and bias is None:
    forms.append(("RMSNorm", {"zero_centered_scale": True}, ", x·(1 + w)"))
  for e in eps_values:
    for kind, extra, scale in forms:
      for normalized, over in shapes:
        options = dict(eps=e, normalized_shape=normalized, **extra)
        yield f"{kind} over {over}{scale}, ε = {e:g}", kind, options
      if len(shape) == 1 and not anywide:  # ConvNeXt's channels-first LayerNorm (NCHW),
        for spatial, layout in ((2, "NCHW"), (1, "NCL")):  # SqueezeBERT's (NCL)
          options = dict(eps=e, normalized_shape=shape, spatial=spatial, **extra)
          yield (
            f"{kind} over the channels (axis 1 of {layout}){scale}, ε = {e:g}",
            kind + "2d",
            options,
          )


def probe(shape: tuple[int, ...], eps: float) -> np.ndarray:
  """The probe input: ``x[0]`` of mean 1 and scale 1, ``x[1]`` of a variance 4ε (so ε
  moves its output by 10 % or more), the rest in between."""
  rng = np.random.default_rng(0)
  x = rng.normal(0.0, 1.0, shape)
  scales = np.geomspace(1.0, 2 * math.sqrt(max(eps, 1e-12)), shape[0])
  return (x + 1.0) * scales.reshape((-1,) + (1,) * (len(shape) - 1))


def probe_shape(kind: str, arrays: dict[str, np.ndarray], options: dict) -> tuple[int, ...]:
  """A PyTorch-layout input for the form: ``(2, k, *weight's shape)`` for the trailing
  norms (LayerNorm, RMSNorm), ``(2, C, *spatial)`` for the others (``h, w`` for the 2d
  ones); ``k`` and the spatial sizes differ from every size of the weight, so a module
  that normalizes other axes fails or differs."""
  weight = arrays.get("weight")
  if kind in ("LayerNorm", "RMSNorm"):
    sizes = tuple(weight.shape) if weight is not None else tuple(options["normalized_shape"])
    return (2, next(n for n in (3, 5, 7, 11, 13) if n not in sizes), *sizes)
  channels = [a.shape[0] for a in arrays.values() if np.ndim(a) == 1]
  c = int(channels[0] if channels else options.get("num_features") or 6)
  spatial = options.get("spatial") or (
    1 if kind.endswith("1d") else 3 if kind.endswith("3d") else 2
  )
  return (2, c, *[n for n in (3, 5, 7, 11) if n != c][:spatial])


def run_torch(module: Any, x: np.ndarray, dtype: Any) -> np.ndarray:
  """``module(x)`` in evaluation mode (restored after; no gradients), as float64."""
  torch = sys.modules.get("torch")
  if torch is None or not isinstance(module, torch.nn.Module):
    return np.asarray(module(x.astype(dtype)), np.float64)  # a NumPy stand-in
  held = next(iter([*module.parameters(), *module.buffers()]), None)  # (a GPU module)
  device = held.device if held is not None else "cpu"
  tensor = torch.from_numpy(np.asarray(x, np.float32)).to(
    device, getattr(torch, jnp.dtype(dtype).name)
  )
  modes = [(m, m.training) for m in module.modules()]
  module.train(False)
  try:
    with torch.no_grad():
      y = module(tensor)
  finally:
    for m, mode in modes:
      m.training = mode
  return np.asarray(tensor_to_numpy(y), np.float64)


def run_jax(layer: Any, x: np.ndarray, dtype: Any, channels_last: bool) -> np.ndarray:
  """The converted layer on ``x`` (PyTorch's layout; moved to channels-last and back
  where the layer takes it so), as float64."""
  inputs = jnp.asarray(x, dtype)
  if channels_last:
    inputs = jnp.moveaxis(inputs, 1, -1)
  kwargs = {"use_running_average": True} if "batch_stats" in layer.variables else {}
  y = layer.linen().apply(layer.variables, inputs, **kwargs)
  y = y[0] if isinstance(y, tuple) else y
  if channels_last:
    y = jnp.moveaxis(y, -1, 1)
  return np.asarray(y, np.float64)


def difference(module: Any, layer: Any, x: np.ndarray, dtype: Any, channels_last: bool) -> float:
  """``max|jaxnorm − torch| / max|torch|`` on ``x``; inf where the module fails on it or
  gives another shape (it normalizes other axes)."""
  try:
    want = run_torch(module, x, dtype)
  except Exception:  # the module refuses this layout: it is not this form
    return math.inf
  got = run_jax(layer, x, dtype, channels_last)
  if want.shape != got.shape or not np.all(np.isfinite(want)):
    return math.inf
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def identify(
  module: Any,
  arrays: dict[str, np.ndarray],
  build: Callable[[str, dict], Any],
  channels_first: bool,
  named: tuple[str, str, dict] | None = None,
) -> tuple[Any, str, dict[str, float]]:
  """The converted layer that reproduces ``module`` on the probe, with its description;
  ``(None, "", tried)`` if none does (``tried``: each form's difference).

  ``build(kind, options)`` converts the module's ``arrays`` as ``kind`` with ``from_torch``
  options (it raises ``ValueError`` for a form the arrays cannot have); ``named``, the
  form the class's name says (a PyTorch class whose ``forward`` is replaced), is tried
  first."""
  floats = [a for a in arrays.values() if jnp.issubdtype(a.dtype, jnp.floating)]
  dtype = jnp.dtype(floats[0].dtype if floats else jnp.float32)
  tolerance = TOLERANCE.get(dtype.itemsize, 1e-4)
  tried: dict[str, float] = {}
  best: tuple[float, Any, str] | None = None
  forms = [named] if named is not None else []
  for description, kind, options in [*forms, *candidates(module, arrays)]:
    try:
      layer = build(kind, options)
    except ValueError:
      continue
    eps = float(layer.kwargs.get("epsilon", options.get("eps") or 1e-5))
    x = probe(probe_shape(kind, arrays, options), eps)
    channels_last = kind not in ("LayerNorm", "RMSNorm") and not channels_first
    tried[description] = difference(module, layer, x, dtype, channels_last)
    if tried[description] <= tolerance and (best is None or tried[description] < best[0]):
      best = (tried[description], layer, description)
  if best is None:
    return None, "", tried
  return best[1], best[2], tried
