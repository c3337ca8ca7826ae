"""Whole training steps with jaxnorm's norms against the same models with Flax's.

A user decides on the step, not on the norm. Two models, each built twice from one
definition — once with ``jaxnorm``'s Linen modules, once with ``flax.linen``'s — with the
same parameters, one jit-compiled training step (loss, gradients, an optax update), the two
steps timed interleaved (A B B A ...), medians and their ratio:

- ``transformer``: a Pre-LN character Transformer (4 blocks, width 256, 4 heads, context
  128, batch 32) on one device, in float32 and in mixed precision (bfloat16 activations,
  float32 parameters); jaxnorm's blocks use Add & Norm (``LayerNorm(...)(x, residual=h)``),
  Flax's the separate ``h + x`` and ``LayerNorm``.
- ``resnet18``: a CIFAR-style ResNet-18 (11.2 M parameters, 20 BatchNorms) on 32×32 images,
  data-parallel under ``jax.shard_map`` over 8 devices (8 CPU devices on a CPU), with
  synchronized BatchNorm (``axis_name``): statistics and gradients combined across devices.

  python benchmarks/bench_e2e.py [--repeats 7] [--out benchmarks/results]

Writes ``bench_e2e.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os

import jax

# 8 CPU devices for the data-parallel step (on an accelerator, its own devices are used;
# imported after JAX has started, as gpu_suite.py does, the devices it has).
try:
  jax.config.update("jax_num_cpu_devices", 8)
except RuntimeError:
  pass

import bench_norms  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from bench_norms import timed  # noqa: E402  (the same interleaved timing)
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxnorm  # noqa: E402


class Block(nn.Module):
  """Pre-LN block; with ``add_norm`` the residual add runs inside the next norm."""

  lib: object
  dim: int
  heads: int
  dtype: object
  add_norm: bool

  @nn.compact
  def __call__(self, x, pending, mask):
    norm = lambda: self.lib.LayerNorm(dtype=self.dtype)  # noqa: E731
    sublayers = (
      lambda h: nn.MultiHeadDotProductAttention(self.heads, dtype=self.dtype)(h, h, mask=mask),
      lambda h: nn.Dense(self.dim, dtype=self.dtype)(
        nn.gelu(nn.Dense(4 * self.dim, dtype=self.dtype)(h))
      ),
    )
    for sublayer in sublayers:
      if pending is None:
        h = norm()(x)
      elif self.add_norm:
        h, x = norm()(pending, residual=x)
      else:
        x = x + pending
        h = norm()(x)
      pending = sublayer(h)
    return x, pending


class Transformer(nn.Module):
  lib: object
  vocab: int = 96
  dim: int = 256
  heads: int = 4
  layers: int = 4
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    add_norm = self.lib is jaxnorm
    x = nn.Embed(self.vocab, self.dim)(tokens)
    x = x + nn.Embed(tokens.shape[-1], self.dim)(jnp.arange(tokens.shape[-1]))[None]
    mask = nn.make_causal_mask(tokens)
    pending = None
    for _ in range(self.layers):
      x, pending = Block(self.lib, self.dim, self.heads, self.dtype, add_norm)(x, pending, mask)
    if add_norm:
      h = self.lib.LayerNorm(dtype=self.dtype)(pending, residual=x)[0]
    else:
      h = self.lib.LayerNorm(dtype=self.dtype)(x + pending)
    return nn.Dense(self.vocab, dtype=jnp.float32)(h)


class BasicBlock(nn.Module):
  lib: object
  features: int
  stride: int

  @nn.compact
  def __call__(self, x, train):
    bn = lambda: self.lib.BatchNorm(use_running_average=not train, axis_name="data")  # noqa: E731
    y = nn.Conv(self.features, (3, 3), self.stride, use_bias=False)(x)
    y = nn.relu(bn()(y))
    y = bn()(nn.Conv(self.features, (3, 3), use_bias=False)(y))
    if self.stride != 1 or x.shape[-1] != self.features:
      x = bn()(nn.Conv(self.features, (1, 1), self.stride, use_bias=False)(x))
    return nn.relu(x + y)


class ResNet18(nn.Module):
  lib: object
  classes: int = 10

  @nn.compact
  def __call__(self, x, train=True):
    x = nn.Conv(64, (3, 3), use_bias=False)(x)
    x = nn.relu(self.lib.BatchNorm(use_running_average=not train, axis_name="data")(x))
    for i, features in enumerate((64, 128, 256, 512)):
      for j in range(2):
        x = BasicBlock(self.lib, features, 2 if i > 0 and j == 0 else 1)(x, train)
    return nn.Dense(self.classes)(x.mean((1, 2)))


def transformer_step(lib, dtype, batch=32, context=128):
  model = Transformer(lib, dtype=dtype)
  tokens = jax.random.randint(jax.random.key(1), (batch, context + 1), 0, model.vocab)
  params = Transformer(nn, dtype=dtype).init(jax.random.key(0), tokens[:, :-1])["params"]
  tx = optax.adamw(3e-4)

  @jax.jit
  def step(params, opt_state, tokens):
    def loss(p):
      logits = model.apply({"params": p}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return step, (params, tx.init(params), tokens)


def resnet_step(lib, batch=32):
  mesh = jax.make_mesh((len(jax.devices()),), ("data",))
  replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  model = ResNet18(lib)
  x = jax.device_put(jax.random.normal(jax.random.key(1), (batch, 32, 32, 3)), sharded)
  y = jax.device_put(jax.random.randint(jax.random.key(2), (batch,), 0, 10), sharded)
  variables = ResNet18(nn).init(jax.random.key(0), x, train=False)
  variables = jax.device_put(variables, replicated)
  tx = optax.sgd(0.1, momentum=0.9)

  def shard_loss(params, batch_stats, x, y):
    logits, upd = model.apply({"params": params, "batch_stats": batch_stats}, x, mutable=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
    return jax.lax.psum(ce, "data"), upd["batch_stats"]

  loss = jax.shard_map(
    shard_loss, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P())
  )

  @jax.jit
  def step(params, batch_stats, opt_state, x, y):
    (value, batch_stats), grads = jax.value_and_grad(loss, has_aux=True)(params, batch_stats, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), batch_stats, opt_state, value / x.shape[0]

  params = variables["params"]
  return step, (params, variables["batch_stats"], tx.init(params), x, y)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=None, help="default: benchmarks/results/<device>/")
  ap.add_argument("--repeats", type=int, default=7)
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  device = f"{dev.platform}: {dev.device_kind} (×{len(jax.devices())})"
  print(f"measuring on {device}", flush=True)
  cases = {
    "transformer float32": lambda lib: transformer_step(lib, jnp.float32),
    "transformer bfloat16": lambda lib: transformer_step(lib, jnp.bfloat16),
    f"resnet18 shard_map x{len(jax.devices())}": resnet_step,
  }
  rows = []
  for name, make in cases.items():
    steps = {lib.__name__: make(lib) for lib in (jaxnorm, nn)}
    # Same model, same parameters: the losses agree before anything is timed.
    losses = {k: float(step(*a)[-1]) for k, (step, a) in steps.items()}
    t = timed({k: (lambda s=s: s[0](*s[1])) for k, s in steps.items()}, args.repeats)
    row = dict(
      case=name,
      jaxnorm_ms=t["jaxnorm"] * 1e3,
      flax_ms=t["flax.linen"] * 1e3,
      ratio=t["jaxnorm"] / t["flax.linen"],
      loss_jaxnorm=losses["jaxnorm"],
      loss_flax=losses["flax.linen"],
    )
    rows.append(row)
    print(
      f"{name:28s} jaxnorm {row['jaxnorm_ms']:9.1f} ms  flax {row['flax_ms']:9.1f} ms  "
      f"ratio {row['ratio']:.3f}  (loss {row['loss_jaxnorm']:.5f} vs {row['loss_flax']:.5f})",
      flush=True,
    )
  out = args.out or bench_norms.results_dir(dev)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "bench_e2e.json"), "w") as f:
    json.dump(
      dict(device=device, jax=jax.__version__, repeats=args.repeats, rows=rows), f, indent=1
    )
  print(json.dumps(dict(device=device, rows=rows)))


if __name__ == "__main__":
  main()
