"""The model stacks whose whole programs the tests count and the benchmarks compile and
time (issue 33's point 3, issue 53's points 2 and 4): a GroupNorm UNet, a ResNet stage, a
Pre-LN Transformer and a ResNet-50, each built over either library's norms (``lib`` is
``jaxnorm`` or ``flax.linen``), with its inference and training programs
(:func:`programs`)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.programs import abstract

SEQ, CNN = (8, 128, 256), (8, 16, 16, 64)


class UNetStack(nn.Module):
  """Convolutions and GroupNorms at two resolutions, as in a diffusion UNet."""

  lib: object
  blocks: int = 10

  @nn.compact
  def __call__(self, x, train=False):
    for i in range(self.blocks):
      x = nn.Conv(64, (3, 3))(x)
      x = nn.silu(self.lib.GroupNorm(num_groups=16)(x))
      if i == self.blocks // 2:
        x = nn.avg_pool(x, (2, 2), (2, 2))
    return x


class ResNetStack(nn.Module):
  """Convolution, BatchNorm, ReLU blocks with residuals, as in a ResNet stage."""

  lib: object
  blocks: int = 8

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Conv(64, (3, 3))(x)
    for _ in range(self.blocks):
      h = nn.relu(self.lib.BatchNorm(use_running_average=not train)(nn.Conv(64, (3, 3))(x)))
      x = x + self.lib.BatchNorm(use_running_average=not train)(nn.Conv(64, (3, 3))(h))
    return x


class TransformerStack(nn.Module):
  """Pre-LN Transformer blocks (attention and MLP) with LayerNorm."""

  lib: object
  blocks: int = 6

  @nn.compact
  def __call__(self, x, train=False):
    for _ in range(self.blocks):
      x = x + nn.SelfAttention(num_heads=4)(self.lib.LayerNorm()(x))
      x = x + nn.Dense(256)(nn.gelu(nn.Dense(1024)(self.lib.LayerNorm()(x))))
    return self.lib.LayerNorm()(x)


class ResNet50(nn.Module):
  """ResNet-50 (He et al. 2016): bottleneck blocks of 3, 4, 6, 3, 53 BatchNorms."""

  lib: object
  classes: int = 10

  @nn.compact
  def __call__(self, x, train=False):
    def bn(h, zero=False):
      init = nn.initializers.zeros if zero else nn.initializers.ones
      return self.lib.BatchNorm(use_running_average=not train, scale_init=init)(h)

    x = nn.relu(bn(nn.Conv(64, (7, 7), (2, 2), use_bias=False)(x)))
    x = nn.max_pool(x, (3, 3), (2, 2), "SAME")
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)):
      for b in range(blocks):
        stride = (2, 2) if stage > 0 and b == 0 else (1, 1)
        h = nn.relu(bn(nn.Conv(width, (1, 1), use_bias=False)(x)))
        h = nn.relu(bn(nn.Conv(width, (3, 3), stride, use_bias=False)(h)))
        h = bn(nn.Conv(4 * width, (1, 1), use_bias=False)(h), zero=True)
        if b == 0:
          x = bn(nn.Conv(4 * width, (1, 1), stride, use_bias=False)(x))
        x = nn.relu(x + h)
    return nn.Dense(self.classes)(jnp.mean(x, (1, 2)))


MODELS = [("UNet (GroupNorm)", UNetStack, CNN), ("ResNet (BatchNorm)", ResNetStack, CNN),
          ("Transformer (LayerNorm)", TransformerStack, SEQ),
          ("ResNet-50 (BatchNorm)", ResNet50, (8, 64, 64, 3))]  # fmt: skip


def programs(model_cls, lib, shape):
  """``{"inference" | "training": (fn, variables, x)}`` of ``model_cls`` over ``lib``'s norms
  on a random input of ``shape``: the forward, and the gradient of a loss with the running
  statistics updated (``fn(variables, x)``)."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=shape).astype(np.float32))
  model = model_cls(lib)
  v = model.init(jax.random.key(0), x)

  def infer(v, x):
    return model.apply(v, x)

  def train(v, x):
    def loss(p):
      out = model.apply({**v, "params": p}, x, train=True, mutable=["batch_stats"])
      return jnp.mean(out[0] ** 2), out[1]

    return jax.grad(loss, has_aux=True)(v["params"])  # (the running statistics too)

  return {"inference": (infer, v, x), "training": (train, v, x)}


def training_step(name, lib, mesh, batch=None):
  """The training step of the model class called ``name`` in :data:`MODELS` over ``lib``'s
  norms, compiled for ``mesh`` from shapes alone: the variables replicated, the input laid
  out by the partition spec ``batch`` (replicated by default)."""
  cls, shape = next((c, s) for _, c, s in MODELS if c.__name__ == name)
  step, variables, x = programs(cls, lib, shape)["training"]
  args = (
    abstract(variables, NamedSharding(mesh, P())),
    abstract(x, NamedSharding(mesh, batch or P())),
  )
  return jax.jit(step).lower(*args).compile()
