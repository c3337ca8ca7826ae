"""Strict test configuration: implicit rank promotion raises; hypothesis stays quick; the
process has 8 CPU devices, so collectives are tested on one machine.

The device count is set through ``jax.config`` before any backend starts (not through
``XLA_FLAGS``), so it is this process's alone: the subprocesses of the multi-process test
set their own. Single-device tests are unaffected: arrays live on device 0 unless sharded.

The suite is mostly compilation, so XLA:CPU compiles here for speed (``TEST_XLA_FLAGS``,
unless ``XLA_FLAGS`` already names the flag): LLVM at optimization level 0 (a quarter off
the suite's time) and the older elemental emitters instead of the MLIR fusion emitters
(234 s against 416 s for the whole suite, benchmarks/RESULTS.md item 43). Both are code
generation only: XLA's graph passes (fusion, the collectives and bytes the tests count) and
the operations (no fast-math) are unchanged, a fused reduction's order at most.
``JAXNORM_TEST_XLA_DEFAULTS=1`` runs the suite with XLA's own settings instead, as CI's
lowest-versions run does. For the same reason the run's workers share a persistent
compilation cache, a fresh temporary folder per run (many tests compile the same programs;
about a tenth of the time), removed at the end.
"""

import glob
import importlib.util
import mmap
import os
import shutil
import tempfile


def _jaxlib_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA has ``flag`` (XLA aborts on an unknown one in XLA_FLAGS)."""
  spec = importlib.util.find_spec("jaxlib")  # (not imported: XLA_FLAGS must come first)
  folders = spec.submodule_search_locations if spec else None
  for path in glob.glob(os.path.join(next(iter(folders or [""])), "*.so")):
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
      if m.find(flag.encode()) >= 0:
        return True
  return False


TEST_XLA_FLAGS = tuple(
  f"--{name}={value}"
  for name, value in (
    ("xla_backend_optimization_level", "0"),
    ("xla_cpu_use_fusion_emitters", "false"),
  )
  if os.environ.get("JAXNORM_TEST_XLA_DEFAULTS") != "1"
  and name not in os.environ.get("XLA_FLAGS", "")
  and _jaxlib_knows(name)
)
os.environ["XLA_FLAGS"] = " ".join((os.environ.get("XLA_FLAGS", ""), *TEST_XLA_FLAGS)).strip()

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
