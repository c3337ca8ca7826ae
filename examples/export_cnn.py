"""Deploying the mini CNN: BatchNorm folded into its convolutions, exported with
``jax.export`` for every accelerator, serialized, reloaded and checked.

Trains the mini CNN with BatchNorm (``examples/mini_cnn.py``), folds each inference-mode
BatchNorm into the convolution before it (``jaxnorm.fold_batch_norms``: the same network
without norms, ``--norm none``, whose convolutions have a bias), exports the folded
model's prediction function for the ``cpu``, ``cuda``, ``rocm`` and ``tpu`` platforms
(one StableHLO artifact), writes it to ``--out``, reads it back and runs it here, and
compares its logits with the unfolded model's on the test set.

  python examples/export_cnn.py [--epochs 6] [--out results/export_cnn] [--seeds 1]

Prints, as its last stdout line, one JSON object: the test accuracy of both models, the
largest logit difference, whether every prediction agrees, and the artifact's size. With
``--seeds N`` it trains N models (seeds 0 to N − 1), prints each one's line, then one
line of ranges over the seeds (the figures the deploying guide quotes: one training's
logit difference is one sample).
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import mini_cnn
import numpy as np
import optax
from _common import print_result
from jax import export

import jaxnorm

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
PAIRS = {f"Conv_{i}": f"BatchNorm_{i}" for i in range(3)}  # each conv and the norm after it


def train_cnn(epochs: int, seed: int = 0, batch_size: int = 32):
  """The trained BatchNorm CNN's variables and the data."""
  x_train, x_test, y_train, y_test = mini_cnn.load_data()
  steps = epochs * len(mini_cnn.batches(y_train, batch_size, "iid", np.random.default_rng(0)))
  tx = optax.adam(optax.cosine_decay_schedule(3e-3, steps, alpha=0.05))
  step, _, state = mini_cnn.linen_trainer("batch", x_train[:batch_size], seed, tx, steps)
  rng = np.random.default_rng(seed)
  for _ in range(epochs):
    for idx in mini_cnn.batches(y_train, batch_size, "iid", rng):
      step(x_train[idx], y_train[idx])
  return state["variables"], (x_test, y_test)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--epochs", type=int, default=6)
  ap.add_argument("--out", default="results/export_cnn", help="folder for the artifact")
  ap.add_argument("--seeds", type=int, default=1, help="models trained (seeds 0..N-1)")
  args = ap.parse_args(argv)
  results = [run(args.epochs, seed, args.out) for seed in range(args.seeds)]
  if args.seeds > 1:
    print_result(
      dict(
        seeds=args.seeds,
        test_accuracy=_span(r["test_accuracy"] for r in results),
        max_logit_difference=_span(r["max_logit_difference"] for r in results),
        max_logit=_span(r["max_logit"] for r in results),
        predictions_agree=all(r["predictions_agree"] for r in results),
        exported_accuracy_equal=all(
          r["test_accuracy"] == r["exported_test_accuracy"] for r in results
        ),
      )
    )


def _span(values):
  values = list(values)
  return [min(values), max(values)]


def run(epochs: int, seed: int, out: str) -> dict:
  """Train (``seed``), fold, export, reload and compare: the figures of one model."""
  variables, (x_test, y_test) = train_cnn(epochs, seed)
  model, plain = mini_cnn.CNN("batch"), mini_cnn.CNN("none")
  # Each norm's own ε, read off the model (the variables do not hold it).
  epsilon = jaxnorm.batch_norm_epsilons(model, x_test[:1], train=False)
  folded = jaxnorm.fold_batch_norms(variables, PAIRS, epsilon=epsilon)

  def logits(x):
    return plain.apply(folded, x, train=False)

  exported = export.export(jax.jit(logits), platforms=PLATFORMS)(
    jax.ShapeDtypeStruct((export.symbolic_shape("b")[0], 8, 8, 1), jnp.float32)
  )
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, "mini_cnn_folded.jax_exported")
  with open(path, "wb") as f:
    f.write(exported.serialize())
  with open(path, "rb") as f:
    reloaded = export.deserialize(bytearray(f.read()))

  want = np.asarray(model.apply(variables, x_test, train=False))
  got = np.asarray(reloaded.call(x_test))  # any batch size: the batch dimension is symbolic
  result = dict(
    seed=seed,
    platforms=list(reloaded.platforms),
    test_accuracy=float(np.mean(want.argmax(-1) == y_test)),
    exported_test_accuracy=float(np.mean(got.argmax(-1) == y_test)),
    max_logit_difference=float(np.abs(got - want).max()),
    max_logit=float(np.abs(want).max()),
    predictions_agree=bool(np.all(got.argmax(-1) == want.argmax(-1))),
    artifact_bytes=os.path.getsize(path),
    artifact=path,
  )
  print_result(result)
  return result


if __name__ == "__main__":
  main()
