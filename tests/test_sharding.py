"""Explicit sharding (``AxisType.Explicit``, ``jax.set_mesh``): every norm, forward and
gradient, in every layout where Flax's norm works (batch; batch + sequence; N + H for the
CNN norms; the features for tensor parallelism), with Flax's output sharding, on 8 virtual
CPU devices; the results equal the same norm on one device."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm

# (name, module of a library, input shape, layout)
SEQ, CNN = (8, 16, 32), (8, 8, 8, 16)
C = P(None, None, None, "model")  # the CNN features, tensor parallel
CASES = [
  ("layer", lambda lib: lib.LayerNorm(), SEQ, P("data", "model", None)),
  ("layer", lambda lib: lib.LayerNorm(), SEQ, P(None, None, "model")),
  ("rms", lambda lib: lib.RMSNorm(), SEQ, P("data", "model", None)),
  ("rms", lambda lib: lib.RMSNorm(), SEQ, P(None, None, "model")),
  ("batch", lambda lib: lib.BatchNorm(use_running_average=False), CNN, P("data")),
  ("batch", lambda lib: lib.BatchNorm(use_running_average=False), CNN, P("data", "model")),
  (
    "batch",
    lambda lib: lib.BatchNorm(use_running_average=False),
    CNN,
    P(None, None, None, "model"),
  ),
  ("batch_eval", lambda lib: lib.BatchNorm(use_running_average=True), CNN, P("data", "model")),
  ("group", lambda lib: lib.GroupNorm(num_groups=4), CNN, P("data", "model")),
  ("group", lambda lib: lib.GroupNorm(num_groups=4), CNN, C),
  ("instance", lambda lib: lib.InstanceNorm(), CNN, P("data", "model")),
  ("instance", lambda lib: lib.InstanceNorm(), CNN, C),
]


def _spec(a):
  """``a``'s partition spec, one entry per dimension."""
  spec = tuple(a.sharding.spec)
  return spec + (None,) * (len(a.shape) - len(spec))


@pytest.fixture(scope="module")
def mesh():
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def _loss_and_grads(module, variables, x):
  """The output and the gradients w.r.t. the parameters and the input of ``Σ sin(y)``."""

  def loss(params, x):
    v = {**variables, "params": params}
    if "batch_stats" in v:
      y = module.apply(v, x, mutable=["batch_stats"])[0]
    else:
      y = module.apply(v, x)
    return jnp.sum(jnp.sin(y)), y

  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(variables["params"], x)
  return y, grads


@pytest.mark.parametrize(
  "name,make,shape,spec", CASES, ids=[f"{c[0]}-{'_'.join(map(str, c[3]))}" for c in CASES]
)
def test_forward_and_gradient_in_every_layout_where_flax_works(mesh, name, make, shape, spec):
  x = np.random.default_rng(0).normal(3.0, 1.0, shape).astype(np.float32)
  ours, theirs = make(jaxnorm), make(nn)
  variables = ours.init(jax.random.key(0), x)
  if "batch_stats" in variables:  # statistics that make eval differ from training
    stats = {"mean": jnp.full(shape[-1], 2.5), "var": jnp.full(shape[-1], 2.0)}
    variables = {**variables, "batch_stats": stats}
  want_y, want_grads = jax.jit(_loss_and_grads, static_argnums=0)(ours, variables, x)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    try:
      flax_spec = _spec(
        jax.eval_shape(lambda v, x: _loss_and_grads(theirs, v, x)[0], variables, xs)
      )
    except ValueError:  # Flax's GroupNorm over sharded channels: jnp.repeat refuses
      flax_spec = _spec(xs)
    y, grads = jax.jit(_loss_and_grads, static_argnums=0)(ours, variables, xs)
  assert _spec(y) == flax_spec
  assert _spec(grads[1]) == _spec(xs)
  np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-5)
  # (Sums of 512 float32 terms in another order: both are ~5e-6 of the largest from float64.)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
    scale = max(1.0, float(np.abs(np.asarray(want)).max()))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=5e-5 * scale)


@pytest.mark.parametrize(
  "make,shape,spec",
  [
    (lambda nnx: jaxnorm.nnx.LayerNorm(32, rngs=nnx.Rngs(0)), SEQ, P("data", "model", None)),
    (lambda nnx: jaxnorm.nnx.BatchNorm(16, rngs=nnx.Rngs(0)), CNN, P("data", "model")),
  ],
  ids=["layer", "batch"],
)
def test_nnx_modules_too(mesh, make, shape, spec):
  from flax import nnx

  x = np.random.default_rng(0).normal(3.0, 1.0, shape).astype(np.float32)

  @jax.jit
  def step(model, x):
    return nnx.grad(lambda m, x: jnp.sum(jnp.sin(m(x))), argnums=(0, 1))(model, x)

  want = step(make(nnx), x)
  with jax.set_mesh(mesh):
    got = step(make(nnx), jax.device_put(x, NamedSharding(mesh, spec)))
  assert _spec(got[1]) == tuple(spec) + (None,) * (len(shape) - len(spec))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    scale = max(1.0, float(np.abs(np.asarray(w)).max()))
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=5e-5 * scale)
