"""jaxnorm.nnx against flax.nnx: the same constructors (names, order, kinds, defaults), the
same state (paths, variable types, shapes, dtypes, initial values), the same outputs in
training and evaluation, the same updated BatchStats and the same ``nnx.grad`` on ordinary
data; the float64 reference for every module of both front ends; and GroupNorm right where
``flax.nnx.GroupNorm`` is not."""

import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nnx as jnnx
from tests import reference as ref
from tests.cases import CASES, LAYOUTS, NAMES

NORMAL = nnx.initializers.normal(0.5)


def _same_default(a, b):
  if callable(a) and callable(b):  # initializers: Flax builds new function objects
    key = jax.random.key(0)
    try:
      return np.array_equal(a(key, (3,), jnp.float32), b(key, (3,), jnp.float32))
    except TypeError:
      return a is b
  return a == b


@pytest.mark.parametrize("name", NAMES)
def test_constructor_matches_flax(name):
  ours, theirs = getattr(jnnx, name), getattr(nnx, name)
  assert issubclass(ours, theirs)
  p_ours = list(inspect.signature(ours.__init__).parameters.values())
  p_theirs = list(inspect.signature(theirs.__init__).parameters.values())
  for a, b in zip(p_ours, p_theirs, strict=False):
    assert (a.name, a.kind) == (b.name, b.kind)
    assert _same_default(a.default, b.default), a.name
  # jaxnorm's own parameters come after Flax's, keyword-only.
  assert all(p.kind == p.KEYWORD_ONLY for p in p_ours[len(p_theirs) :])
  call_ours = list(inspect.signature(ours.__call__).parameters.values())
  call_theirs = list(inspect.signature(theirs.__call__).parameters.values())
  assert [(p.name, p.kind) for p in call_ours[: len(call_theirs)]] == [
    (p.name, p.kind) for p in call_theirs
  ]
  # jaxnorm's call arguments (Add & Norm's residual) come after Flax's, keyword-only.
  assert all(p.kind == p.KEYWORD_ONLY for p in call_ours[len(call_theirs) :])


CONFIGS = [  # (name, positional args, keyword args, input shape, input dtype)
  ("BatchNorm", (8,), {}, (6, 5, 8), jnp.float32),
  ("BatchNorm", (8,), dict(momentum=0.9, axis=1), (6, 8, 5), jnp.float32),
  ("BatchNorm", (8,), dict(use_bias=False, scale_init=NORMAL, epsilon=1e-3), (16, 8), jnp.float32),
  ("BatchNorm", (8,), dict(use_scale=False, bias_init=NORMAL), (6, 5, 8), jnp.float32),
  ("BatchNorm", (8,), dict(dtype=jnp.bfloat16), (6, 5, 8), jnp.float32),
  ("BatchNorm", (8,), dict(param_dtype=jnp.bfloat16), (6, 5, 8), jnp.bfloat16),
  ("BatchNorm", (8,), dict(use_fast_variance=False), (6, 5, 8), jnp.float32),
  ("LayerNorm", (8,), {}, (4, 7, 8), jnp.float32),
  ("LayerNorm", (8,), dict(scale_init=NORMAL, bias_init=NORMAL), (4, 7, 8), jnp.float32),
  ("LayerNorm", (8,), dict(reduction_axes=(1, 2)), (4, 7, 8), jnp.float32),
  ("LayerNorm", (56,), dict(reduction_axes=(1, 2), feature_axes=(1, 2)), (4, 7, 8), jnp.float32),
  ("LayerNorm", (8,), dict(use_scale=False, epsilon=1e-3), (4, 8), jnp.float32),
  ("LayerNorm", (8,), dict(dtype=jnp.float16), (4, 8), jnp.float32),
  ("LayerNorm", (8,), dict(param_dtype=jnp.bfloat16), (4, 8), jnp.bfloat16),
  ("RMSNorm", (8,), {}, (4, 7, 8), jnp.float32),
  ("RMSNorm", (8,), dict(scale_init=NORMAL, reduction_axes=(1, 2)), (4, 7, 8), jnp.float32),
  ("RMSNorm", (8,), dict(use_scale=False, epsilon=1e-2), (4, 8), jnp.float32),
  ("RMSNorm", (8,), {}, (4, 8), jnp.bfloat16),
  ("GroupNorm", (8, 4), {}, (3, 5, 5, 8), jnp.float32),
  ("GroupNorm", (8, None, 2), dict(scale_init=NORMAL, bias_init=NORMAL), (3, 5, 8), jnp.float32),
  ("GroupNorm", (8, 1), dict(epsilon=1e-3), (3, 4, 4, 8), jnp.float32),
  ("GroupNorm", (8, 8), dict(dtype=jnp.bfloat16), (3, 4, 8), jnp.float32),
  ("InstanceNorm", (8,), {}, (3, 5, 5, 8), jnp.float32),
  ("InstanceNorm", (8,), dict(feature_axes=1, scale_init=NORMAL), (3, 8, 5, 5), jnp.float32),
  ("InstanceNorm", (8,), dict(use_bias=False, use_scale=False), (3, 7, 8), jnp.float32),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CONFIGS)]


def test_every_norm_of_the_registry_has_configs():
  assert {c[0] for c in CONFIGS} == set(NAMES)


_leaves = jax.tree_util.tree_leaves


def _tol(*dtypes):
  low = any(jnp.dtype(d).itemsize < 4 for d in dtypes if d is not None)
  return dict(atol=3e-2, rtol=3e-2) if low else dict(atol=2e-5, rtol=2e-5)


def _flat(module):
  return {path: (type(v), v[...]) for path, v in nnx.to_flat_state(nnx.state(module))}


@pytest.mark.parametrize("name,args,kwargs,shape,dtype", CONFIGS, ids=IDS)
def test_same_state_outputs_stats_and_grads(name, args, kwargs, shape, dtype, rng):
  ours = getattr(jnnx, name)(*args, **kwargs, rngs=nnx.Rngs(3))
  theirs = getattr(nnx, name)(*args, **kwargs, rngs=nnx.Rngs(3))
  s_ours, s_theirs = _flat(ours), _flat(theirs)
  assert s_ours.keys() == s_theirs.keys()
  for path, (t, value) in s_ours.items():
    t2, value2 = s_theirs[path]
    assert t is t2 and value.shape == value2.shape and value.dtype == value2.dtype, path
    np.testing.assert_array_equal(np.asarray(value, np.float32), np.asarray(value2, np.float32))

  x = jnp.asarray(rng.normal(0.7, 1.3, shape), dtype)
  tol = _tol(dtype, kwargs.get("dtype"), kwargs.get("param_dtype"))
  forward = nnx.jit(lambda m, x: m(x))
  for step in range(2):  # training (BatchNorm: batch statistics, updated BatchStats)
    y_ours, y_theirs = forward(ours, x + step), forward(theirs, x + step)
    assert y_ours.dtype == y_theirs.dtype and y_ours.shape == y_theirs.shape
    np.testing.assert_allclose(np.float32(y_ours), np.float32(y_theirs), **tol)
    for path, (_, value) in _flat(ours).items():
      value2 = _flat(theirs)[path][1]
      assert value.dtype == value2.dtype, path
      np.testing.assert_allclose(np.float32(value), np.float32(value2), **tol)

  cot = jnp.asarray(rng.normal(size=shape), jnp.float32)

  def loss(model, x):
    return jnp.sum(model(x).astype(jnp.float32) * cot)

  for mode in ("train", "eval"):
    getattr(ours, mode)()
    getattr(theirs, mode)()
    grad = nnx.jit(nnx.grad(loss, argnums=(0, 1)))
    g_ours, g_theirs = grad(ours, x), grad(theirs, x)
    for a, b in zip(_leaves(g_ours), _leaves(g_theirs), strict=True):
      assert a.dtype == b.dtype
      scale = max(1.0, float(jnp.abs(b.astype(jnp.float32)).max()))
      np.testing.assert_allclose(np.float32(a) / scale, np.float32(b) / scale, **tol)
  np.testing.assert_allclose(np.float32(ours(x)), np.float32(theirs(x)), **tol)  # eval


def test_mode_switching_as_in_flax(rng):
  x = jnp.asarray(rng.normal(2.0, 1.0, (8, 3)), jnp.float32)
  bn = jnnx.BatchNorm(3, rngs=nnx.Rngs(0))
  assert bn.use_running_average is False
  y_eval = bn(x, use_running_average=True)  # the call argument overrides the attribute
  np.testing.assert_allclose(y_eval, x / np.sqrt(1 + 1e-5), rtol=1e-6)
  np.testing.assert_array_equal(bn.mean[...], 0.0)
  bn.eval()
  assert bn.use_running_average is True
  np.testing.assert_allclose(bn(x, use_running_average=False), ref.batch_norm(x)[0], atol=2e-5)
  view = nnx.view(bn, use_running_average=False)
  assert view.use_running_average is False and bn.use_running_average is True
  bn.train()
  assert bn.use_running_average is False
  with pytest.raises(ValueError, match=r"BatchNorm needs use_running_average.*nnx.view"):
    jnnx.BatchNorm(3, use_running_average=None, rngs=nnx.Rngs(0))(x)


def test_group_norm_with_several_kept_axes_matches_the_reference(rng):
  """(B, T, C) with reduction_axes=-1: statistics per (b, t, group). flax.nnx.GroupNorm
  repeats them along axis 1 instead of the channel axis (see the README)."""
  x = rng.normal(0.5, 2.0, (3, 5, 8)).astype(np.float32)
  gn = jnnx.GroupNorm(8, 2, reduction_axes=-1, rngs=nnx.Rngs(0))
  expected = ref.group_norm(x.reshape(15, 8), 2).reshape(x.shape)
  np.testing.assert_allclose(np.asarray(gn(x)), expected, atol=2e-5)
  linen = nn.GroupNorm(num_groups=2, reduction_axes=-1)
  np.testing.assert_allclose(
    np.asarray(linen.apply(linen.init(jax.random.key(0), x), x)), expected, atol=2e-5
  )


# The float64 reference for every norm and layout, through both front ends' modules.
GRID = [(case, layout, api) for layout in LAYOUTS for case in CASES for api in ("linen", "nnx")]
GRID_IDS = [f"{case.name}-{layout}-{api}" for case, layout, api in GRID]


@pytest.mark.parametrize("case,layout,api", GRID, ids=GRID_IDS)
def test_modules_match_reference(case, layout, api, rng):
  shape, channel = LAYOUTS[layout]
  channels = shape[channel]
  x = jnp.asarray(rng.normal(1.5, 2.0, shape), jnp.float32)
  gamma = jnp.asarray(rng.normal(1.0, 0.3, channels), jnp.float32)
  beta = jnp.asarray(rng.normal(0.0, 0.3, channels), jnp.float32)
  bias = {} if case.pure_bias else dict(use_bias=True)  # (jaxnorm's RMSNorm bias)
  if api == "linen":
    variables = {"params": {"scale": gamma, "bias": beta}}
    if case.running_stats:
      variables["batch_stats"] = {"mean": jnp.zeros(channels), "var": jnp.ones(channels)}
    y = case.linen(layout, **bias).apply(variables, x, mutable=["batch_stats"])[0]
  else:
    module = case.nnx(channels, layout, **bias)
    module.scale[...], module.bias[...] = gamma, beta
    y = module(x)
  expected = case.reference(np.asarray(x), np.asarray(gamma), np.asarray(beta), layout)
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5)


@pytest.mark.parametrize("name", NAMES)
def test_metadata_and_promote_dtype_as_in_flax(name, rng):
  """``scale_metadata``/``bias_metadata`` reach the ``nnx.Param``s, and a custom
  ``promote_dtype`` is called on the same arguments as Flax's."""
  calls = {}

  def promote(args, *, dtype=None, lib):
    calls[lib] = [None if a is None else (jnp.shape(a), jnp.result_type(a)) for a in args]
    return nnx.nn.dtypes.promote_dtype(tuple(args), dtype=jnp.bfloat16)

  args = (8, 2) if name == "GroupNorm" else (8,)
  meta = dict(scale_metadata={"tag": "s"})
  if name != "RMSNorm":
    meta["bias_metadata"] = {"tag": "b"}
  modules = [
    getattr(lib, name)(
      *args,
      **meta,
      promote_dtype=lambda a, dtype=None, n=n: promote(a, dtype=dtype, lib=n),
      rngs=nnx.Rngs(0),
    )  # fmt: skip
    for n, lib in (("ours", jnnx), ("theirs", nnx))
  ]
  for m in modules:
    assert m.scale.get_metadata()["tag"] == "s"
    if name != "RMSNorm":
      assert m.bias.get_metadata()["tag"] == "b"
  x = jnp.asarray(rng.normal(size=(4, 3, 8)), jnp.float32)
  y_ours, y_theirs = (m(x) for m in modules)
  assert calls["ours"] == calls["theirs"]
  assert y_ours.dtype == y_theirs.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(y_ours), np.float32(y_theirs), atol=3e-2, rtol=3e-2)
