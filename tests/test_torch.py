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

# case: (PyTorch class, from_torch options)
CASES = {
  "bn1d": ("BatchNorm1d", {}),
  "bn1d_seq": ("BatchNorm1d", dict(eps=1e-3, momentum=0.3)),
  "bn2d": ("BatchNorm2d", {}),
  "bn2d_cumulative": ("BatchNorm2d", dict(momentum=None)),
  "ln_chw": ("LayerNorm", {}),
  "ln_d": ("LayerNorm", dict(eps=1e-6)),
  "gn": ("GroupNorm", dict(num_groups=2)),
  "in2d": ("InstanceNorm2d", dict(num_features=3)),
  "in2d_affine_stats": ("InstanceNorm2d", {}),
  "rms_f32": ("RMSNorm", dict(eps=None)),
  "rms_bf16": ("RMSNorm", dict(eps=None, dtype=jnp.bfloat16)),
}


def _case(name, part):
  prefix = f"{name}/{part}/"
  return {k[len(prefix) :]: FIXTURES[k] for k in FIXTURES.files if k.startswith(prefix)}


def _dtype(name):
  return jnp.dtype(str(FIXTURES[f"{name}/dtype"]))


def _tol(name):
  return dict(rtol=2e-2, atol=2e-2) if _dtype(name) == jnp.bfloat16 else dict(rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_linen_layer_reproduces_pytorch(name):
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
      np.testing.assert_allclose(stats["mean"], data["running_mean"], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(stats["var"], data["running_var"], rtol=1e-5, atol=1e-6)
      if "num_batches_tracked" in stats:
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
  "name", ["bn2d", "bn2d_cumulative", "ln_chw", "gn", "in2d_affine_stats", "rms_bf16"]
)
def test_nnx_layer_reproduces_pytorch(name):
  kind, options = CASES[name]
  module = convert.from_torch(kind, _case(name, "init"), **options).nnx(nnx.Rngs(0))
  dtype = _dtype(name)
  for step in range(3):
    data = _case(name, f"train{step}")
    y = module(jnp.asarray(data["x"], dtype))
    np.testing.assert_allclose(np.asarray(y, np.float32), data["y"], **_tol(name))
  if hasattr(module, "mean"):
    np.testing.assert_allclose(module.var[...], data["running_var"], rtol=1e-5, atol=1e-6)
    module.eval()
  data = _case(name, "eval")
  y = module(jnp.asarray(data["x"], dtype))
  np.testing.assert_allclose(np.asarray(y, np.float32), data["y"], **_tol(name))


def test_conventions_in_the_converted_arguments():
  bn = convert.from_torch("BatchNorm2d", _case("bn2d", "init"))
  assert bn.kwargs["momentum"] == pytest.approx(0.9) and bn.kwargs["axis"] == 1
  assert bn.kwargs["epsilon"] == 1e-5 and bn.kwargs["unbiased_running_var"]
  assert "num_batches_tracked" not in bn.variables["batch_stats"]  # only with momentum=None
  rms = convert.from_torch("RMSNorm", _case("rms_bf16", "init"), eps=None, dtype=jnp.bfloat16)
  assert rms.kwargs["epsilon"] == 0.0078125  # bfloat16's machine epsilon
  assert convert.from_torch("RMSNorm", _case("rms_f32", "init"), eps=None).kwargs[
    "epsilon"
  ] == pytest.approx(1.1920929e-07)
  ln = convert.from_torch("LayerNorm", _case("ln_chw", "init"))
  assert ln.kwargs["epsilon"] == 1e-5 and ln.kwargs["reduction_axes"] == (-3, -2, -1)
  nhwc = convert.from_torch("GroupNorm", _case("gn", "init"), num_groups=2, channels_first=False)
  assert nhwc.kwargs["feature_axis"] == -1
  flax_way = convert.from_torch("BatchNorm2d", _case("bn2d", "init"), torch_training=False)
  assert "unbiased_running_var" not in flax_way.kwargs


def test_clear_errors():
  with pytest.raises(ValueError, match="kind must be one of"):
    convert.from_torch("BatchNorm", {})
  with pytest.raises(ValueError, match="num_groups"):
    convert.from_torch("GroupNorm", _case("gn", "init"))
  with pytest.raises(ValueError, match="PyTorch's, in"):
    convert.from_torch("BatchNorm2d", _case("bn2d", "init"), momentum=0.99 + 1)


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
