"""The one platform switch: which platform's form of a norm a program traces.

The statistics take a different form per platform (XLA:CPU's tuned kernel, the
accelerators' merged sums, XLA:GPU's column sums, XLA:TPU's sums around a rough mean:
``docs/development.md`` has the routing table). ``lax.platform_dependent`` would trace
every form and let the lowering keep one: every norm traced two or three times, a
training step's tracing up to 2.3x Flax's (``benchmarks/RESULTS.md``, item 65). So
:func:`switch` traces one form: the one of the platform JAX says the program is for
while it is being traced, :func:`traced_for`:

1. the platform of the devices of the input's mesh (arrays or ``ShapeDtypeStruct``\\ s
   sharded on a mesh, explicit or automatic) or of the context's mesh (``jax.set_mesh``,
   ``jax.sharding.use_abstract_mesh`` with an ``AbstractDevice``, the legacy
   ``with mesh:``): the platform JAX itself says a program is traced for;
2. else JAX's default backend, the platform a ``jit`` lowers for unless told otherwise.

Every form computes the same exact statistics; a program lowered for another platform
than it was traced for (``jax.export`` or ``.lower(lowering_platforms=...)`` for an
accelerator from a CPU host, with no mesh) is right there and costs what the traced
platform's form costs. To trace a platform's own form there, trace under
``jax.sharding.use_abstract_mesh`` with that platform's device (the distributed guide
shows it). The Pallas kernels alone take :func:`every_platform`: a kernel is what
``implementation="pallas"`` asks for, so each platform's is traced and the lowering
keeps its own.

Tests run another platform's form on the CPU by patching :func:`traced_for` (and
clearing JAX's caches, which keep what was traced). This is the only module that calls
``lax.platform_dependent`` (``tests/test_routing.py`` checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax


def mesh_of(x: Any) -> Any:
  """The mesh of ``x``'s type, else the one ``jax.set_mesh`` (or
  ``jax.sharding.use_abstract_mesh``) set while tracing (a step jitted with
  ``in_shardings`` traces unsharded types under it), else the legacy ``with mesh:`` one
  (deprecated by JAX, still used), else None."""
  mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
  if not getattr(mesh, "axis_sizes", ()):
    mesh = jax.sharding.get_abstract_mesh()
  if not getattr(mesh, "axis_sizes", ()):
    try:  # (JAX's private record of the legacy context; absent, nothing is known)
      from jax._src.mesh import thread_resources

      mesh = thread_resources.env.physical_mesh
    except (ImportError, AttributeError):
      return None
  return mesh


def _platform_of(mesh: Any) -> str | None:
  """The platform of ``mesh``'s devices (``"cpu"``, ``"gpu"``, ``"tpu"``, ...), None
  when the mesh names none (no mesh, or an abstract one without a device). JAX before
  0.10 records a device's kind, not its platform: TPUs' kinds name them, CPUs' is "cpu"."""
  if isinstance(mesh, jax.sharding.Mesh) and mesh.axis_sizes:
    mesh = mesh.abstract_mesh  # (a concrete Mesh: the legacy context's)
  device = getattr(mesh, "abstract_device", None)
  if device is None:
    return None
  platform = getattr(device, "platform", None)
  if platform is None:
    kind = str(device.device_kind).lower()
    platform = "tpu" if "tpu" in kind else "cpu" if kind == "cpu" else "gpu"
  return platform


def traced_for(x: Any = None) -> str:
  """The platform a program being traced with input ``x`` is for: that of ``x``'s mesh
  or the context's (:func:`mesh_of`), else JAX's default backend. ``"cpu"``, ``"gpu"``
  (CUDA and ROCm alike) or ``"tpu"``; another name for another backend."""
  platform = None if x is None else _platform_of(mesh_of(x))
  if platform is None:
    platform = _platform_of(jax.sharding.get_abstract_mesh())
  if platform is None:
    platform = jax.default_backend()
  return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def switch(
  *args: Any,
  like: Any,
  default: Callable[..., Any],
  cpu: Callable[..., Any] | None = None,
  gpu: Callable[..., Any] | None = None,
  tpu: Callable[..., Any] | None = None,
) -> Any:
  """``branch(*args)``, the one branch of the platform the program is traced for
  (:func:`traced_for` of ``like``): ``cpu``, ``gpu`` or ``tpu`` where given, else
  ``default``. Only that branch is traced."""
  branch = {"cpu": cpu, "gpu": gpu, "tpu": tpu}.get(traced_for(like))
  return (default if branch is None else branch)(*args)


def every_platform(
  *args: Any,
  default: Callable[..., Any],
  gpu: Callable[..., Any] | None = None,
  tpu: Callable[..., Any] | None = None,
) -> Any:
  """``branch(*args)`` with every branch traced and the lowering keeping its platform's
  (``lax.platform_dependent``; ``gpu`` for CUDA and ROCm): for code that must be the
  lowering platform's own whatever the trace was for (the Pallas kernels)."""
  gpus = {} if gpu is None else {"cuda": gpu, "rocm": gpu}
  tpus = {} if tpu is None else {"tpu": tpu}
  return lax.platform_dependent(*args, default=default, **gpus, **tpus)
