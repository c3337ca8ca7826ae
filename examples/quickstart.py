"""Quick start: a Flax MLP with jaxnorm's BatchNorm and LayerNorm on real data.

Trains on scikit-learn's bundled handwritten digits (1797 8×8 images, no download), then
shows the accuracy of jaxnorm's variance where Flax's fast formula breaks down.

  pip install -e ".[examples]" && python examples/quickstart.py
"""

from __future__ import annotations

import json
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import jaxnorm


class MLP(nn.Module):
  """Dense → BatchNorm → ReLU → Dense → LayerNorm → ReLU → Dense."""

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Dense(128)(x)
    x = nn.relu(jaxnorm.BatchNorm(use_running_average=not train, momentum=0.9)(x))
    x = nn.Dense(64)(x)
    x = nn.relu(jaxnorm.LayerNorm()(x))
    return nn.Dense(10)(x)


def main(steps: int = 300, batch_size: int = 64, seed: int = 0) -> dict:
  digits = load_digits()
  x = digits.data.astype(np.float32) / 16.0
  x_train, x_test, y_train, y_test = train_test_split(
    x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
  )
  model = MLP()
  variables = model.init(jax.random.key(seed), x_train[:2], train=False)
  tx = optax.adam(3e-3)
  opt_state = tx.init(variables["params"])

  @jax.jit
  def train_step(variables, opt_state, xb, yb):
    def loss_fn(params):
      logits, updates = model.apply(
        {**variables, "params": params}, xb, train=True, mutable=["batch_stats"]
      )
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"])
    param_updates, opt_state = tx.update(grads, opt_state, variables["params"])
    params = optax.apply_updates(variables["params"], param_updates)
    return {"params": params, **updates}, opt_state, loss

  @jax.jit
  def accuracy(variables, xb, yb):
    return jnp.mean(jnp.argmax(model.apply(variables, xb, train=False), -1) == yb)

  rng = np.random.default_rng(seed)
  start = time.perf_counter()
  for step in range(steps):
    idx = rng.choice(len(x_train), batch_size, replace=False)
    variables, opt_state, loss = train_step(variables, opt_state, x_train[idx], y_train[idx])
    if step % 100 == 0:
      print(f"step {step:4d}  loss {float(loss):.4f}")
  acc = float(accuracy(variables, x_test, y_test))
  print(f"test accuracy {acc:.3f} after {steps} steps ({time.perf_counter() - start:.1f} s)")

  # Data far off-centre: mean 1e4, std 1. Flax's E[x²] − E[x]² loses every digit there.
  off = np.random.default_rng(1).normal(1e4, 1.0, (64, 256)).astype(np.float32)
  exact = (off - off.astype(np.float64).mean(-1, keepdims=True)) / off.astype(np.float64).std(
    -1, keepdims=True
  )
  flax_ln, our_ln = nn.LayerNorm(), jaxnorm.LayerNorm()
  params = flax_ln.init(jax.random.key(0), off)
  flax_err = float(np.abs(np.asarray(flax_ln.apply(params, off)) - exact).max())
  our_err = float(np.abs(np.asarray(our_ln.apply(params, off)) - exact).max())
  print(f"LayerNorm at mean 1e4: max error flax.linen {flax_err:.3g}, jaxnorm {our_err:.3g}")
  result = dict(test_accuracy=acc, steps=steps, flax_error=flax_err, jaxnorm_error=our_err)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
