"""A small decoder-only Transformer, a character-level language model on real English text.

The corpus is the Book of Genesis in the King James Version (public domain, 197 KB,
``examples/data/genesis_kjv.txt``): the first 90 % trains, the last 10 % validates. The
model is a GPT-style stack of causal self-attention and MLP blocks with jaxnorm's LayerNorm
or RMSNorm, placed before each sublayer (Pre-LN, the default, with a final norm) or after
each residual addition (``--post-ln``, the original Transformer's placement).

  python examples/mini_transformer.py --norm layer --steps 800 --out results/mini_transformer

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
from tqdm import tqdm

import jaxnorm

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "genesis_kjv.txt")
NORMS = ("layer", "rms")


def make_norm(kind: str):
  """LayerNorm or RMSNorm over the model dimension."""
  if kind == "layer":
    return jaxnorm.LayerNorm()
  if kind == "rms":
    return jaxnorm.RMSNorm()
  raise ValueError(f"--norm must be one of {NORMS}, got {kind!r}")


class Block(nn.Module):
  """Causal self-attention and an MLP, each with a residual connection and a norm."""

  dim: int
  heads: int
  norm: str
  post_ln: bool

  @nn.compact
  def __call__(self, x, mask):
    def attention(h):
      return nn.MultiHeadDotProductAttention(self.heads, qkv_features=self.dim)(h, h, mask=mask)

    def mlp(h):
      return nn.Dense(self.dim)(nn.gelu(nn.Dense(4 * self.dim)(h)))

    for sublayer in (attention, mlp):
      if self.post_ln:
        x = make_norm(self.norm)(x + sublayer(x))
      else:
        x = x + sublayer(make_norm(self.norm)(x))
    return x


class CharTransformer(nn.Module):
  """Token and position embeddings, ``layers`` blocks, a final norm (Pre-LN), a readout."""

  vocab: int
  context: int = 64
  dim: int = 128
  heads: int = 4
  layers: int = 3
  norm: str = "layer"
  post_ln: bool = False

  @nn.compact
  def __call__(self, tokens):
    t = tokens.shape[-1]
    x = nn.Embed(self.vocab, self.dim)(tokens)
    x = x + nn.Embed(self.context, self.dim)(jnp.arange(t))[None]
    mask = nn.make_causal_mask(tokens)
    for _ in range(self.layers):
      x = Block(self.dim, self.heads, self.norm, self.post_ln)(x, mask)
    if not self.post_ln:
      x = make_norm(self.norm)(x)
    return nn.Dense(self.vocab)(x)


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


def generate(model, params, prompt: np.ndarray, length: int, key, temperature: float = 0.8):
  """Samples ``length`` characters after ``prompt`` (sliding the context window)."""

  @jax.jit
  def next_token(window, key):
    logits = model.apply({"params": params}, window[None])[0, -1]
    return jax.random.categorical(key, logits / temperature)

  tokens = list(prompt)
  for k in jax.random.split(key, length):
    window = np.array(tokens[-model.context :], dtype=np.int32)
    window = np.pad(window, (model.context - len(window), 0))  # left-pad to a fixed shape
    tokens.append(int(next_token(window, k)))
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
) -> dict:
  """Trains the model and returns the final metrics (also printed as the last JSON line);
  with ``history``, the returned dict (not the printed line) also holds the loss curves."""
  train_codes, val_codes, alphabet = load_text()
  model = CharTransformer(len(alphabet), context, dim, layers=layers, norm=norm, post_ln=post_ln)
  rng = np.random.default_rng(seed)
  params = model.init(jax.random.key(seed), np.zeros((1, context), np.int32))["params"]
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, lr, min(100, steps // 10 + 1), steps, lr * 0.05
  )
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
  opt_state = tx.init(params)

  def loss_fn(params, x, y):
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  eval_loss = jax.jit(loss_fn)
  val_rng = np.random.default_rng(seed + 1)
  val_set = [batches(val_codes, 64, context, val_rng) for _ in range(4)]  # fixed windows

  def validate(params):
    return float(np.mean([eval_loss(params, x, y) for x, y in val_set]))

  name = f"{norm}{'-post' if post_ln else '-pre'}"
  initial = validate(params)
  val_curve, train_curve, window = [initial], [], []
  start = time.perf_counter()
  bar = tqdm(range(1, steps + 1), desc=f"mini_transformer[{name}]", disable=not progress)
  for step in bar:
    params, opt_state, loss = train_step(
      params, opt_state, *batches(train_codes, batch_size, context, rng)
    )
    window.append(loss)
    if step % eval_every == 0 or step == steps:
      train_curve.append(float(jnp.mean(jnp.stack(window))))
      window = []
      val_curve.append(validate(params))
      bar.set_postfix(train=f"{train_curve[-1]:.3f}", val=f"{val_curve[-1]:.3f}")
  seconds = time.perf_counter() - start

  if sample_length:
    prompt = np.array([alphabet.index(c) for c in "And God said"], np.int32)
    sample = generate(model, params, prompt, sample_length, jax.random.key(seed))
    print("sample: And God said" + "".join(alphabet[i] for i in sample))
  metrics = dict(
    norm=norm,
    post_ln=post_ln,
    initial_loss=initial,
    final_loss=val_curve[-1],
    steps=steps,
    seconds=round(seconds, 2),
  )
  if out:
    metrics["plot"] = save_curves(
      os.path.join(out, f"mini_transformer_{name}.png"),
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
  ap.add_argument("--post-ln", action="store_true", help="norm after each residual addition")
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
  )


if __name__ == "__main__":
  main()
