"""Strict test configuration: implicit rank promotion raises; hypothesis stays quick; the
process has 8 CPU devices, so collectives are tested on one machine.

The device count is set through ``jax.config`` before any backend starts (not through
``XLA_FLAGS``), so it is this process's alone: the subprocesses of the multi-process test
set their own. Single-device tests are unaffected: arrays live on device 0 unless sharded.
"""

import jax
import numpy as np
import pytest
from hypothesis import settings

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_num_cpu_devices", 8)

settings.register_profile("jaxnorm", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("jaxnorm")


@pytest.fixture
def rng():
  """A seeded NumPy generator, fresh for each test."""
  return np.random.default_rng(0)
