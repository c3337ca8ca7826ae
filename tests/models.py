"""The model stacks whose whole programs the tests count and the benchmarks compile and
time (issue 33's point 3, issue 53's points 2 and 4): a GroupNorm UNet, a ResNet stage, a
Pre-LN Transformer, a Llama-style RMSNorm Transformer, a ResNet-50 and GPT-2 small, each
built over either library's norms (``lib`` is ``jaxnorm`` or ``flax.linen``), with its
inference and training programs (:func:`programs`)."""

from __future__ import annotations

import functools
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests import hlo
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


class LlamaStack(nn.Module):
  """Pre-RMSNorm Transformer blocks as in Llama (Touvron et al. 2023): attention and a SwiGLU
  MLP, no biases, a final RMSNorm (rotary embeddings left out: they touch no norm)."""

  lib: object
  blocks: int = 6

  @nn.compact
  def __call__(self, x, train=False):
    for _ in range(self.blocks):
      h = self.lib.RMSNorm(epsilon=1e-5)(x)
      x = x + nn.SelfAttention(num_heads=4, use_bias=False)(h)
      h = self.lib.RMSNorm(epsilon=1e-5)(x)
      gate, up = jnp.split(nn.Dense(2 * 688, use_bias=False)(h), 2, axis=-1)
      x = x + nn.Dense(x.shape[-1], use_bias=False)(nn.silu(gate) * up)
    return self.lib.RMSNorm(epsilon=1e-5)(x)


class GPT2Small(nn.Module):
  """GPT-2 small (Radford et al. 2019): 12 Pre-LN blocks of width 768 with 12 heads, causal
  attention, learned positions, the output tied to the token embedding; 124M parameters.
  Its input is token ids (:data:`vocab` of them)."""

  lib: object
  vocab: int = 50257
  blocks: int = 12
  width: int = 768

  @nn.compact
  def __call__(self, tokens, train=False):
    embed = nn.Embed(self.vocab, self.width)
    x = embed(tokens) + nn.Embed(1024, self.width)(jnp.arange(tokens.shape[-1]))[None]
    mask = nn.make_causal_mask(tokens)
    for _ in range(self.blocks):
      h = self.lib.LayerNorm(epsilon=1e-5)(x)
      x = x + nn.MultiHeadDotProductAttention(num_heads=12)(h, h, mask=mask)
      h = self.lib.LayerNorm(epsilon=1e-5)(x)
      x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(h)))
    return embed.attend(self.lib.LayerNorm(epsilon=1e-5)(x))


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
          ("Llama (RMSNorm)", LlamaStack, SEQ),
          ("ResNet-50 (BatchNorm)", ResNet50, (8, 64, 64, 3)),
          ("GPT-2 small (LayerNorm)", GPT2Small, (8, 1024))]  # fmt: skip


def programs(model_cls, lib, shape):
  """``{"inference" | "training": (fn, variables, x)}`` of ``model_cls`` over ``lib``'s norms
  on a random input of ``shape`` (token ids for a model with a ``vocab``): the forward, and
  the gradient of a loss with the running statistics updated (``fn(variables, x)``)."""
  rng = np.random.default_rng(0)
  model = model_cls(lib)
  if vocab := getattr(model, "vocab", 0):
    x = jnp.asarray(rng.integers(0, vocab, size=shape, dtype=np.int32))
    v = model.init(jax.random.key(0), x[:1, :8])  # (the parameters, without a full forward)
  else:
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    v = model.init(jax.random.key(0), x)

  def infer(v, x):
    return model.apply(v, x)

  def train(v, x):
    def loss(p):
      out = model.apply({**v, "params": p}, x, train=True, mutable=["batch_stats"])
      return jnp.mean(out[0] ** 2), out[1]

    return jax.grad(loss, has_aux=True)(v["params"])  # (the running statistics too)

  return {"inference": (infer, v, x), "training": (train, v, x)}


def flax_exact():
  """Flax's norms with its exact statistics (``use_fast_variance=False``, two passes): the
  program the tests and tables hold jaxnorm's whole steps below, beside Flax's default."""
  return types.SimpleNamespace(
    **{
      k: functools.partial(getattr(nn, k), use_fast_variance=False)
      for k in ("BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm")
    }
  )


def named_programs(name, lib):
  """:func:`programs` of the model class called ``name`` in :data:`MODELS`, on its input
  shape there."""
  cls, shape = next((c, s) for _, c, s in MODELS if c.__name__ == name)
  return programs(cls, lib, shape)


def training_step(name, lib, mesh, batch=None):
  """The training step of the model class called ``name`` in :data:`MODELS` over ``lib``'s
  norms, compiled for ``mesh`` from shapes alone: the variables replicated, the input laid
  out by the partition spec ``batch`` (replicated by default)."""
  step, variables, x = named_programs(name, lib)["training"]
  args = (
    abstract(variables, NamedSharding(mesh, P())),
    abstract(x, NamedSharding(mesh, batch or P())),
  )
  return jax.jit(step).lower(*args).compile()


def step_costs(name, libs, mesh, platform, batch=None):
  """Each library's :func:`training_step` of model ``name`` (``libs``: label → library),
  measured per device: ``{label: (kernels, bytes, collectives)}`` (``hlo.measure`` on
  ``platform``, ``hlo.count``)."""
  got = {}
  for label, lib in libs.items():
    compiled = training_step(name, lib, mesh, batch)
    got[label] = (*hlo.measure(compiled, 1, platform), hlo.count(compiled.as_text()))
  return got
