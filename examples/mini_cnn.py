"""A small CNN on scikit-learn's bundled handwritten digits, with any of jaxnorm's norms.

1797 real 8×8 images that install with scikit-learn (no download), a fixed stratified
75/25 split, three convolution blocks (conv → norm → ReLU), Adam, one jit-compiled train
step. BatchNorm trains on batch statistics (``mutable=['batch_stats']``) and evaluates with
its running averages, so an image gets the same prediction alone or in a batch. The same
network is written three times, with the Linen modules (``--api linen``, the default),
with ``jaxnorm.nnx`` (``--api nnx``: ``nnx.Optimizer``, ``nnx.jit``, ``.train()``/``.eval()``)
and with ``jaxnorm.equinox`` (``--api equinox``, in ``_equinox_cnn.py``: per-image modules
under ``jax.vmap``, ``eqx.nn.State``; needs ``pip install "jaxnorm[equinox]"``).

  python examples/mini_cnn.py --norm batch --epochs 12 --out results/mini_cnn
  python examples/mini_cnn.py --api nnx --norm batch
  python examples/mini_cnn.py --api equinox --norm batch

Prints a progress bar, then, as its last stdout line, one JSON object with the final
metrics; saves a plot of training loss and test accuracy per epoch into ``--out``.
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
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import jaxnorm
from jaxnorm import nnx as jnnx

NORMS = ("batch", "renorm", "ghost", "group", "layer", "instance", "rms", "none")
GHOST = 4  # examples per virtual batch of --norm ghost (fewer when the batch is smaller)


def renorm_schedule(total_steps: int) -> dict:
  """Batch Renorm's schedule scaled to a run of ``total_steps``, in the paper's proportions
  (warm-up 5k, d_max reached at 25k, r_max at 40k, of a longer run): r_max reached halfway."""
  r_steps = max(1, total_steps // 2)
  return dict(warmup_steps=r_steps // 8, r_max_steps=r_steps, d_max_steps=r_steps * 5 // 8)


def make_norm(
  kind: str, train: bool, axis_name: str | None = None, batch_size: int = 32, steps: int = 1000
):
  """The norm layer for ``kind`` on NHWC feature maps (``none``: identity). ``axis_name``
  names the device axis BatchNorm synchronizes its statistics over (data parallelism);
  ``batch_size`` and ``steps`` set the ghost batches and the renorm schedule."""
  if kind == "batch":
    return jaxnorm.BatchNorm(use_running_average=not train, momentum=0.9, axis_name=axis_name)
  if kind == "renorm":
    return jaxnorm.BatchRenorm(
      use_running_average=not train, momentum=0.9, axis_name=axis_name, **renorm_schedule(steps)
    )
  if kind == "ghost":
    return jaxnorm.BatchNorm(
      use_running_average=not train, momentum=0.9, virtual_batch_size=min(GHOST, batch_size)
    )
  if kind == "frozen":  # fine-tuning a BatchNorm model: loads its variables unchanged
    return jaxnorm.FrozenBatchNorm()
  if kind == "group":
    return jaxnorm.GroupNorm(num_groups=4)
  if kind == "layer":
    return jaxnorm.LayerNorm(reduction_axes=(1, 2, 3), feature_axes=-1)
  if kind == "instance":
    return jaxnorm.InstanceNorm()
  if kind == "rms":
    return jaxnorm.RMSNorm(reduction_axes=(1, 2, 3), feature_axes=-1)
  if kind == "none":
    return lambda x: x
  raise ValueError(f"--norm must be one of {NORMS}, got {kind!r}")


class CNN(nn.Module):
  """Three blocks conv(3×3) → norm → ReLU (16, 32, 64 channels; 2×2 pooling after the
  first), global average pooling, a linear classifier."""

  norm: str = "batch"
  axis_name: str | None = None
  batch_size: int = 32
  steps: int = 1000

  @nn.compact
  def __call__(self, x, train: bool):
    for i, channels in enumerate((16, 32, 64)):
      x = nn.Conv(channels, (3, 3), use_bias=self.norm == "none")(x)
      norm = make_norm(self.norm, train, self.axis_name, self.batch_size, self.steps)
      x = nn.relu(norm(x))
      if i == 0:
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    return nn.Dense(10)(x.mean((1, 2)))


def make_nnx_norm(kind: str, channels: int, rngs: nnx.Rngs, batch_size: int = 32, steps=1000):
  """:func:`make_norm` with ``jaxnorm.nnx``'s modules (None for ``none``)."""
  if kind == "batch":
    return jnnx.BatchNorm(channels, momentum=0.9, rngs=rngs)
  if kind == "renorm":
    return jnnx.BatchRenorm(channels, momentum=0.9, rngs=rngs, **renorm_schedule(steps))
  if kind == "ghost":
    vbs = min(GHOST, batch_size)
    return jnnx.BatchNorm(channels, momentum=0.9, virtual_batch_size=vbs, rngs=rngs)
  if kind == "group":
    return jnnx.GroupNorm(channels, 4, rngs=rngs)
  if kind == "layer":
    return jnnx.LayerNorm(channels, reduction_axes=(1, 2, 3), feature_axes=-1, rngs=rngs)
  if kind == "instance":
    return jnnx.InstanceNorm(channels, rngs=rngs)
  if kind == "rms":
    return jnnx.RMSNorm(channels, reduction_axes=(1, 2, 3), feature_axes=-1, rngs=rngs)
  if kind == "none":
    return None
  raise ValueError(f"--norm must be one of {NORMS}, got {kind!r}")


class NNXCNN(nnx.Module):
  """:class:`CNN` as an NNX module (BatchNorm's mode: ``.train()`` / ``.eval()``)."""

  def __init__(self, norm: str = "batch", *, rngs: nnx.Rngs, batch_size: int = 32, steps=1000):
    widths = (1, 16, 32, 64)
    self.convs = nnx.List(
      nnx.Conv(a, b, (3, 3), use_bias=norm == "none", rngs=rngs)
      for a, b in zip(widths, widths[1:], strict=False)
    )
    self.norms = nnx.List(make_nnx_norm(norm, c, rngs, batch_size, steps) for c in widths[1:])
    self.head = nnx.Linear(64, 10, rngs=rngs)

  def __call__(self, x):
    for i, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
      x = conv(x)
      x = nnx.relu(x if norm is None else norm(x))
      if i == 0:
        x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
    return self.head(x.mean((1, 2)))


def linen_trainer(norm: str, x0, seed: int, tx, steps: int = 1000, variables=None):
  """``(step(xb, yb) -> loss, predict(x) -> labels, state)`` for the Linen :class:`CNN`,
  from ``variables`` when given (fine-tuning); ``state["variables"]`` holds the current ones."""
  model = CNN(norm, batch_size=len(x0), steps=steps)
  if variables is None:
    variables = model.init(jax.random.key(seed), x0, train=False)
  state = dict(variables=variables, opt_state=tx.init(variables["params"]))

  @jax.jit
  def train_step(variables, opt_state, xb, yb):
    def loss_fn(params):
      logits, updates = model.apply(
        {**variables, "params": params}, xb, train=True, mutable=["batch_stats"]
      )
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
      return loss, updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"])
    param_updates, opt_state = tx.update(grads, opt_state, variables["params"])
    params = optax.apply_updates(variables["params"], param_updates)
    return {**variables, **updates, "params": params}, opt_state, loss

  @jax.jit
  def predict(variables, xb):
    return jnp.argmax(model.apply(variables, xb, train=False), -1)

  def step(xb, yb):
    state["variables"], state["opt_state"], loss = train_step(
      state["variables"], state["opt_state"], xb, yb
    )
    return loss

  return step, lambda x: predict(state["variables"], x), state


def nnx_trainer(norm: str, seed: int, tx, batch_size: int = 32, steps: int = 1000):
  """``(step, predict)`` for :class:`NNXCNN`: the model and optimizer are updated in place."""
  model = NNXCNN(norm, rngs=nnx.Rngs(seed), batch_size=batch_size, steps=steps)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, xb, yb):
    def loss_fn(model):
      return optax.softmax_cross_entropy_with_integer_labels(model(xb), yb).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  @nnx.jit
  def predict(model, xb):
    return jnp.argmax(model(xb), -1)

  def step(xb, yb):
    model.train()
    return train_step(model, optimizer, xb, yb)

  def evaluate(x):
    model.eval()
    return predict(model, x)

  return step, evaluate


def load_data(seed: int = 0):
  """Digits as (N, 8, 8, 1) float32 in [0, 1], split 75/25 with a fixed stratified split."""
  digits = load_digits()
  x = (digits.images.astype(np.float32) / 16.0)[..., None]
  return train_test_split(
    x, digits.target, test_size=0.25, random_state=seed, stratify=digits.target
  )


def batches(labels, batch_size: int, order: str, rng) -> list[np.ndarray]:
  """One epoch's batches of indices (full batches only). ``iid``: a random permutation;
  ``by-class``: every batch holds one class (non-i.i.d. batches, where BatchNorm's batch
  statistics and its running averages disagree most), batches in random order."""
  if order == "iid":
    perm = rng.permutation(len(labels))
    return [perm[i : i + batch_size] for i in range(0, len(perm) - batch_size + 1, batch_size)]
  if order != "by-class":
    raise ValueError(f"order must be 'iid' or 'by-class', got {order!r}")
  out = []
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    out += [idx[i : i + batch_size] for i in range(0, len(idx) - batch_size + 1, batch_size)]
  return [out[i] for i in rng.permutation(len(out))]


def train(
  norm: str = "batch",
  batch_size: int = 32,
  epochs: int = 12,
  seed: int = 0,
  lr: float = 3e-3,
  out: str | None = "results/mini_cnn",
  max_train: int | None = None,
  progress: bool = True,
  api: str = "linen",
  order: str = "iid",
) -> dict:
  """Trains the CNN and returns the final metrics (also printed as the last JSON line).
  ``order`` is the batch order (:func:`batches`)."""
  x_train, x_test, y_train, y_test = load_data()
  if max_train is not None:
    x_train, y_train = x_train[:max_train], y_train[:max_train]
  total = epochs * len(batches(y_train, batch_size, order, np.random.default_rng(0)))
  tx = optax.adam(optax.cosine_decay_schedule(lr, total, alpha=0.05))
  if api == "linen":
    step, predict, _ = linen_trainer(norm, x_train[:batch_size], seed, tx, total)
  elif api == "nnx":
    step, predict = nnx_trainer(norm, seed, tx, batch_size, total)
  elif api == "equinox":
    from _equinox_cnn import equinox_trainer  # Equinox is optional: imported only here

    step, predict = equinox_trainer(norm, seed, tx)
  else:
    raise ValueError(f"api must be 'linen', 'nnx' or 'equinox', got {api!r}")

  rng = np.random.default_rng(seed)
  losses, accuracies = [], []
  start = time.perf_counter()
  bar = tqdm(range(epochs), desc=f"mini_cnn[{api}, {norm}]", disable=not progress)
  for _ in bar:
    epoch_loss = []
    for idx in batches(y_train, batch_size, order, rng):
      epoch_loss.append(step(x_train[idx], y_train[idx]))
    losses.append(float(jnp.mean(jnp.stack(epoch_loss))))
    accuracies.append(float(np.mean(np.asarray(predict(x_test)) == y_test)))
    bar.set_postfix(loss=f"{losses[-1]:.3f}", test_acc=f"{accuracies[-1]:.3f}")
  seconds = time.perf_counter() - start

  metrics = dict(
    norm=norm,
    api=api,
    test_accuracy=accuracies[-1],
    epochs=epochs,
    seconds=round(seconds, 2),
    batch_size=batch_size,
    order=order,
    initial_loss=losses[0],
    final_loss=losses[-1],
  )
  if out:
    metrics["plot"] = save_curves(
      os.path.join(out, f"mini_cnn_{norm}.png" if api == "linen" else f"mini_cnn_{api}_{norm}.png"),
      f"mini CNN on digits, norm={norm}, api={api}",
      [("training loss", {norm: losses}), ("test accuracy", {norm: accuracies})],
      "epoch",
    )
  print_result(metrics)
  return metrics


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--norm", choices=NORMS, default="batch")
  ap.add_argument(
    "--api", choices=("linen", "nnx", "equinox"), default="linen", help="the front end"
  )
  ap.add_argument("--batch-size", type=int, default=32)
  ap.add_argument("--epochs", type=int, default=12)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--order", choices=("iid", "by-class"), default="iid", help="batch order")
  ap.add_argument("--out", default="results/mini_cnn", help="folder for the plot")
  args = ap.parse_args(argv)
  return train(
    args.norm, args.batch_size, args.epochs, args.seed, args.lr, args.out, api=args.api,
    order=args.order,
  )  # fmt: skip


if __name__ == "__main__":
  main()
