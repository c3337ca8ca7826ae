"""A small decoder-only Transformer, a character-level language model on real English text.

The corpus is the Book of Genesis in the King James Version (public domain, 197 KB,
``examples/data/genesis_kjv.txt``): the first 90 % trains, the last 10 % validates. The
model is a GPT-style stack of causal self-attention and MLP blocks with jaxnorm's LayerNorm,
RMSNorm or Dynamic Tanh (``--norm dyt``, Zhu et al. 2025: no statistics), placed before
each sublayer (Pre-LN, the default, with a final norm; each norm is an Add & Norm that also
adds the previous sublayer's output to the residual stream) or after each residual addition
(``--post-ln``, the original Transformer's placement). ``--qk-norm head`` adds QK-norm as
Qwen3 and Gemma 3 do (an RMSNorm of the queries and of the keys over ``head_dim``, per
head); ``--qk-norm flat`` as OLMo 2 does (over all heads' features at once). The model is
written with the Linen modules (``--api linen``, the default) and with ``jaxnorm.nnx``
(``--api nnx``).

  python examples/mini_transformer.py --norm layer --steps 800 --out results/mini_transformer
  python examples/mini_transformer.py --api nnx --norm rms
  python examples/mini_transformer.py --norm dyt --qk-norm head

Prints a progress bar, a generated sample and, as its last stdout line, one JSON object
with the final metrics; saves a plot of the training and validation loss into ``--out``.
"""

from __future__ import annotations

import argparse
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import print_result, save_curves
from flax import nnx
from tqdm import tqdm

import jaxnorm
from jaxnorm import nnx as jnnx

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "genesis_kjv.txt")
NORMS = ("layer", "rms", "dyt")
QK_NORMS = ("none", "head", "flat")


def qk_norm_axes(qk_norm: str) -> tuple[int, ...]:
  """The axes of queries and keys ``(B, T, heads, head_dim)`` their RMSNorm reduces over:
  ``head_dim`` per head (Qwen3, Gemma 3) or every head's features at once (OLMo 2)."""
  if qk_norm not in QK_NORMS[1:]:
    raise ValueError(f"--qk-norm must be one of {QK_NORMS}, got {qk_norm!r}")
  return (-1,) if qk_norm == "head" else (-2, -1)


class QKNormAttention(nn.Module):
  """Causal self-attention with QK-norm: queries and keys RMS-normalized (a learned scale of
  the reduced axes' shape) before their dot products."""

  dim: int
  heads: int
  qk_norm: str

  @nn.compact
  def __call__(self, h, mask):
    shape = (self.heads, self.dim // self.heads)
    q, k, v = (nn.DenseGeneral(shape, name=n)(h) for n in ("query", "key", "value"))
    axes = qk_norm_axes(self.qk_norm)  # (jaxnorm reduces over both axes without a reshape)
    q = jaxnorm.RMSNorm(reduction_axes=axes, feature_axes=axes, name="query_norm")(q)
    k = jaxnorm.RMSNorm(reduction_axes=axes, feature_axes=axes, name="key_norm")(k)
    y = nn.dot_product_attention(q, k, v, mask=mask)
    return nn.DenseGeneral(self.dim, axis=(-2, -1), name="out")(y)


def make_norm(kind: str):
  """LayerNorm, RMSNorm or Dynamic Tanh (no statistics) over the model dimension."""
  if kind == "layer":
    return jaxnorm.LayerNorm()
  if kind == "rms":
    return jaxnorm.RMSNorm()
  if kind == "dyt":
    return jaxnorm.DyT()
  raise ValueError(f"--norm must be one of {NORMS}, got {kind!r}")


def add_and_norm(norm, pending, x):
  """``(norm(x + pending), x + pending)``: Add & Norm, one fused step for jaxnorm's
  LayerNorm and RMSNorm; DyT, elementwise, has no statistics to fuse the addition with."""
  if isinstance(norm, jaxnorm.DyT | jnnx.DyT):
    h = x + pending
    return norm(h), h
  return norm(pending, residual=x)


class Block(nn.Module):
  """Causal self-attention and an MLP, each with a residual connection and a norm.

  Pre-LN runs on Add & Norm: ``x`` is the residual stream and ``pending`` the previous
  sublayer's output not yet added to it; each norm adds it (``residual=``) and normalizes,
  returning the new stream too. The same maths as ``x = x + sublayer(norm(x))``, one fused
  step per norm. Returns ``(stream, pending)``.
  """

  dim: int
  heads: int
  norm: str
  post_ln: bool
  qk_norm: str = "none"

  @nn.compact
  def __call__(self, x, mask, pending=None):
    def attention(h):
      if self.qk_norm != "none":
        return QKNormAttention(self.dim, self.heads, self.qk_norm)(h, mask)
      return nn.MultiHeadDotProductAttention(self.heads, qkv_features=self.dim)(h, h, mask=mask)

    def mlp(h):
      return nn.Dense(self.dim)(nn.gelu(nn.Dense(4 * self.dim)(h)))

    for sublayer in (attention, mlp):
      if self.post_ln:
        x = make_norm(self.norm)(x + sublayer(x))
      elif pending is None:
        pending = sublayer(make_norm(self.norm)(x))
      else:
        y, x = add_and_norm(make_norm(self.norm), pending, x)
        pending = sublayer(y)
    return x, pending


class CharTransformer(nn.Module):
  """Token and position embeddings, ``layers`` blocks, a final norm (Pre-LN), a readout."""

  vocab: int
  context: int = 64
  dim: int = 128
  heads: int = 4
  layers: int = 3
  norm: str = "layer"
  post_ln: bool = False
  qk_norm: str = "none"

  @nn.compact
  def __call__(self, tokens):
    t = tokens.shape[-1]
    x = nn.Embed(self.vocab, self.dim)(tokens)
    x = x + nn.Embed(self.context, self.dim)(jnp.arange(t))[None]
    mask = nn.make_causal_mask(tokens)
    pending = None
    for _ in range(self.layers):
      block = Block(self.dim, self.heads, self.norm, self.post_ln, self.qk_norm)
      x, pending = block(x, mask, pending)
    if not self.post_ln:
      x = (
        make_norm(self.norm)(x)
        if pending is None
        else add_and_norm(make_norm(self.norm), pending, x)[0]
      )
    return nn.Dense(self.vocab)(x)


def make_nnx_norm(kind: str, dim: int, rngs: nnx.Rngs):
  """:func:`make_norm` with ``jaxnorm.nnx``'s modules."""
  if kind == "layer":
    return jnnx.LayerNorm(dim, rngs=rngs)
  if kind == "rms":
    return jnnx.RMSNorm(dim, rngs=rngs)
  if kind == "dyt":
    return jnnx.DyT(dim, rngs=rngs)
  raise ValueError(f"--norm must be one of {NORMS}, got {kind!r}")


class NNXAttention(nnx.Module):
  """Self-attention as an NNX module: Flax's, or :class:`QKNormAttention`'s."""

  def __init__(self, dim: int, heads: int, qk_norm: str, *, rngs: nnx.Rngs):
    self.qk_norm = qk_norm
    if qk_norm == "none":
      self.mha = nnx.MultiHeadAttention(heads, dim, qkv_features=dim, decode=False, rngs=rngs)
      return
    shape = (heads, dim // heads)
    self.qkv = nnx.List(nnx.LinearGeneral(dim, shape, rngs=rngs) for _ in range(3))
    self.out = nnx.LinearGeneral(shape, dim, axis=(-2, -1), rngs=rngs)
    axes = qk_norm_axes(qk_norm)
    features = shape[-1] if len(axes) == 1 else dim
    self.norms = nnx.List(
      jnnx.RMSNorm(features, reduction_axes=axes, feature_axes=axes, rngs=rngs) for _ in range(2)
    )

  def __call__(self, h, mask):
    if self.qk_norm == "none":
      return self.mha(h, h, mask=mask)
    q, k, v = (proj(h) for proj in self.qkv)
    q, k = self.norms[0](q), self.norms[1](k)
    return self.out(nnx.dot_product_attention(q, k, v, mask=mask))


class NNXBlock(nnx.Module):
  """:class:`Block` as an NNX module."""

  def __init__(self, dim: int, heads: int, norm: str, post_ln: bool, qk_norm: str = "none", *,
               rngs: nnx.Rngs):  # fmt: skip
    self.attention = NNXAttention(dim, heads, qk_norm, rngs=rngs)
    self.up, self.down = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)
    self.norms = nnx.List(make_nnx_norm(norm, dim, rngs) for _ in range(2))
    self.post_ln = post_ln

  def __call__(self, x, mask, pending=None):
    """As :class:`Block`: ``(stream, pending)``, Pre-LN on Add & Norm."""
    sublayers = (
      lambda h: self.attention(h, mask),
      lambda h: self.down(nnx.gelu(self.up(h))),
    )
    for sublayer, norm in zip(sublayers, self.norms, strict=True):
      if self.post_ln:
        x = norm(x + sublayer(x))
      elif pending is None:
        pending = sublayer(norm(x))
      else:
        y, x = add_and_norm(norm, pending, x)
        pending = sublayer(y)
    return x, pending


class NNXCharTransformer(nnx.Module):
  """:class:`CharTransformer` as an NNX module."""

  def __init__(self, vocab, context=64, dim=128, heads=4, layers=3, norm="layer",
               post_ln=False, qk_norm="none", *, rngs: nnx.Rngs):  # fmt: skip
    self.context = context
    self.tokens, self.positions = (
      nnx.Embed(vocab, dim, rngs=rngs),
      nnx.Embed(context, dim, rngs=rngs),
    )
    self.blocks = nnx.List(
      NNXBlock(dim, heads, norm, post_ln, qk_norm, rngs=rngs) for _ in range(layers)
    )
    self.final = None if post_ln else make_nnx_norm(norm, dim, rngs)
    self.readout = nnx.Linear(dim, vocab, rngs=rngs)

  def __call__(self, tokens):
    x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))[None]
    mask = nnx.make_causal_mask(tokens)
    pending = None
    for block in self.blocks:
      x, pending = block(x, mask, pending)
    if self.final is not None:
      x = self.final(x) if pending is None else add_and_norm(self.final, pending, x)[0]
    return self.readout(x)


def linen_trainer(model: CharTransformer, seed: int, tx):
  """``(step(x, y) -> loss, loss(x, y), next_logits(window))`` for the Linen model."""
  params = model.init(jax.random.key(seed), np.zeros((1, model.context), np.int32))["params"]
  state = dict(params=params, opt_state=tx.init(params))

  def loss_fn(params, x, y):
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def step(x, y):
    state["params"], state["opt_state"], loss = train_step(
      state["params"], state["opt_state"], x, y
    )
    return loss

  eval_loss = jax.jit(loss_fn)
  next_logits = jax.jit(lambda params, window: model.apply({"params": params}, window[None]))
  return (
    step,
    lambda x, y: eval_loss(state["params"], x, y),
    lambda window: next_logits(state["params"], window)[0, -1],
  )


def nnx_trainer(model: NNXCharTransformer, tx):
  """The same three functions for the NNX model (updated in place by ``nnx.Optimizer``)."""
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  @nnx.jit
  def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss

  eval_loss = nnx.jit(loss_fn)
  next_logits = nnx.jit(lambda model, window: model(window[None]))
  return (
    lambda x, y: train_step(model, optimizer, x, y),
    lambda x, y: eval_loss(model, x, y),
    lambda window: next_logits(model, window)[0, -1],
  )


def load_text(path: str = DATA):
  """The corpus as int32 character codes, its alphabet, and a 90/10 train/validation split."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  alphabet = sorted(set(text))
  codes = np.array([alphabet.index(c) for c in text], dtype=np.int32)
  split = int(0.9 * len(codes))
  return codes[:split], codes[split:], alphabet


def batches(codes: np.ndarray, batch_size: int, context: int, rng: np.random.Generator):
  """Random windows: inputs and next-character targets, each (batch_size, context)."""
  starts = rng.integers(0, len(codes) - context - 1, batch_size)
  idx = starts[:, None] + np.arange(context)[None]
  return codes[idx], codes[idx + 1]


def generate(next_logits, context: int, prompt, length: int, key, temperature: float = 0.8):
  """Samples ``length`` characters after ``prompt`` (sliding the context window);
  ``next_logits(window)`` gives the logits of the character after a window."""
  sample = jax.jit(lambda logits, key: jax.random.categorical(key, logits / temperature))
  tokens = list(prompt)
  for k in jax.random.split(key, length):
    window = np.array(tokens[-context:], dtype=np.int32)
    window = np.pad(window, (context - len(window), 0))  # left-pad to a fixed shape
    tokens.append(int(sample(next_logits(window), k)))
  return tokens[len(prompt) :]


def train(
  norm: str = "layer",
  post_ln: bool = False,
  steps: int = 800,
  batch_size: int = 32,
  context: int = 64,
  dim: int = 128,
  layers: int = 3,
  lr: float = 3e-3,
  seed: int = 0,
  eval_every: int = 50,
  sample_length: int = 300,
  out: str | None = "results/mini_transformer",
  progress: bool = True,
  history: bool = False,
  api: str = "linen",
  qk_norm: str = "none",
) -> dict:
  """Trains the model and returns the final metrics (also printed as the last JSON line);
  with ``history``, the returned dict (not the printed line) also holds the loss curves."""
  train_codes, val_codes, alphabet = load_text()
  rng = np.random.default_rng(seed)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, lr, min(100, steps // 10 + 1), steps, lr * 0.05
  )
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
  shape = dict(layers=layers, norm=norm, post_ln=post_ln, qk_norm=qk_norm)
  if api == "linen":
    model = CharTransformer(len(alphabet), context, dim, **shape)
    train_step, eval_loss, next_logits = linen_trainer(model, seed, tx)
  elif api == "nnx":
    model = NNXCharTransformer(len(alphabet), context, dim, **shape, rngs=nnx.Rngs(seed))
    train_step, eval_loss, next_logits = nnx_trainer(model, tx)
  else:
    raise ValueError(f"api must be 'linen' or 'nnx', got {api!r}")
  val_rng = np.random.default_rng(seed + 1)
  val_set = [batches(val_codes, 64, context, val_rng) for _ in range(4)]  # fixed windows

  def validate():
    return float(np.mean([eval_loss(x, y) for x, y in val_set]))

  name = f"{norm}{'-post' if post_ln else '-pre'}{'' if qk_norm == 'none' else '-qk-' + qk_norm}"
  initial = validate()
  val_curve, train_curve, window = [initial], [], []
  start = time.perf_counter()
  bar = tqdm(range(1, steps + 1), desc=f"mini_transformer[{api}, {name}]", disable=not progress)
  for step in bar:
    window.append(train_step(*batches(train_codes, batch_size, context, rng)))
    if step % eval_every == 0 or step == steps:
      train_curve.append(float(jnp.mean(jnp.stack(window))))
      window = []
      val_curve.append(validate())
      bar.set_postfix(train=f"{train_curve[-1]:.3f}", val=f"{val_curve[-1]:.3f}")
  seconds = time.perf_counter() - start

  if sample_length:
    prompt = np.array([alphabet.index(c) for c in "And God said"], np.int32)
    sample = generate(next_logits, context, prompt, sample_length, jax.random.key(seed))
    print("sample: And God said" + "".join(alphabet[i] for i in sample))
  metrics = dict(
    norm=norm,
    api=api,
    post_ln=post_ln,
    qk_norm=qk_norm,
    initial_loss=initial,
    final_loss=val_curve[-1],
    steps=steps,
    seconds=round(seconds, 2),
  )
  if out:
    metrics["plot"] = save_curves(
      os.path.join(out, f"mini_transformer_{'' if api == 'linen' else api + '_'}{name}.png"),
      f"char-level Transformer on Genesis (KJV), {name}-LN",
      [("loss (nats/char)", {"validation": val_curve[1:], "training": train_curve})],
      f"× {eval_every} steps",
    )
  print_result(metrics)
  if history:
    metrics = dict(metrics, val_curve=val_curve, train_curve=train_curve, eval_every=eval_every)
  return metrics


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--norm", choices=NORMS, default="layer")
  ap.add_argument("--api", choices=("linen", "nnx"), default="linen", help="Flax front end")
  ap.add_argument("--post-ln", action="store_true", help="norm after each residual addition")
  qk_help = "RMSNorm of queries and keys: per head (Qwen3) or flattened (OLMo 2)"
  ap.add_argument("--qk-norm", choices=QK_NORMS, default="none", help=qk_help)
  ap.add_argument("--steps", type=int, default=800)
  ap.add_argument("--batch-size", type=int, default=32)
  ap.add_argument("--context", type=int, default=64)
  ap.add_argument("--dim", type=int, default=128)
  ap.add_argument("--layers", type=int, default=3)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", default="results/mini_transformer", help="folder for the plot")
  args = ap.parse_args(argv)
  return train(
    args.norm,
    args.post_ln,
    args.steps,
    args.batch_size,
    args.context,
    args.dim,
    args.layers,
    args.lr,
    args.seed,
    out=args.out,
    api=args.api,
    qk_norm=args.qk_norm,
  )


if __name__ == "__main__":
  main()
