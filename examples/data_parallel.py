"""The mini CNN trained data-parallel over every local device, with synchronized BatchNorm.

The global batch is split across a one-axis device mesh (``jax.shard_map``); each device
runs the model on its shard, BatchNorm combines its statistics over the ``data`` axis
(count-weighted, exact: the same as one device seeing the whole batch), the loss is the
mean over the global batch and ``jax.grad`` differentiates through the whole sharded step,
so the training is the same, step for step, on 1 or 8 devices. Runs on one device as is;
to see 8 on a CPU:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/data_parallel.py

With more than one device it also runs the same steps on a single device and prints that
the step-by-step losses match. The last stdout line is a JSON object with the results. The
same code runs on several GPUs, TPU cores or, after ``jax.distributed.initialize()``, hosts.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import optax
from _common import print_result
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from mini_cnn import CNN, load_data


def make_step(model, mesh, tx):
  """A jit-compiled data-parallel train step over ``mesh``'s ``data`` axis.

  Returns ``step(params, batch_stats, opt_state, x, y) -> (params, batch_stats, opt_state,
  loss)``; ``x`` and ``y`` are global batches sharded along ``data``, the rest replicated.
  """

  def shard_loss(params, batch_stats, x, y):
    logits, updates = model.apply(
      {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
    )
    loss_sum = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
    return jax.lax.psum(loss_sum, "data"), updates["batch_stats"]

  sharded = jax.shard_map(
    shard_loss, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P())
  )

  def loss_fn(params, batch_stats, x, y):
    loss_sum, new_stats = sharded(params, batch_stats, x, y)
    return loss_sum / x.shape[0], new_stats

  @jax.jit
  def step(params, batch_stats, opt_state, x, y):
    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_stats, opt_state, loss

  return step


def global_array(value, sharding):
  """A global ``jax.Array`` of ``value`` (the same host value on every process) laid out by
  ``sharding``; each process fills only the shards of its own devices (multi-host safe)."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def train(
  devices=None, steps: int = 30, batch_size: int = 64, seed: int = 0, lr: float = 0.05, data=None
) -> dict:
  """Trains ``steps`` steps over ``devices`` (default: all local ones) and returns the
  per-step losses and the final ``batch_stats``.

  ``data`` is ``(x, y)`` for the steps' global batches, taken in order (default: the
  digits training split); every device count thus sees the same batches.
  """
  devices = list(devices if devices is not None else jax.local_devices())
  if batch_size % len(devices):
    raise ValueError(
      f"--batch-size {batch_size} must be a multiple of the {len(devices)} "
      f"devices; e.g. {len(devices) * (batch_size // len(devices) + 1)}."
    )
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  x_all, y_all = data if data is not None else load_data()[0::2]
  model = CNN("batch", axis_name="data")
  variables = CNN("batch").init(jax.random.key(seed), x_all[:batch_size], train=False)
  tx = optax.sgd(lr, momentum=0.9)
  replicated, data_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  params, batch_stats = jax.tree_util.tree_map(
    lambda v: global_array(v, replicated), (variables["params"], variables["batch_stats"])
  )
  opt_state = jax.jit(tx.init, out_shardings=replicated)(params)
  step = make_step(model, mesh, tx)
  losses = []
  start = time.perf_counter()
  for i in range(steps):
    lo = (i * batch_size) % (len(x_all) - batch_size)
    x = global_array(x_all[lo : lo + batch_size], data_sharding)
    y = global_array(y_all[lo : lo + batch_size], data_sharding)
    params, batch_stats, opt_state, loss = step(params, batch_stats, opt_state, x, y)
    losses.append(float(loss))
  return dict(
    devices=len(devices),
    losses=losses,
    batch_stats=batch_stats,
    params=params,
    seconds=time.perf_counter() - start,
  )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--batch-size", type=int, default=64)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  run = train(steps=args.steps, batch_size=args.batch_size, seed=args.seed)
  print(
    f"{run['devices']} device(s): loss {run['losses'][0]:.4f} -> {run['losses'][-1]:.4f} "
    f"in {args.steps} steps ({run['seconds']:.1f} s)"
  )
  result = dict(
    devices=run["devices"],
    steps=args.steps,
    initial_loss=run["losses"][0],
    final_loss=run["losses"][-1],
  )
  if run["devices"] > 1:
    single = train(jax.local_devices()[:1], args.steps, args.batch_size, args.seed)
    diff = max(abs(a - b) for a, b in zip(run["losses"], single["losses"], strict=True))
    stats_diff = max(
      float(np.abs(np.asarray(a) - np.asarray(b)).max())
      for a, b in zip(
        jax.tree_util.tree_leaves(run["batch_stats"]),
        jax.tree_util.tree_leaves(single["batch_stats"]),
        strict=True,
      )
    )
    match = diff <= 1e-4 * max(1.0, abs(single["losses"][0]))
    for i in range(0, args.steps, max(1, args.steps // 6)):
      print(
        f"step {i:3d}: {run['devices']} devices {run['losses'][i]:.6f}   "
        f"1 device {single['losses'][i]:.6f}"
      )
    print(
      f"step-by-step losses {'match' if match else 'DIFFER'}: largest difference "
      f"{diff:.2e}; batch_stats differ by at most {stats_diff:.2e}"
    )
    result.update(
      max_loss_difference=diff, max_batch_stats_difference=stats_diff, losses_match=match
    )
  print_result(result)
  return result


if __name__ == "__main__":
  main()
