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

import os
import shutil
import subprocess
import sys
import tempfile

_CHOSEN = "JAXNORM_TEST_XLA_FLAGS"  # the controlling process's choice, for its subprocesses
_WANTED = (("xla_backend_optimization_level", "0"), ("xla_cpu_use_fusion_emitters", "false"))


def _xla_accepts(flags: tuple[str, ...]) -> bool:
  """Whether this jaxlib's XLA starts with ``flags`` (it aborts on an unknown flag, and a
  removed flag's name can stay in its binary: jaxlib 0.12 dropped the emitters' flag)."""
  env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
  probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
  return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


def _test_xla_flags() -> tuple[str, ...]:
  """The suite's compile flags, chosen once by the controlling process (its workers and
  the 2-process test's processes inherit them through ``_CHOSEN``): every wanted flag the
  user's ``XLA_FLAGS`` does not name, in one probe; one by one only if that fails."""
  if _CHOSEN in os.environ:
    return tuple(os.environ[_CHOSEN].split())
  user = os.environ.get("XLA_FLAGS", "")
  flags: tuple[str, ...] = ()
  if os.environ.get("JAXNORM_TEST_XLA_DEFAULTS") != "1":
    flags = tuple(f"--{name}={value}" for name, value in _WANTED if name not in user)
    if flags and not _xla_accepts(flags):
      flags = tuple(flag for flag in flags if _xla_accepts((flag,)))
  os.environ[_CHOSEN] = " ".join(flags)
  os.environ["XLA_FLAGS"] = " ".join((user, *flags)).strip()
  return flags


TEST_XLA_FLAGS = _test_xla_flags()
# With libtpu installed (tests/test_accelerator_programs.py compiles for TPUs without one),
# each worker loads it: let them share it instead of failing on its lock file.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

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
