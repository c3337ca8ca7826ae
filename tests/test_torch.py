"""PyTorch import against PyTorch's own numbers: fixtures written by tools/torch_fixtures.py
(PyTorch is not needed to run these tests). Each converted layer must give PyTorch's
outputs in training and evaluation and, for BatchNorm, PyTorch's running statistics after
every training step (unbiased variance, momentum conversion, cumulative average)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import convert
from tests import reference as ref

FIXTURES = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "torch_norms.npz"))

# case: (PyTorch class, from_torch options). The fixtures' activations have a variance
# about ε (tools/torch_fixtures.py): a wrong ε, momentum or axis is off by far more than
# the tolerances below.
CASES = {
  "bn1d": ("BatchNorm1d", {}),
  "bn1d_seq": ("BatchNorm1d", dict(eps=1e-3, momentum=0.3)),
  "bn2d": ("BatchNorm2d", {}),
  "bn2d_cumulative": ("BatchNorm2d", dict(momentum=None)),
  "bn2d_no_stats": ("BatchNorm2d", {}),  # (its weight's shape gives num_features)
  "ln_chw": ("LayerNorm", {}),
  "ln_d": ("LayerNorm", dict(eps=1e-6)),
  "ln2d": ("LayerNorm2d", dict(eps=1e-6)),
  "gn": ("GroupNorm", dict(num_groups=2)),
  "in2d": ("InstanceNorm2d", dict(num_features=3)),
  "in2d_affine_stats": ("InstanceNorm2d", {}),
  "rms_f32": ("RMSNorm", dict(eps=None)),
  "rms_bf16": ("RMSNorm", dict(eps=None, dtype=jnp.bfloat16)),
  "rms_f16": ("RMSNorm", dict(eps=None, dtype=jnp.float16)),
  "rms_f64": ("RMSNorm", dict(eps=None, dtype=jnp.float64)),
}


def _case(name, part):
  prefix = f"{name}/{part}/"
  return {k[len(prefix) :]: FIXTURES[k] for k in FIXTURES.files if k.startswith(prefix)}


def _dtype(name):
  return jnp.dtype(str(FIXTURES[f"{name}/dtype"]))


def _tol(name):
  if _dtype(name).itemsize == 2:  # half precision: its output rounding
    return dict(rtol=2e-2, atol=2e-2)
  return dict(rtol=1e-5, atol=2e-5)


def _x64(name):
  """float64 cases run with jax_enable_x64 (else JAX holds float32)."""
  return jax.enable_x64(_dtype(name) == jnp.float64)


@pytest.mark.parametrize("name", list(CASES))
def test_fixtures_can_tell_a_wrong_epsilon(name):
  """The fixtures' activations make ε visible: the same layer converted with a wrong ε (ten
  times PyTorch's; for RMSNorm(eps=None) in half precision, the half type's own machine
  epsilon, as jaxnorm once took) is off PyTorch's output by far more than the tolerance."""
  kind, options = CASES[name]
  dtype = _dtype(name)
  eps = convert.torch_epsilon(options.get("eps", 1e-5), dtype)
  wrong = float(jnp.finfo(dtype).eps) if dtype.itemsize == 2 and "eps" in options else 10 * eps
  with _x64(name):
    layer = convert.from_torch(kind, _case(name, "init"), **{**options, "eps": wrong})
    data = _case(name, "train0")
    has_stats = "batch_stats" in layer.variables
    kw = dict(use_running_average=False, mutable=["batch_stats"]) if has_stats else {}
    y = layer.linen().apply(layer.variables, jnp.asarray(data["x"], dtype), **kw)
    y = y[0] if isinstance(y, tuple) else y
    error = np.abs(np.asarray(y, np.float64) - data["y"]).max()
  assert error > 10 * _tol(name)["atol"], (name, error)


@pytest.mark.parametrize("name", list(CASES))
def test_linen_layer_reproduces_pytorch(name):
  with _x64(name):
    _linen_reproduces_pytorch(name)


def _linen_reproduces_pytorch(name):
  kind, options = CASES[name]
  layer = convert.from_torch(kind, _case(name, "init"), **options)
  module, variables = layer.linen(), layer.variables
  dtype = _dtype(name)
  has_stats = "batch_stats" in variables
  for step in range(3):
    data = _case(name, f"train{step}")
    x = jnp.asarray(data["x"], dtype)
    if has_stats:
      y, upd = module.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
      variables = {**variables, **upd}
      stats = variables["batch_stats"]
      scale = np.abs(data["running_var"]).max()  # (the fixtures' statistics are small)
      np.testing.assert_allclose(stats["mean"], data["running_mean"], rtol=1e-5, atol=1e-6 * scale)
      np.testing.assert_allclose(stats["var"], data["running_var"], rtol=1e-5, atol=1e-6 * scale)
      if not kind.startswith("InstanceNorm"):  # (PyTorch's stays 0 there; nothing reads it)
        assert int(stats["num_batches_tracked"]) == int(data["num_batches_tracked"])
    else:
      y = module.apply(variables, x)
    assert y.dtype == dtype
    np.testing.assert_allclose(np.asarray(y, np.float32), data["y"], **_tol(name))
  data = _case(name, "eval")
  kw = dict(use_running_average=True) if has_stats else {}
  y = module.apply(variables, jnp.asarray(data["x"], dtype), **kw)
  np.testing.assert_allclose(np.asarray(y, np.float32), data["y"], **_tol(name))


@pytest.mark.parametrize(
  "name",
  ["bn2d", "bn2d_cumulative", "bn2d_no_stats", "ln_chw", "ln2d", "gn", "in2d_affine_stats",
   "rms_bf16", "rms_f16"],
)  # fmt: skip
def test_nnx_layer_reproduces_pytorch(name):
  kind, options = CASES[name]
  module = convert.from_torch(kind, _case(name, "init"), **options).nnx(nnx.Rngs(0))
  dtype = _dtype(name)
  for step in range(3):
    data = _case(name, f"train{step}")
    y = module(jnp.asarray(data["x"], dtype))
    np.testing.assert_allclose(np.asarray(y, np.float32), data["y"], **_tol(name))
  if getattr(module, "mean", None) is not None:
    np.testing.assert_allclose(module.var[...], data["running_var"], rtol=1e-5, atol=1e-12)
    if not kind.startswith("InstanceNorm"):
      assert int(module.num_batches_tracked[...]) == int(data["num_batches_tracked"])
  module.eval()
  data = _case(name, "eval")
  y = module(jnp.asarray(data["x"], dtype))
  np.testing.assert_allclose(np.asarray(y, np.float32), data["y"], **_tol(name))


def test_conventions_in_the_converted_arguments():
  bn = convert.from_torch("BatchNorm2d", _case("bn2d", "init"))
  assert bn.kwargs["momentum"] == pytest.approx(0.9) and bn.kwargs["axis"] == 1
  assert bn.kwargs["epsilon"] == 1e-5 and bn.kwargs["unbiased_running_var"]
  assert int(bn.variables["batch_stats"]["num_batches_tracked"]) == 0  # kept
  for name in ("rms_bf16", "rms_f16"):  # PyTorch computes in float32, with its epsilon
    rms = convert.from_torch("RMSNorm", _case(name, "init"), eps=None, dtype=_dtype(name))
    assert rms.kwargs["epsilon"] == pytest.approx(1.1920929e-07)
  assert convert.from_torch("RMSNorm", _case("rms_f32", "init"), eps=None).kwargs[
    "epsilon"
  ] == pytest.approx(1.1920929e-07)
  ln = convert.from_torch("LayerNorm", _case("ln_chw", "init"))
  assert ln.kwargs["epsilon"] == 1e-5 and ln.kwargs["reduction_axes"] == (-3, -2, -1)
  nhwc = convert.from_torch("GroupNorm", _case("gn", "init"), num_groups=2, channels_first=False)
  assert nhwc.kwargs["feature_axis"] == -1
  flax_way = convert.from_torch("BatchNorm2d", _case("bn2d", "init"), torch_training=False)
  assert "unbiased_running_var" not in flax_way.kwargs


def _module(kind, state_dict, **attributes):
  """A stand-in for a PyTorch module, as from_torch reads one (duck-typed: its class name,
  ``state_dict()``, its constructor's attributes; no parameters to take a dtype from)."""
  methods = dict(
    state_dict=lambda self: dict(state_dict),
    parameters=lambda self: [],
    buffers=lambda self: [],
    named_modules=lambda self: [],
    __module__="torch.nn.modules",  # (PyTorch's class, as convert tells one)
  )
  module = type(kind, (), methods)()
  for name, value in attributes.items():
    setattr(module, name, value)
  return module


@pytest.mark.parametrize(
  "name, attributes",
  [
    ("bn1d_seq", dict(eps=1e-3, momentum=0.3, affine=True, track_running_stats=True)),
    (
      "bn2d_no_stats",
      dict(eps=1e-5, momentum=0.1, affine=True, track_running_stats=False, num_features=3),
    ),  # fmt: skip
    ("ln2d", dict(eps=1e-6, normalized_shape=(4,), elementwise_affine=True)),
    ("gn", dict(eps=1e-5, num_groups=2, num_channels=6, affine=True)),
  ],
)
def test_a_module_object_brings_its_own_arguments(name, attributes):
  """from_torch(module) reads eps, momentum, groups from the module: nothing copied by hand
  (the array form with the defaults would be wrong for these cases: eps=1e-3, momentum=0.3,
  eps=1e-6, num_groups)."""
  kind, options = CASES[name]
  module = _module(kind, _case(name, "init"), **attributes)
  layer = convert.from_torch(module)
  by_hand = convert.from_torch(kind, _case(name, "init"), **options)
  assert (layer.module, layer.kwargs, layer.nnx_kwargs) == by_hand[:3]
  data = _case(name, "train0")
  kw = dict(use_running_average=False) if layer.module == "BatchNorm" else {}
  if "batch_stats" in layer.variables:
    kw["mutable"] = ["batch_stats"]
  y = layer.linen().apply(layer.variables, jnp.asarray(data["x"]), **kw)
  y = y[0] if isinstance(y, tuple) else y
  np.testing.assert_allclose(y, data["y"], **_tol(name))


def test_module_attributes_that_contradict_the_state_dict_are_refused():
  init = _case("bn2d", "init")
  with pytest.raises(ValueError, match="track_running_stats=False but its state_dict has"):
    convert.from_torch(_module("BatchNorm2d", init, eps=1e-5, momentum=0.1,
                               track_running_stats=False))  # fmt: skip
  with pytest.raises(ValueError, match="affine=True but its state_dict lacks 'weight'"):
    convert.from_torch(_module("BatchNorm2d", {}, eps=1e-5, affine=True, num_features=3))
  with pytest.raises(TypeError, match="from the module itself; got a state_dict"):
    convert.from_torch(_module("BatchNorm2d", init), init)
  with pytest.raises(TypeError, match=r"from the module itself; got \['eps'\]"):
    convert.from_torch(_module("BatchNorm2d", init, eps=1e-3), eps=1e-4)


def test_a_whole_model_with_each_norms_own_arguments():
  model = _module("Net", {})
  bn = _module("BatchNorm2d", _case("bn1d_seq", "init"), eps=1e-3, momentum=0.3)
  gn = _module("GroupNorm", _case("gn", "init"), eps=1e-5, num_groups=2)
  conv = _module("Conv2d", {"weight": np.ones((4, 4, 1, 1))})
  model.named_modules = lambda remove_duplicate=True: [("", model), ("0", conv), ("1", bn),
                                                       ("2", gn)]  # fmt: skip
  model.state_dict = lambda: {
    "0.weight": conv.state_dict()["weight"],
    **{f"1.{k}": v for k, v in bn.state_dict().items()},
    **{f"2.{k}": v for k, v in gn.state_dict().items()},
  }
  variables, layers, rest = convert.norms_from_state_dict(model, {r"(\d)": r"norm\1"})
  assert rest == ["0.weight"] and sorted(layers) == ["norm1", "norm2"]
  assert layers["norm1"].kwargs["epsilon"] == 1e-3
  assert layers["norm1"].kwargs["momentum"] == pytest.approx(0.7)
  assert layers["norm2"].kwargs["num_groups"] == 2
  with pytest.raises(ValueError, match="is a GroupNorm, but rule"):
    convert.norms_from_state_dict(model, {r"2": ("BatchNorm2d", "norm")})


def test_clear_errors():
  with pytest.raises(ValueError, match="kind must be one of"):
    convert.from_torch("BatchNorm", {})
  with pytest.raises(ValueError, match="num_groups"):
    convert.from_torch("GroupNorm", _case("gn", "init"))
  with pytest.raises(ValueError, match="PyTorch's, in"):
    convert.from_torch("BatchNorm2d", _case("bn2d", "init"), momentum=0.99 + 1)


def _without(name, key):
  return {k: v for k, v in _case(name, "init").items() if k != key}


@pytest.mark.parametrize(
  "kind, state_dict, options, message",
  [
    ("BatchNorm2d", _without("bn2d", "running_var"), {}, "has 'running_mean' but no 'running_var'"),
    ("BatchNorm2d", _without("bn2d", "running_mean"), {}, "has 'running_var' but no"),
    ("BatchNorm2d", _without("bn2d", "bias"), {}, "has 'weight' but no 'bias'"),
    ("BatchNorm2d", {**_case("bn2d", "init"), "bias": None}, {}, "has 'weight' but no 'bias'"),
    ("GroupNorm", _without("gn", "weight"), dict(num_groups=2), "has 'bias' but no 'weight'"),
    ("BatchNorm2d", {**_case("bn2d", "init"), "conv.weight": np.ones(3)}, {},
     r"unexpected entries \['conv.weight'\]"),
    ("RMSNorm", {"weight": np.ones(4), "bias": np.ones(4)}, {}, r"unexpected entries \['bias'\]"),
    ("LayerNorm", {}, {}, "needs normalized_shape="),
    ("LayerNorm", {"bias": np.ones(4)}, {}, "has 'bias' but no 'weight'"),
    ("LayerNorm", {"weight": np.ones(4)}, dict(normalized_shape=5),
     r"weight has shape \(4,\), but normalized_shape is \(5,\)"),
    ("BatchNorm2d", {"weight": np.ones(3), "bias": np.ones(4)}, {}, "must all have one shape"),
    ("BatchNorm2d", {}, {}, "pass num_features="),
    ("BatchNorm2d", _case("bn2d", "init"), dict(num_features=4), "arrays have 3 channels"),
  ],
)  # fmt: skip
def test_partial_or_foreign_state_dicts_are_refused_by_key(kind, state_dict, options, message):
  with pytest.raises(ValueError, match=message):
    convert.from_torch(kind, state_dict, **options)


def test_a_layer_without_running_statistics_needs_no_mutable_and_no_mode():
  """BatchNorm2d(track_running_stats=False): batch statistics in both modes, no variables to
  update (Linen applies it without ``mutable``), nothing placeholder-valued to fold."""
  layer = convert.from_torch("BatchNorm2d", _case("bn2d_no_stats", "init"))
  assert "batch_stats" not in layer.variables and layer.nnx_kwargs["num_features"] == 3
  data = _case("bn2d_no_stats", "eval")  # PyTorch's eval(): batch statistics too
  for kw in ({}, dict(use_running_average=True)):
    y = layer.linen().apply(layer.variables, jnp.asarray(data["x"]), **kw)
    np.testing.assert_allclose(y, data["y"], **_tol("bn2d_no_stats"))
  # An empty state_dict is a BatchNorm2d(3, affine=False, track_running_stats=False).
  bare = convert.from_torch("BatchNorm2d", {}, num_features=3)
  assert bare.variables == {} and bare.nnx_kwargs["num_features"] == 3


def test_whole_model_state_dict_by_pattern():
  init = _case("bn2d", "init")
  state_dict = {f"layer1.0.bn1.{k}": v for k, v in init.items()}
  state_dict |= {f"layer1.1.bn2.{k}": v for k, v in init.items()}
  state_dict["layer1.0.conv1.weight"] = np.ones((3, 3, 3, 3), np.float32)
  variables, layers, rest = convert.norms_from_state_dict(
    state_dict, {r"layer(\d)\.(\d)\.bn(\d)": ("BatchNorm2d", r"layer\1_\2/BatchNorm_\3")}
  )
  assert rest == ["layer1.0.conv1.weight"]
  assert sorted(layers) == ["layer1_0/BatchNorm_1", "layer1_1/BatchNorm_2"]
  bn2 = variables["params"]["layer1_1"]["BatchNorm_2"]
  np.testing.assert_array_equal(bn2["scale"], init["weight"])
  np.testing.assert_array_equal(
    variables["batch_stats"]["layer1_0"]["BatchNorm_1"]["var"], init["running_var"]
  )
  # The converted sub-tree runs as is.
  x = jnp.asarray(_case("bn2d", "eval")["x"])
  sub = {c: tree["layer1_0"]["BatchNorm_1"] for c, tree in variables.items()}
  y = layers["layer1_0/BatchNorm_1"].linen().apply(sub, x, use_running_average=True)
  expected = ref.batch_norm_eval(x, init["running_mean"], init["running_var"], init["weight"],
                                 init["bias"], axis=1)  # fmt: skip
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=2e-5)


def test_unbiased_running_variance_uses_the_global_valid_count():
  mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  x = np.random.default_rng(0).normal(2.0, 3.0, (32, 3)).astype(np.float32)
  mask = np.zeros((32, 1), bool)
  for dev, c in enumerate([4, 1, 0, 3, 2, 4, 0, 1]):
    mask[dev * 4 : dev * 4 + c] = True
  bn = jaxnorm.BatchNorm(momentum=0.0, axis_name="d", unbiased_running_var=True)
  variables = bn.init(jax.random.key(0), x[:4], use_running_average=True)

  def step(v, x, m):
    return bn.apply(v, x, use_running_average=False, mask=m, mutable=["batch_stats"])[1]

  specs = dict(in_specs=(P(), P("d"), P("d")), out_specs=P())
  with jax.set_mesh(mesh):
    args = [jax.device_put(a, NamedSharding(mesh, P("d"))) for a in (x, mask)]
    stats = jax.jit(jax.shard_map(step, mesh=mesh, **specs))(variables, *args)["batch_stats"]
  valid = x[mask[:, 0]]  # 15 rows over 8 devices: n/(n - 1) with n = 15, not per device
  np.testing.assert_allclose(stats["var"], valid.var(0, ddof=1), rtol=1e-5)
  np.testing.assert_allclose(stats["mean"], valid.mean(0), rtol=1e-5)


def test_only_batch_norm_goes_without_running_statistics():
  x = jnp.ones((4, 3))
  with pytest.raises(ValueError, match="FrozenBatchNorm needs running statistics"):
    jaxnorm.FrozenBatchNorm(track_running_stats=False).init(jax.random.key(0), x)
  for cls in (jaxnorm.nnx.FrozenBatchNorm, jaxnorm.nnx.BatchRenorm):
    with pytest.raises(ValueError, match=f"{cls.__name__} needs running statistics"):
      cls(3, track_running_stats=False, rngs=nnx.Rngs(0))
