"""A small class-conditional diffusion Transformer (DiT) on scikit-learn's bundled digits:
AdaLN-Zero blocks against the same model conditioned by an extra token.

Each 8×8 digit (scaled to [-1, 1]) is cut into 16 patches of 2×2; a Transformer of
``--depth`` blocks predicts the noise added at a diffusion step (DDPM's ε-prediction, a
cosine schedule of ``--timesteps`` steps), conditioned on the step and the digit's class.
Two conditionings, everything else the same (Peebles & Xie 2023 compare them at scale):

- ``adaln``: every block's two norms are :class:`jaxnorm.AdaLayerNorm` — LayerNorm without
  affine, then ``x̂·(1 + scale(c)) + shift(c)`` and a gate on the residual branch, the
  projection of the conditioning ``c`` zero-initialised (AdaLN-Zero), and the final norm
  modulated too;
- ``token``: plain :class:`jaxnorm.LayerNorm` blocks (Pre-LN) with ``c`` prepended to the
  patches as one more token (in-context conditioning).

Both are trained by the example (``--models`` picks), then sample with DDIM (deterministic,
``--timesteps`` steps) from the same noise: a grid of samples per class and the
validation-loss curves go to ``--out``. How well the samples follow their class is measured
by a logistic-regression classifier trained on real digits (its accuracy on held-out real
digits is printed next to it). Linen by default; ``--api nnx`` builds the same models with
``jaxnorm.nnx``.

  python examples/mini_dit.py
  python examples/mini_dit.py --api nnx --steps 500 --models adaln

Prints a progress bar per model and, as its last stdout line, one JSON object with the
metrics of each model.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import print_result, save_curves
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import jaxnorm
from jaxnorm import nnx as jnnx

SIDE, PATCH, CLASSES = 8, 2, 10
TOKENS, PATCH_DIM = (SIDE // PATCH) ** 2, PATCH * PATCH
MODELS = ("adaln", "token")


# --- data and diffusion ------------------------------------------------------------------


def load_data(seed: int = 0):
  """Digits in [-1, 1], ``(N, 8, 8)``, split 80/20 by class; labels; the raw 0..16 pixels."""
  digits = load_digits()
  x = digits.images.astype(np.float32) / 8.0 - 1.0
  return train_test_split(
    x, digits.target.astype(np.int32), test_size=0.2, random_state=seed, stratify=digits.target
  )


def patchify(x):
  """``(B, 8, 8)`` images as ``(B, 16, 4)`` patch tokens."""
  b = x.shape[0]
  x = x.reshape(b, SIDE // PATCH, PATCH, SIDE // PATCH, PATCH).transpose(0, 1, 3, 2, 4)
  return x.reshape(b, TOKENS, PATCH_DIM)


def unpatchify(tokens):
  b = tokens.shape[0]
  x = tokens.reshape(b, SIDE // PATCH, SIDE // PATCH, PATCH, PATCH).transpose(0, 1, 3, 2, 4)
  return x.reshape(b, SIDE, SIDE)


def cosine_schedule(timesteps: int) -> np.ndarray:
  """ᾱ_t of Nichol & Dhariwal's cosine schedule, t = 1..T (clipped away from 0)."""
  s = 0.008
  t = np.arange(timesteps + 1) / timesteps
  f = np.cos((t + s) / (1 + s) * np.pi / 2) ** 2
  return np.clip(f[1:] / f[0], 1e-4, 0.9999).astype(np.float32)


def timestep_embedding(t, dim: int):
  """Sinusoidal features of the (integer) diffusion step."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(half) / half)
  angles = t.astype(jnp.float32)[:, None] * freqs[None]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def noised(x0, t, noise, alpha_bar):
  """``x_t = sqrt(ᾱ_t)·x0 + sqrt(1 − ᾱ_t)·ε``."""
  ab = alpha_bar[t][:, None, None]
  return jnp.sqrt(ab) * x0 + jnp.sqrt(1 - ab) * noise


# --- Linen models ------------------------------------------------------------------------


class Conditioning(nn.Module):
  """``c``: an MLP of the step's sinusoidal features plus a learned class embedding."""

  dim: int

  @nn.compact
  def __call__(self, t, y):
    h = nn.Dense(self.dim)(nn.silu(nn.Dense(self.dim)(timestep_embedding(t, self.dim))))
    return h + nn.Embed(CLASSES, self.dim)(y)


class Block(nn.Module):
  """A DiT block: self-attention and an MLP, each after a norm, on the residual stream."""

  dim: int
  heads: int
  adaptive: bool

  @nn.compact
  def __call__(self, x, c):
    def attention(h):
      return nn.MultiHeadDotProductAttention(self.heads, qkv_features=self.dim)(h, h)

    def mlp(h):
      return nn.Dense(self.dim)(nn.gelu(nn.Dense(4 * self.dim)(h)))

    for sublayer in (attention, mlp):
      if self.adaptive:  # AdaLN-Zero: modulated norm, gated residual branch
        y, gate = jaxnorm.AdaLayerNorm()(x, c)
        x = jaxnorm.gated_residual(x, sublayer(y), gate)
      else:
        x = x + sublayer(jaxnorm.LayerNorm()(x))
    return x


class DiT(nn.Module):
  """Patches → ``depth`` blocks → the noise prediction, conditioned by ``adaln`` or a token."""

  dim: int = 64
  depth: int = 4
  heads: int = 4
  conditioning: str = "adaln"

  @nn.compact
  def __call__(self, x_t, t, y):
    x = nn.Dense(self.dim)(patchify(x_t))
    x = x + self.param("position", nn.initializers.normal(0.02), (TOKENS, self.dim))[None]
    c = Conditioning(self.dim)(t, y)
    adaptive = self.conditioning == "adaln"
    if not adaptive:
      x = jnp.concatenate([c[:, None], x], axis=1)  # the conditioning token, first
    for _ in range(self.depth):
      x = Block(self.dim, self.heads, adaptive)(x, c)
    if adaptive:
      h = jaxnorm.AdaLayerNorm(use_gate=False)(x, c)
    else:
      h = jaxnorm.LayerNorm()(x)[:, 1:]
    return unpatchify(nn.Dense(PATCH_DIM, kernel_init=nn.initializers.zeros)(h))


# --- NNX models --------------------------------------------------------------------------


class NNXConditioning(nnx.Module):
  def __init__(self, dim: int, *, rngs: nnx.Rngs):
    self.dim = dim
    self.t1, self.t2 = nnx.Linear(dim, dim, rngs=rngs), nnx.Linear(dim, dim, rngs=rngs)
    self.classes = nnx.Embed(CLASSES, dim, rngs=rngs)

  def __call__(self, t, y):
    return self.t2(nnx.silu(self.t1(timestep_embedding(t, self.dim)))) + self.classes(y)


class NNXBlock(nnx.Module):
  """:class:`Block` with ``jaxnorm.nnx``."""

  def __init__(self, dim: int, heads: int, adaptive: bool, *, rngs: nnx.Rngs):
    self.adaptive = adaptive
    self.attention = nnx.MultiHeadAttention(heads, dim, qkv_features=dim, decode=False, rngs=rngs)
    self.up, self.down = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)
    make = (lambda: jnnx.AdaLayerNorm(dim, dim, rngs=rngs)) if adaptive else (
      lambda: jnnx.LayerNorm(dim, rngs=rngs))  # fmt: skip
    self.norms = nnx.List([make(), make()])

  def __call__(self, x, c):
    sublayers = (lambda h: self.attention(h, h), lambda h: self.down(nnx.gelu(self.up(h))))
    for sublayer, norm in zip(sublayers, self.norms, strict=True):
      if self.adaptive:
        y, gate = norm(x, c)
        x = jaxnorm.gated_residual(x, sublayer(y), gate)
      else:
        x = x + sublayer(norm(x))
    return x


class NNXDiT(nnx.Module):
  """:class:`DiT` with ``jaxnorm.nnx``."""

  def __init__(self, dim=64, depth=4, heads=4, conditioning="adaln", *, rngs: nnx.Rngs):
    self.adaptive = conditioning == "adaln"
    self.embed = nnx.Linear(PATCH_DIM, dim, rngs=rngs)
    self.position = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (TOKENS, dim)))
    self.conditioning = NNXConditioning(dim, rngs=rngs)
    self.blocks = nnx.List(NNXBlock(dim, heads, self.adaptive, rngs=rngs) for _ in range(depth))
    if self.adaptive:
      self.final: nnx.Module = jnnx.AdaLayerNorm(dim, dim, use_gate=False, rngs=rngs)
    else:
      self.final = jnnx.LayerNorm(dim, rngs=rngs)
    self.out = nnx.Linear(dim, PATCH_DIM, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def __call__(self, x_t, t, y):
    x = self.embed(patchify(x_t)) + self.position[...][None]
    c = self.conditioning(t, y)
    if not self.adaptive:
      x = jnp.concatenate([c[:, None], x], axis=1)
    for block in self.blocks:
      x = block(x, c)
    h = self.final(x, c) if self.adaptive else self.final(x)[:, 1:]
    return unpatchify(self.out(h))


# --- training and sampling ---------------------------------------------------------------


def _loss(predict, x0, t, y, noise, alpha_bar):
  return jnp.mean((predict(noised(x0, t, noise, alpha_bar), t, y) - noise) ** 2)


def make_trainer(api: str, conditioning: str, dim: int, depth: int, seed: int, tx, alpha_bar):
  """``(train_step, loss, predict, parameter count)`` of one model in one front end:
  ``train_step(x0, t, y, noise) -> loss``, ``loss(x0, t, y, noise)`` and
  ``predict(x_t, t, y) -> ε̂``, each jitted."""
  if api == "linen":
    model = DiT(dim, depth, conditioning=conditioning)
    zeros = (jnp.zeros((1, SIDE, SIDE)), jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.int32))
    state = {"params": model.init(jax.random.key(seed), *zeros)["params"]}
    state["opt"] = tx.init(state["params"])

    @jax.jit
    def linen_step(params, opt, x0, t, y, noise):
      loss, grads = jax.value_and_grad(
        lambda p: _loss(lambda *a: model.apply({"params": p}, *a), x0, t, y, noise, alpha_bar)
      )(params)
      updates, opt = tx.update(grads, opt, params)
      return optax.apply_updates(params, updates), opt, loss

    def train_step(*batch):
      state["params"], state["opt"], loss = linen_step(state["params"], state["opt"], *batch)
      return loss

    apply = jax.jit(model.apply)
    loss_at = jax.jit(lambda p, *b: _loss(lambda *a: model.apply({"params": p}, *a), *b, alpha_bar))
    count = sum(p.size for p in jax.tree_util.tree_leaves(state["params"]))
    return (
      train_step,
      lambda *b: loss_at(state["params"], *b),
      lambda *a: apply({"params": state["params"]}, *a),
      count,
    )
  if api != "nnx":
    raise ValueError(f"api must be 'linen' or 'nnx', got {api!r}")
  nnx_model = NNXDiT(dim, depth, conditioning=conditioning, rngs=nnx.Rngs(seed))
  optimizer = nnx.Optimizer(nnx_model, tx, wrt=nnx.Param)

  @nnx.jit
  def nnx_step(m, opt, x0, t, y, noise):
    loss, grads = nnx.value_and_grad(lambda m: _loss(m, x0, t, y, noise, alpha_bar))(m)
    opt.update(m, grads)
    return loss

  predict = nnx.jit(lambda m, *a: m(*a))
  loss_at = nnx.jit(lambda m, *b: _loss(m, *b, alpha_bar))
  count = sum(p.size for p in jax.tree_util.tree_leaves(nnx.state(nnx_model, nnx.Param)))
  return (
    lambda *b: nnx_step(nnx_model, optimizer, *b),
    lambda *b: loss_at(nnx_model, *b),
    lambda *a: predict(nnx_model, *a),
    count,
  )


def ddim_sample(predict, y, noise, alpha_bar):
  """Deterministic DDIM (η = 0) over every step, from ``noise``, for classes ``y``."""
  x = noise
  steps = len(alpha_bar)
  for t in range(steps - 1, -1, -1):
    ab = alpha_bar[t]
    ab_prev = alpha_bar[t - 1] if t > 0 else 1.0
    eps = predict(x, jnp.full((x.shape[0],), t, jnp.int32), y)
    x0 = jnp.clip((x - np.sqrt(1 - ab) * eps) / np.sqrt(ab), -1, 1)
    x = np.sqrt(ab_prev) * x0 + np.sqrt(1 - ab_prev) * eps
  return np.asarray(x)


def save_grid(path: str, title: str, samples: np.ndarray, per_class: int) -> str:
  """One row per class, ``per_class`` samples each."""
  import matplotlib.pyplot as plt

  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  rows = samples.reshape(CLASSES, -1, SIDE, SIDE)[:, :per_class]
  grid = -np.ones((CLASSES * (SIDE + 1), per_class * (SIDE + 1)))  # white between digits
  for i in range(CLASSES):
    for j in range(per_class):
      grid[i * (SIDE + 1) : i * (SIDE + 1) + SIDE, j * (SIDE + 1) : j * (SIDE + 1) + SIDE] = rows[
        i, j
      ]
  fig, ax = plt.subplots(figsize=(per_class * 0.5 + 1, CLASSES * 0.5 + 0.6))
  ax.imshow(grid, cmap="gray_r", vmin=-1, vmax=1)
  ax.set_yticks([i * (SIDE + 1) + SIDE / 2 for i in range(CLASSES)], [str(i) for i in range(10)])
  ax.set_xticks([])
  ax.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def train(
  models: tuple[str, ...] = MODELS,
  api: str = "linen",
  steps: int = 2000,
  batch_size: int = 64,
  dim: int = 64,
  depth: int = 4,
  timesteps: int = 100,
  lr: float = 2e-3,
  seed: int = 0,
  eval_every: int = 250,
  per_class: int = 30,
  out: str | None = "results/mini_dit",
  progress: bool = True,
) -> dict:
  """Trains each of ``models``, samples ``per_class`` digits of every class, and returns
  (and prints as the last JSON line) the metrics."""
  x_train, x_test, y_train, y_test = load_data(seed)
  alpha_bar = jnp.asarray(cosine_schedule(timesteps))
  classifier = LogisticRegression(max_iter=3000).fit(x_train.reshape(len(x_train), -1), y_train)
  metrics: dict = dict(api=api, steps=steps, timesteps=timesteps,
                       classifier_accuracy_on_real=round(float(classifier.score(
                         x_test.reshape(len(x_test), -1), y_test)), 3))  # fmt: skip
  val_rng = np.random.default_rng(seed + 1)
  val = [(x_test, val_rng.integers(0, timesteps, len(x_test)).astype(np.int32), y_test,
          val_rng.normal(size=x_test.shape).astype(np.float32)) for _ in range(2)]  # fmt: skip
  labels = np.repeat(np.arange(CLASSES, dtype=np.int32), per_class)
  start_noise = np.random.default_rng(seed + 2).normal(size=(len(labels), SIDE, SIDE))
  curves = {}
  for name in models:
    if name not in MODELS:
      raise ValueError(f"models must be among {MODELS}, got {name!r}")
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, steps // 20 + 1, steps, lr * 0.02)
    tx = optax.adamw(schedule, weight_decay=0.0)
    train_step, loss_at, predict, count = make_trainer(api, name, dim, depth, seed, tx, alpha_bar)
    rng = np.random.default_rng(seed)

    def val_loss(loss_at=loss_at):
      return float(np.mean([loss_at(*batch) for batch in val]))

    curve, begin = [], time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc=f"mini_dit[{api}, {name}]", disable=not progress)
    for step in bar:
      i = rng.integers(0, len(x_train), batch_size)
      t = rng.integers(0, timesteps, batch_size).astype(np.int32)
      loss = train_step(x_train[i], t, y_train[i], rng.normal(size=(batch_size, SIDE, SIDE)))
      if step % eval_every == 0 or step == steps:
        curve.append(val_loss())
        bar.set_postfix(loss=f"{float(loss):.4f}", val=f"{curve[-1]:.4f}")
    seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    samples = ddim_sample(predict, jnp.asarray(labels), jnp.asarray(start_noise), alpha_bar)
    sampling = time.perf_counter() - begin
    predicted = classifier.predict(samples.reshape(len(samples), -1))
    metrics[name] = dict(
      val_loss=round(curve[-1], 4),
      class_accuracy=round(float(np.mean(predicted == labels)), 3),
      parameters=int(count),
      seconds=round(seconds, 1),
      sampling_seconds=round(sampling, 1),
    )
    curves[name] = curve
    if out:
      metrics[name]["samples"] = save_grid(
        os.path.join(out, f"mini_dit_{'' if api == 'linen' else api + '_'}{name}_samples.png"),
        f"{name}: DDIM samples, one class per row "
        f"({metrics[name]['class_accuracy']:.0%} classified as their class)",
        samples,
        min(per_class, 12),
      )
  if out:
    metrics["plot"] = save_curves(
      os.path.join(out, f"mini_dit_{'' if api == 'linen' else api + '_'}loss.png"),
      "class-conditional DiT on digits: AdaLN-Zero vs an in-context token",
      [("validation ε-prediction loss", curves)],
      f"× {eval_every} steps",
    )
  print_result(metrics)
  return metrics


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: adaln,token")
  ap.add_argument("--api", choices=("linen", "nnx"), default="linen", help="Flax front end")
  ap.add_argument("--steps", type=int, default=2000)
  ap.add_argument("--batch-size", type=int, default=64)
  ap.add_argument("--dim", type=int, default=64)
  ap.add_argument("--depth", type=int, default=4)
  ap.add_argument("--timesteps", type=int, default=100)
  ap.add_argument("--lr", type=float, default=2e-3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--eval-every", type=int, default=250, help="steps between validations")
  ap.add_argument("--per-class", type=int, default=30, help="samples per class to classify")
  ap.add_argument("--out", default="results/mini_dit", help="folder for the figures")
  args = ap.parse_args(argv)
  return train(
    tuple(m for m in args.models.split(",") if m),
    args.api,
    args.steps,
    args.batch_size,
    args.dim,
    args.depth,
    args.timesteps,
    args.lr,
    args.seed,
    eval_every=args.eval_every,
    per_class=args.per_class,
    out=args.out,
  )


if __name__ == "__main__":
  main()
