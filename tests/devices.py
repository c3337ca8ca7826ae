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


def tracing_for(platform):
  """A context in which programs are traced for ``platform`` (``"cpu"``, ``"gpu"``,
  ``"tpu"``) whatever the host: JAX's abstract mesh of one device of that platform, the
  way the distributed guide shows for ``jax.export`` to an accelerator from a CPU host."""
  import jax  # noqa: PLC0415
  from jax.sharding import AbstractDevice, AbstractMesh, AxisType  # noqa: PLC0415

  kind = {"cpu": "cpu", "gpu": "NVIDIA H100 80GB HBM3", "tpu": "TPU v5 lite"}[platform]
  try:
    device = AbstractDevice(device_kind=kind, num_cores=None, platform=platform)
  except TypeError:  # (JAX before 0.10 records the kind alone)
    device = AbstractDevice(device_kind=kind, num_cores=None)
  mesh = AbstractMesh((1,), ("d",), axis_types=(AxisType.Auto,), abstract_device=device)
  return jax.sharding.use_abstract_mesh(mesh)
