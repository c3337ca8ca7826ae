"""The statistics engine: one router over one file per platform.

Read :mod:`~jaxnorm._engine.router` first: its docstring is the routing table, and its
functions are every decision of which algorithm computes a norm. The rest, each with one
job (``docs/development.md`` has the layout, the decisions and their guards):

- ``platform.py``: the one platform switch (the seam the tests patch);
- ``maths.py``: the platform-free maths (sums, shifts, merges, moments), exact for any
  offset; ``sharding.py``: what a traced type says about its mesh; ``collectives.py``:
  statistics across a mapped axis; ``inputs.py``: the checks of what a call passes in;
- ``kernel.py``: the closed-form kernel (custom JVP), every platform's masks, mapped axes,
  ε outside the root and complex data, and XLA:CPU's every call; the inference path;
- ``accelerators.py``: Flax's program with exact statistics (TPUs, GPUs, meshes);
- ``cpu.py``, ``gpu.py``, ``tpu.py``: each platform's own forms of the statistics;
  ``barriers.py``: XLA:CPU's fusion barriers;
- ``pallas.py``, ``pallas_rows.py``: the Pallas row kernels and their custom JVP.

The rest of the package imports the engine from here.
"""

from jaxnorm._engine.collectives import psum
from jaxnorm._engine.inputs import (
  affine_params,
  broadcast_mask,
  check_epsilon,
  concrete_value,
  operand,
)
from jaxnorm._engine.kernel import apply_statistics
from jaxnorm._engine.maths import Moments, inverse_std
from jaxnorm._engine.pallas_rows import (
  check_implementation,
  kernel_misfit,
  normalize_rows,
  use_kernels,
)
from jaxnorm._engine.router import affine_normalize, group_moments, moments
from jaxnorm._engine.sharding import with_sharding_of
from jaxnorm._engine.tpu import rough_row_mean

__all__ = [
  "Moments",
  "affine_normalize",
  "affine_params",
  "apply_statistics",
  "broadcast_mask",
  "check_epsilon",
  "check_implementation",
  "concrete_value",
  "group_moments",
  "inverse_std",
  "kernel_misfit",
  "moments",
  "normalize_rows",
  "operand",
  "psum",
  "rough_row_mean",
  "use_kernels",
  "with_sharding_of",
]
