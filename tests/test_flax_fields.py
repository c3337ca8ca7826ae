"""jaxnorm's Linen modules are Flax's classes: ``isinstance``/``issubclass`` against
``flax.linen``'s five norms hold, Flax's fields come first in Flax's order with Flax's
defaults, and every one of them is honoured — each field set to a non-default value gives
what Flax gives (variables, outputs, updated statistics), on ordinary data."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests.cases import NAMES

_leaves = jax.tree_util.tree_leaves
NORMAL = nn.initializers.normal(0.5)
# One non-default value for every Flax field (a field missing here fails
# test_every_flax_field_is_covered, so a new Flax field is not missed): the fields every
# norm has, then per class its base arguments and its own fields.
COMMON = dict(
  epsilon=1e-2,
  dtype=jnp.bfloat16,
  param_dtype=jnp.bfloat16,
  use_scale=False,
  scale_init=NORMAL,
  axis_name="i",
  axis_index_groups=None,  # under pmap: tests/test_distributed.py
  use_fast_variance=False,
  force_float32_reductions=False,
)
BIAS = dict(use_bias=False, bias_init=NORMAL)
FIELDS = {
  "BatchNorm": (
    dict(use_running_average=False),
    dict(COMMON, **BIAS, use_running_average=True, axis=1, momentum=0.5),
  ),
  "LayerNorm": ({}, dict(COMMON, **BIAS, reduction_axes=(1, 2), feature_axes=(1, 2))),
  "RMSNorm": ({}, dict(COMMON, reduction_axes=(1, 2), feature_axes=(1, 2))),
  "GroupNorm": (
    dict(num_groups=2),
    dict(
      COMMON,
      **BIAS,
      num_groups=4,
      group_size=dict(num_groups=None, group_size=1),
      reduction_axes=-1,
    ),
  ),
  "InstanceNorm": ({}, dict(COMMON, **BIAS, feature_axes=1)),
}
CASES = [
  (name, field, value)
  for name in NAMES
  for field, value in FIELDS[name][1].items()
  if field != "axis_index_groups"
]


def _flax_fields(cls):
  return [f for f in dataclasses.fields(cls) if f.name not in ("parent", "name")]


@pytest.mark.parametrize("name", NAMES)
def test_subclass_of_flax_with_flax_fields_first(name):
  ours, theirs = getattr(jaxnorm, name), getattr(nn, name)
  assert issubclass(ours, theirs) and isinstance(ours(), theirs)
  flax_fields = _flax_fields(theirs)
  our_fields = _flax_fields(ours)[: len(flax_fields)]
  assert [f.name for f in our_fields] == [f.name for f in flax_fields]
  for a, b in zip(our_fields, flax_fields, strict=True):
    assert a.default == b.default, a.name
  # Positional arguments mean what they mean in Flax.
  first = flax_fields[0].name
  value = {"use_running_average": True, "num_groups": 4, "epsilon": 0.25}[first]
  assert getattr(ours(value), first) == value


@pytest.mark.parametrize("name", NAMES)
def test_every_flax_field_is_covered(name):
  assert {f.name for f in _flax_fields(getattr(nn, name))} == set(FIELDS[name][1])


def test_a_model_choosing_its_call_by_issubclass():
  """Real model code picks the call signature with ``issubclass(norm_cls, nn.BatchNorm)``."""

  class Net(nn.Module):
    norm_cls: type

    @nn.compact
    def __call__(self, x, train):
      if issubclass(self.norm_cls, nn.BatchNorm):
        return self.norm_cls()(x, use_running_average=not train)
      return self.norm_cls()(x)

  x = jnp.ones((4, 3))
  for cls in (jaxnorm.BatchNorm, jaxnorm.LayerNorm):
    variables = Net(cls).init(jax.random.key(0), x, train=False)
    Net(cls).apply(variables, x, train=True, mutable=["batch_stats"])


@pytest.mark.parametrize("name,field,value", CASES, ids=[f"{n}-{f}" for n, f, _ in CASES])
def test_every_flax_field_is_honoured(name, field, value, rng):
  base = FIELDS[name][0]
  kwargs = {**base, **(value if isinstance(value, dict) else {field: value})}
  ours, theirs = getattr(jaxnorm, name)(**kwargs), getattr(nn, name)(**kwargs)
  x = jnp.asarray(rng.normal(0.5, 1.5, (6, 4, 4)), jnp.float32)
  key = jax.random.key(1)
  if field == "axis_name" and name != "BatchNorm":  # only BatchNorm skips the axis at init
    ours, theirs = getattr(jaxnorm, name)(**base), getattr(nn, name)(**base)
  v_ours, v_theirs = ours.init(key, x), theirs.init(key, x)
  ours, theirs = getattr(jaxnorm, name)(**kwargs), getattr(nn, name)(**kwargs)
  assert jax.tree_util.tree_structure(v_ours) == jax.tree_util.tree_structure(v_theirs)
  for a, b in zip(_leaves(v_ours), _leaves(v_theirs), strict=True):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))

  def apply(module, x):
    return module.apply(v_theirs, x, mutable=["batch_stats"])

  if field == "axis_name":  # statistics across a vmapped axis
    xs = jnp.stack([x, 2 * x + 1])
    out_ours = jax.vmap(lambda x: apply(ours, x), axis_name="i")(xs)
    out_theirs = jax.vmap(lambda x: apply(theirs, x), axis_name="i")(xs)
  else:
    out_ours, out_theirs = apply(ours, x), apply(theirs, x)
  low = any(jnp.dtype(kwargs.get(k) or jnp.float32).itemsize < 4 for k in ("dtype", "param_dtype"))
  tol = dict(atol=3e-2, rtol=3e-2) if low else dict(atol=2e-5, rtol=2e-5)
  for a, b in zip(_leaves(out_ours), _leaves(out_theirs), strict=True):
    assert a.shape == b.shape
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)
  assert (
    jax.tree_util.tree_leaves(out_ours)[0].dtype == jax.tree_util.tree_leaves(out_theirs)[0].dtype
  )


def test_zero_centered_scale_keeps_partitioned_initializers():
  """``zero_centered_scale`` with a partitioned ``scale_init`` (Linen's logical or mesh
  partitioning, NNX's ``with_partitioning`` or ``scale_metadata``) once raised
  ``TypeError: unsupported operand ... 'LogicallyPartitioned' and 'int'``; the stored
  scale is ``init − 1`` with the sharding names kept, as Flax's own options keep them."""
  from flax import nnx

  x = jnp.ones((2, 8))
  for partition in (nn.with_logical_partitioning, nn.with_partitioning):
    init = partition(nn.initializers.ones, ("embed",))
    variables = jaxnorm.RMSNorm(zero_centered_scale=True, scale_init=init).init(
      jax.random.key(0), x
    )
    assert nn.get_partition_spec(variables)["params"]["scale"] == jax.P("embed")
    np.testing.assert_array_equal(nn.unbox(variables)["params"]["scale"], np.zeros(8))
  mesh = jax.make_mesh((8,), ("embed",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    for kw in (
      dict(scale_init=nnx.with_partitioning(nnx.initializers.ones, ("embed",))),
      dict(scale_metadata={"sharding": ("embed",)}),
    ):
      model = jaxnorm.nnx.RMSNorm(8, zero_centered_scale=True, rngs=nnx.Rngs(0), **kw)
      meta = model.scale.get_metadata()
      assert meta.get("out_sharding", meta.get("sharding")) == ("embed",)
      np.testing.assert_array_equal(model.scale[...], np.zeros(8))
      np.testing.assert_allclose(model(x), np.ones((2, 8)), rtol=1e-5)
