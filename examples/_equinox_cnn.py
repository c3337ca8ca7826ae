"""The mini CNN of ``mini_cnn.py`` in Equinox, with ``jaxnorm.equinox``'s norms
(``--api equinox``): Equinox's per-example convention (channels-first ``(C, H, W)`` images,
the model mapped over the batch with ``jax.vmap``), BatchNorm's running statistics in an
``eqx.nn.State``, ``eqx.filter_jit``/``eqx.filter_value_and_grad``, and
``eqx.nn.inference_mode`` for evaluation. Imported only for ``--api equinox``, so Equinox
stays optional (``pip install "jaxnorm[equinox]"``)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import jaxnorm.equinox as jeqx

EQUINOX_NORMS = ("batch", "group", "layer", "rms", "none")
WIDTHS = (1, 16, 32, 64)
SIDES = (8, 4, 4)  # the feature maps' side after each convolution (a 2x2 pool after the first)


def make_equinox_norm(kind: str, channels: int, side: int):
  """The norm for ``kind`` on one ``(channels, side, side)`` feature map (None for none)."""
  if kind == "batch":
    return jeqx.BatchNorm(channels, "batch", momentum=0.9, mode="batch")
  if kind == "group":
    return jeqx.GroupNorm(4, channels)
  if kind == "layer":
    return jeqx.LayerNorm((channels, side, side))
  if kind == "rms":
    return jeqx.RMSNorm((channels, side, side))
  if kind == "none":
    return None
  raise ValueError(
    f"--api equinox has the norms {EQUINOX_NORMS} (jaxnorm.equinox: LayerNorm, RMSNorm, "
    f"GroupNorm, BatchNorm), got --norm {kind!r}; use --api linen or nnx for the others."
  )


class EquinoxCNN(eqx.Module):
  """Three conv → norm → ReLU blocks, a global average and a linear head, on one image."""

  convs: list
  norms: list
  head: eqx.nn.Linear

  def __init__(self, norm: str, key: jax.Array):
    keys = jax.random.split(key, len(WIDTHS))
    self.convs = [
      eqx.nn.Conv2d(a, b, 3, padding="SAME", use_bias=norm == "none", key=k)
      for a, b, k in zip(WIDTHS, WIDTHS[1:], keys, strict=False)
    ]
    self.norms = [make_equinox_norm(norm, c, s) for c, s in zip(WIDTHS[1:], SIDES, strict=True)]
    self.head = eqx.nn.Linear(WIDTHS[-1], 10, key=keys[-1])

  def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
    for i, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
      x = conv(x)
      if norm is not None:
        x, state = norm(x, state)
      x = jax.nn.relu(x)
      if i == 0:
        x = eqx.nn.AvgPool2d(2, 2)(x)
    return self.head(x.mean((1, 2))), state


def _batched(model):
  return jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))


def equinox_trainer(norm: str, seed: int, tx):
  """``(step(xb, yb) -> loss, predict(x) -> labels)`` on NHWC images (transposed here)."""
  model, state = eqx.nn.make_with_state(EquinoxCNN)(norm, jax.random.key(seed))
  box = dict(model=model, state=state, opt=tx.init(eqx.filter(model, eqx.is_inexact_array)))

  @eqx.filter_jit
  def train_step(model, state, opt_state, xb, yb):
    def loss_fn(model):
      logits, new_state = _batched(model)(xb, state)
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), new_state

    (loss, state), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), state, opt_state, loss

  @eqx.filter_jit
  def predict(model, state, xb):
    return jnp.argmax(_batched(eqx.nn.inference_mode(model))(xb, state)[0], -1)

  def step(xb, yb):
    xb = jnp.transpose(jnp.asarray(xb), (0, 3, 1, 2))
    box["model"], box["state"], box["opt"], loss = train_step(
      box["model"], box["state"], box["opt"], xb, yb
    )
    return loss

  def evaluate(x):
    return predict(box["model"], box["state"], jnp.transpose(jnp.asarray(x), (0, 3, 1, 2)))

  return step, evaluate
