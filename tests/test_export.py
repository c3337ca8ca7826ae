"""Every module lowers for GPUs and TPUs: ``jax.export`` for the ``cuda``, ``rocm`` and
``tpu`` platforms (StableHLO, no accelerator needed), forward and forward+backward, with
masks, and with ``axis_name`` under ``shard_map`` over 8 devices."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import nnx as jnnx

PLATFORMS = ("cuda", "rocm", "tpu")


class AllNorms(nn.Module):
  """One of each Linen module, in sequence on an NHWC map (and a token view for Add & Norm)."""

  axis_name: str | None = None

  @nn.compact
  def __call__(self, x, mask=None):
    stats = dict(use_running_average=False, axis_name=self.axis_name)
    x = jaxnorm.BatchNorm(**stats)(x, mask=mask)
    x = jaxnorm.BatchRenorm(**stats, warmup_steps=0, r_max_steps=None, d_max_steps=None)(
      x, mask=mask
    )
    x = jaxnorm.BatchNorm(**stats, virtual_batch_size=2)(x, mask=mask)
    x = jaxnorm.FrozenBatchNorm()(x)
    x = jaxnorm.GroupNorm(num_groups=2)(x, mask=mask)
    x = jaxnorm.InstanceNorm()(x, mask=mask)
    x = jaxnorm.LayerNorm(reduction_axes=(1, 2, 3))(x, mask=mask)
    tokens = x.reshape(x.shape[0], -1, x.shape[-1])
    y, h = jaxnorm.LayerNorm()(tokens, residual=tokens)
    return jaxnorm.RMSNorm()(y + h)


def _step(model):
  def loss(params, variables, x, mask):
    y, upd = model.apply({**variables, "params": params}, x, mask, mutable=["batch_stats"])
    return jnp.sum(y**2), upd

  def forward(variables, x, mask):
    return model.apply(variables, x, mask, mutable=["batch_stats"])

  def fwd_bwd(variables, x, mask):
    return jax.value_and_grad(loss, has_aux=True)(variables["params"], variables, x, mask)

  return forward, fwd_bwd


def _check(exported):
  assert exported.platforms == PLATFORMS
  text = exported.mlir_module()
  assert "func.func public @main" in text and "stablehlo" in text


@pytest.mark.parametrize("with_mask", [False, True])
def test_every_linen_module_lowers_for_gpus_and_tpus(with_mask):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4, 4, 6)), jnp.float32)
  mask = jnp.arange(4)[:, None, None, None] < 3 if with_mask else None
  model = AllNorms()
  variables = model.init(jax.random.key(0), x, mask)
  for fn in _step(model):
    _check(export.export(jax.jit(fn), platforms=PLATFORMS)(variables, x, mask))


def test_shard_map_with_axis_name_lowers_for_gpus_and_tpus():
  mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  model = AllNorms(axis_name="d")
  x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 4, 4, 6)), jnp.float32)
  mask = jnp.arange(16)[:, None, None, None] % 3 > 0
  variables = model.init(jax.random.key(0), x[:2], mask[:2])
  _, fwd_bwd = _step(model)

  def step(variables, x, mask):
    (value, updates), grads = fwd_bwd(variables, x, mask)
    return jax.lax.psum(value, "d"), jax.lax.psum(grads, "d"), updates

  specs = dict(in_specs=(P(), P("d"), P("d")), out_specs=(P(), P(), P()))
  mapped = jax.jit(jax.shard_map(step, mesh=mesh, **specs))
  with jax.set_mesh(mesh):
    args = [jax.device_put(a, NamedSharding(mesh, P("d"))) for a in (x, mask)]
    exported = export.export(mapped, platforms=PLATFORMS)(variables, *args)
  _check(exported)
  assert exported.nr_devices == 8


def test_nnx_modules_lower_for_gpus_and_tpus():
  rngs = nnx.Rngs(0)
  layers = [
    jnnx.BatchNorm(6, rngs=rngs),
    jnnx.BatchRenorm(6, rngs=rngs),
    jnnx.FrozenBatchNorm(6, rngs=rngs),
    jnnx.GroupNorm(6, 2, rngs=rngs),
    jnnx.InstanceNorm(6, rngs=rngs),
    jnnx.LayerNorm(6, rngs=rngs),
    jnnx.RMSNorm(6, rngs=rngs),
  ]
  model = nnx.Sequential(*layers)
  graphdef, state = nnx.split(model)
  x = jnp.ones((4, 4, 4, 6))

  def fwd_bwd(state, x):
    model = nnx.merge(graphdef, state)
    value, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    return value, grads, nnx.state(model)

  _check(export.export(jax.jit(fwd_bwd), platforms=PLATFORMS)(state, x))
