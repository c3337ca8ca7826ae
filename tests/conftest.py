"""Strict test configuration: implicit rank promotion raises; hypothesis stays quick; the
process has 8 CPU devices, so collectives are tested on one machine.

The device count is set through ``jax.config`` before any backend starts (not through
``XLA_FLAGS``), so it is this process's alone: the subprocesses of the multi-process test
set their own. Single-device tests are unaffected: arrays live on device 0 unless sharded.

XLA:CPU compiles at LLVM optimization level 0 here (unless ``XLA_FLAGS`` already sets one):
the suite is mostly compilation, and this cuts its time by about a quarter; XLA's own
graph passes (fusion, the collectives the tests count) are unchanged. For the same reason
the run's workers share a persistent compilation cache, a fresh temporary folder per run
(many tests compile the same programs; about a tenth of the time), removed at the end.
"""

import os
import shutil
import tempfile

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

_CACHE = "JAXNORM_TEST_COMPILATION_CACHE"  # set by the controlling process, one per run


def _share_compilations(folder: str) -> None:
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


if os.environ.get(_CACHE):  # an xdist worker: its controller made the folder
  _share_compilations(os.environ[_CACHE])


def pytest_configure(config):
  if not os.environ.get(_CACHE) and not hasattr(config, "workerinput"):
    config._jaxnorm_cache = os.environ[_CACHE] = tempfile.mkdtemp(prefix="jaxnorm-tests-")
    _share_compilations(os.environ[_CACHE])  # (also for a run in one process, -n 0)


def pytest_unconfigure(config):
  folder = getattr(config, "_jaxnorm_cache", None)
  if folder:
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(_CACHE, None)


settings.register_profile("jaxnorm", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("jaxnorm")


@pytest.fixture
def rng():
  """A seeded NumPy generator, fresh for each test."""
  return np.random.default_rng(0)
