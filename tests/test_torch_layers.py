"""PyTorch import of weight-normalized and spectral-normalized layers (both PyTorch APIs),
DyT and LocalResponseNorm, against PyTorch's own numbers (tools/torch_layer_fixtures.py),
without torch: stand-ins with PyTorch's class names, attributes, parametrizations or hooks,
and the fixtures' state. Linen and NNX must give PyTorch's training output, spectral
normalization PyTorch's next ``u``, and (from a converged state) its evaluation output."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import convert
from tests.test_torch_models import Module

FIXTURES = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "torch_layers.npz"))
CASES = sorted({k.split("/")[0] for k in FIXTURES.files})


class Linear(Module): ...


class Conv2d(Module): ...


class DynamicTanh(Module): ...


class LocalResponseNorm(Module):
  __module__ = "torch.nn.modules.normalization"  # (PyTorch's, as convert tells a class)


class _WeightNorm: ...


class _SpectralNorm: ...


class WeightNorm: ...


class SpectralNorm: ...


_CLASSES = {c.__name__: c for c in (Linear, Conv2d, DynamicTanh, LocalResponseNorm)}
_REPARAM = {c.__name__: c for c in (_WeightNorm, _SpectralNorm, WeightNorm, SpectralNorm)}


class _Listed:
  def __init__(self, weight):
    self.weight = weight


def _stand_in(case, part="state"):
  """The PyTorch module of ``case`` as jaxnorm.convert sees it, with the ``part`` state."""
  config = json.loads(str(FIXTURES[f"{case}/config"]))
  prefix = f"{case}/{part}/"
  state = {k[len(prefix) :]: FIXTURES[k] for k in FIXTURES.files if k.startswith(prefix)}
  name = config["class"].removeprefix("Parametrized")
  base = _CLASSES[name]
  cls = base if name == config["class"] else type(config["class"], (base,), {})
  attributes = dict(config["attributes"])
  reparam = config.get("reparam")
  if reparam is not None:
    settings = _REPARAM[reparam["class"]]()
    settings.name = "weight"
    for key in ("dim", "n_power_iterations", "eps"):
      if key in reparam:
        setattr(settings, key, reparam[key])
    if reparam["api"] == "param":
      attributes["parametrizations"] = _Listed([settings])
    else:
      attributes["_forward_pre_hooks"] = {0: settings}
  return cls(state, **attributes)


def _channels_last(a):
  return np.moveaxis(a, 1, -1) if a.ndim == 4 else a


WRAPPED = [c for c in CASES if c.startswith(("wn_", "sn_"))]


@pytest.mark.parametrize("case", WRAPPED)
def test_training_output_and_state_are_pytorch_s(case):
  """From the state PyTorch starts with; the parametrization API's spectral norm steps u
  before v (Flax: v, then u), so its output is compared from a converged state."""
  part, output = ("converged", "y_train_converged") if case.startswith("sn_param") else (
    "state", "y_train")  # fmt: skip
  layer = convert.wrapped_from_torch(_stand_in(case, part))
  x = _channels_last(FIXTURES[f"{case}/x"])  # Flax's Conv is channels-last
  want = _channels_last(FIXTURES[f"{case}/{output}"])
  # float32 rounding; from a converged state also the iteration's last progress (~1e-6).
  tol = (1e-6 if part == "state" else 5e-6) * max(1.0, np.abs(want).max())
  module = layer.linen()
  if layer.wrapper == "SpectralNorm":
    y, updates = module.apply(layer.variables, x, update_stats=True, mutable=["batch_stats"])
    if part == "state":
      u = updates["batch_stats"]["layer_instance/kernel/u"]
      np.testing.assert_allclose(u[0], FIXTURES[f"{case}/u_after"], atol=1e-6)
  else:
    y = module.apply(layer.variables, x)
  np.testing.assert_allclose(y, want, atol=tol)
  # NNX, with the same values loaded (and the same step taken).
  np.testing.assert_allclose(layer.nnx(nnx.Rngs(0))(x), want, atol=tol)


@pytest.mark.parametrize("case", [c for c in WRAPPED if c.startswith("sn_param")])
def test_next_u_is_pytorch_s_from_its_first_state(case):
  layer = convert.wrapped_from_torch(_stand_in(case))
  x = _channels_last(FIXTURES[f"{case}/x"])
  _, updates = layer.linen().apply(layer.variables, x, update_stats=True, mutable=["batch_stats"])
  u = updates["batch_stats"]["layer_instance/kernel/u"]
  np.testing.assert_allclose(u[0], FIXTURES[f"{case}/u_after"], atol=1e-6)


@pytest.mark.parametrize("case", [c for c in WRAPPED if c.startswith("sn_")])
def test_evaluation_from_a_converged_state_is_pytorch_s(case):
  layer = convert.wrapped_from_torch(_stand_in(case, "converged"))
  x = _channels_last(FIXTURES[f"{case}/x"])
  want = _channels_last(FIXTURES[f"{case}/y_eval"])
  y = layer.linen().apply(layer.variables, x, update_stats=False)
  np.testing.assert_allclose(y, want, atol=5e-6 * max(1.0, np.abs(want).max()))
  # sigma is PyTorch's uᵀWv, the largest singular value once converged.
  prefix = f"{case}/converged/"
  weight = next(FIXTURES[k] for k in FIXTURES.files
                if k.startswith(prefix) and k.endswith(("orig", "original")))  # fmt: skip
  top = np.linalg.svd(weight.reshape(weight.shape[0], -1), compute_uv=False)[0]
  np.testing.assert_allclose(layer.variables["batch_stats"]["layer_instance/kernel/sigma"], top,
                             rtol=1e-5)  # fmt: skip


def test_weight_norm_settings():
  whole = convert.wrapped_from_torch(_stand_in("wn_hook_conv_whole"))
  assert whole.kwargs["feature_axes"] is None  # PyTorch's dim=None: one norm
  conv = convert.wrapped_from_torch(_stand_in("wn_param_conv"))
  assert conv.layer_kwargs["strides"] == (2, 2) and conv.layer_kwargs["padding"] == [(1, 1)] * 2
  assert conv.variables["params"]["layer_instance"]["kernel"].shape == (3, 3, 3, 5)  # HWIO


@pytest.mark.parametrize("case", ["dyt_last", "dyt_first", "lrn"])
def test_dyt_and_local_response_norm(case):
  layer = convert.from_torch(_stand_in(case))
  x, want = FIXTURES[f"{case}/x"], FIXTURES[f"{case}/y_train"]
  np.testing.assert_allclose(layer.linen().apply(layer.variables, x), want, atol=1e-6)
  np.testing.assert_allclose(layer.nnx(nnx.Rngs(0))(x), want, atol=1e-6)


def test_errors_name_the_fix():
  plain = Linear({"weight": np.ones((4, 6)), "bias": np.zeros(4)}, in_features=6, out_features=4)
  with pytest.raises(ValueError, match="no weight_norm or spectral_norm"):
    convert.wrapped_from_torch(plain)
  with pytest.raises(ValueError, match="converts weight-normalized or spectral-normalized"):
    convert.wrapped_from_torch(DynamicTanh({}))
  with pytest.raises(TypeError, match="pass the module"):
    convert.from_torch("LocalResponseNorm", {})
  with pytest.raises(ValueError, match="lacks 'alpha'"):
    convert.from_torch("DynamicTanh", {"weight": np.ones(3), "bias": np.zeros(3)})


class _SharedTensor:
  """A stand-in tensor whose ``numpy()`` shares its memory, as ``torch.Tensor.numpy()``."""

  def __init__(self, array):
    self.array, self.dtype = array, "torch.float32"

  def detach(self):
    return self

  def cpu(self):
    return self

  def numpy(self):
    return self.array


def test_converted_values_are_copies():
  """PyTorch updates running statistics and power-iteration vectors in place; a converted
  layer must not change when the PyTorch one trains on."""
  mean = np.zeros(3, np.float32)
  state = {"weight": np.ones(3), "bias": np.zeros(3), "running_mean": _SharedTensor(mean),
           "running_var": np.ones(3, np.float32)}  # fmt: skip
  layer = convert.from_torch("BatchNorm1d", state)
  mean += 5.0  # PyTorch's next training step, in place
  np.testing.assert_array_equal(layer.variables["batch_stats"]["mean"], 0.0)
  assert jnp.asarray(layer.variables["batch_stats"]["mean"]).dtype == jnp.float32
