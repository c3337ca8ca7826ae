"""One process of the 2-process data-parallel test (run by tests/test_multiprocess.py).

Joins JAX's multi-controller runtime on 127.0.0.1 with 4 CPU devices of its own (gloo
collectives), trains the data-parallel mini CNN over all 8 global devices, and writes the
per-step losses and final batch_stats (replicated, so every process holds them) as JSON.

  python tests/multiprocess_worker.py PROCESS_ID PORT OUT.json [STEPS]
"""

import json
import os
import sys

import jax
import numpy as np


def main():
  process_id, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  steps = int(sys.argv[4]) if len(sys.argv) > 4 else 4
  jax.config.update("jax_num_cpu_devices", 4)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=process_id,
    initialization_timeout=60,
  )
  sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
  )
  import data_parallel

  assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
  run = data_parallel.train(jax.devices(), steps=steps, batch_size=64)
  with open(out, "w") as f:
    json.dump(
      dict(
        process=jax.process_index(),
        devices=run["devices"],
        losses=run["losses"],
        batch_stats=jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), run["batch_stats"]),
      ),
      f,
    )
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
