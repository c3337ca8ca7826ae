"""The accelerators the tests compile for without one: TPU devices from libtpu's
topologies and an H100 mesh from the CUDA plugin, each a skip where its compiler is not
installed, and a failure where CI requires it (``JAXNORM_REQUIRE_TPU=1``,
``JAXNORM_REQUIRE_CUDA=1``: ``.ci/run`` installs each for its step)."""

import os

import pytest


def tpu_devices(topology="v5e:2x2"):
  """The devices of a TPU ``topology`` (libtpu's, no TPU needed)."""
  try:
    import libtpu  # noqa: F401
  except ImportError:
    if os.environ.get("JAXNORM_REQUIRE_TPU") == "1":
      raise
    pytest.skip('libtpu is not installed: pip install "jax[tpu]==<jax\'s version>"')
  from jax.experimental import topologies

  return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices


def h100_mesh():
  """A one-H100 mesh (the CUDA plugin's topology, no GPU needed)."""
  try:
    import jax_cuda12_plugin  # noqa: F401
  except ImportError:
    if os.environ.get("JAXNORM_REQUIRE_CUDA") == "1":
      raise
    pytest.skip('the CUDA plugin is not installed: pip install "jax-cuda12-plugin[with-cuda]"')
  from benchmarks import accelerator_programs

  return accelerator_programs.gpu_mesh()
