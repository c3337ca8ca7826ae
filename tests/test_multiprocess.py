"""Real multi-process data parallelism: two processes on 127.0.0.1, 4 CPU devices each, in
JAX's multi-controller runtime (gloo collectives), train the mini CNN with synced BatchNorm
over the 8 global devices; their losses and batch_stats must equal a single-device run over
the same global batches. The test starts and stops its processes itself, with a time limit."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from tests.conftest import TEST_XLA_FLAGS

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 4
TIME_LIMIT_S = 240


def _free_loopback_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one_device(tmp_path):
  port = _free_loopback_port()
  # The suite's compile settings, without this process's device count.
  env = {**os.environ, "XLA_FLAGS": " ".join(TEST_XLA_FLAGS), "JAX_PLATFORMS": "cpu"}
  outs = [tmp_path / f"process{i}.json" for i in range(2)]
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        os.path.join(HERE, "multiprocess_worker.py"),
        str(i),
        str(port),
        str(outs[i]),
        str(STEPS),
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  try:
    logs = [p.communicate(timeout=TIME_LIMIT_S)[0] for p in procs]
  finally:
    for p in procs:  # never leave a process behind, whatever happened
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, log in zip(procs, logs, strict=True):
    assert p.returncode == 0, log[-3000:]

  sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
  import data_parallel

  single = data_parallel.train(jax.devices()[:1], steps=STEPS, batch_size=64)
  for out in outs:
    got = json.loads(out.read_text())
    assert got["devices"] == 8
    np.testing.assert_allclose(got["losses"], single["losses"], rtol=1e-5)
    for name in ("mean", "var"):
      for layer, stats in single["batch_stats"].items():
        np.testing.assert_allclose(
          got["batch_stats"][layer][name], np.asarray(stats[name]), rtol=1e-4, atol=1e-6
        )
  assert single["losses"][-1] < single["losses"][0]
