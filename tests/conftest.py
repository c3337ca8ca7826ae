"""Strict test configuration: implicit rank promotion raises; hypothesis stays quick; the
process has 8 CPU devices, so collectives are tested on one machine.

The device count is set through ``jax.config`` before any backend starts (not through
``XLA_FLAGS``), so it is this process's alone: the subprocesses of the multi-process test
set their own. Single-device tests are unaffected: arrays live on device 0 unless sharded.

XLA:CPU compiles at LLVM optimization level 0 here (unless ``XLA_FLAGS`` already sets one):
the suite is mostly compilation, and this cuts its time by about a quarter; XLA's own
graph passes (fusion, the collectives the tests count) are unchanged.
"""

import os

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
  ).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_num_cpu_devices", 8)

settings.register_profile("jaxnorm", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("jaxnorm")


@pytest.fixture
def rng():
  """A seeded NumPy generator, fresh for each test."""
  return np.random.default_rng(0)
