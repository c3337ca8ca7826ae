"""The accelerators the tests and benchmarks compile for without one: TPU devices from
libtpu's topologies and H100s from the CUDA plugin (:func:`tpu_mesh`, :func:`h100_devices`).
For tests, :func:`tpu_devices` and :func:`h100_mesh` skip where the compiler is not
installed and fail where CI requires it (``JAXNORM_REQUIRE_TPU=1``,
``JAXNORM_REQUIRE_CUDA=1``: ``.ci/run`` installs each for its step)."""

import math
import os

import numpy as np

# XLA's description of an H100 SXM (the fields XLA:GPU's compiler reads).
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448 cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def tpu_mesh(topology="v5e:2x2", chips=1):
  """A one-axis (``"d"``) mesh of the first ``chips`` devices of a TPU ``topology``."""
  from jax.experimental import topologies  # noqa: PLC0415
  from jax.sharding import Mesh  # noqa: PLC0415

  devices = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
  return Mesh(np.array(devices[:chips]), ("d",))


def h100_devices(chips=1):
  """``chips`` H100s (XLA's target description above; the CUDA plugin, no GPU needed)."""
  from jax.experimental import topologies  # noqa: PLC0415

  topology = f"1x1x{chips}"
  return topologies.get_topology_desc(
    platform="cuda", target_config=H100, topology=topology
  ).devices


def _skip(message, required):
  import pytest  # noqa: PLC0415 (the benchmarks import this module without pytest)

  if os.environ.get(required) == "1":
    raise  # (the ImportError being handled: CI installed the compiler, so it must import)
  pytest.skip(message)


def tpu_devices(topology="v5e:2x2"):
  """The devices of a TPU ``topology`` (libtpu's, no TPU needed)."""
  try:
    import libtpu  # noqa: F401
  except ImportError:
    _skip(
      'libtpu is not installed: pip install "jax[tpu]==<jax\'s version>"', "JAXNORM_REQUIRE_TPU"
    )
  from jax.experimental import topologies

  return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices


def h100_mesh(shape=(1,), names=("d",)):
  """A mesh of H100s of ``shape`` with axes ``names`` (the CUDA plugin's topology, no GPU
  needed): one H100 by default."""
  try:
    import jax_cuda12_plugin  # noqa: F401
  except ImportError:
    _skip(
      'the CUDA plugin is not installed: pip install "jax-cuda12-plugin[with-cuda]"',
      "JAXNORM_REQUIRE_CUDA",
    )
  from jax.sharding import Mesh  # noqa: PLC0415

  return Mesh(np.array(h100_devices(math.prod(shape))).reshape(shape), names)


def tracing_for(platform, devices=1):
  """A context in which programs are traced for ``platform`` (``"cpu"``, ``"gpu"``,
  ``"tpu"``) whatever the host: JAX's abstract mesh of one device of that platform, the
  way the distributed guide shows for ``jax.export`` to an accelerator from a CPU host;
  with ``devices`` > 1, a mesh of as many under automatic sharding (a sharded step's
  trace, nothing compiled)."""
  import jax  # noqa: PLC0415
  from jax.sharding import AbstractDevice, AbstractMesh, AxisType  # noqa: PLC0415

  kind = {"cpu": "cpu", "gpu": "NVIDIA H100 80GB HBM3", "tpu": "TPU v5 lite"}[platform]
  try:
    device = AbstractDevice(device_kind=kind, num_cores=None, platform=platform)
  except TypeError:  # (JAX before 0.10 records the kind alone)
    device = AbstractDevice(device_kind=kind, num_cores=None)
  mesh = AbstractMesh((devices,), ("d",), axis_types=(AxisType.Auto,), abstract_device=device)
  return jax.sharding.use_abstract_mesh(mesh)
