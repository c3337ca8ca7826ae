"""Code a strict-typing user writes against jaxnorm's public API.

CI type-checks this module with mypy's strict flags (the override in ``pyproject.toml``):
a public function that loses its annotations, or returns a type a user cannot unpack,
fails the check. ``tests/test_api.py`` runs it, so it also stays true at run time.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxnorm
from jaxnorm import convert
from jaxnorm import nnx as jnnx


def pure_functions(x: jax.Array) -> list[jax.Array]:
  """Each pure function, its result used as the type it declares."""
  scale, bias = jnp.ones(x.shape[-1]), jnp.zeros(x.shape[-1])
  stats: jaxnorm.Moments = jaxnorm.moments(x, axes=0)
  mean, var = jaxnorm.update_running_average(stats.mean, stats.var, stats, momentum=0.9)
  y, h = jaxnorm.add_layer_norm(x, x, scale, bias)
  z, _ = jaxnorm.add_rms_norm(x, x, scale)
  r_max, d_max = jaxnorm.renorm_limits(100)
  trained, batch = jaxnorm.batch_norm(x)
  inferred: jax.Array = jaxnorm.batch_norm(x, mean=batch.mean, var=batch.var)
  return [
    jaxnorm.normalize(x, axes=-1),
    jaxnorm.layer_norm(x, scale, bias),
    jaxnorm.rms_norm(x, scale),
    jaxnorm.group_norm(x[:, None, :], num_groups=3),
    jaxnorm.instance_norm(x[:, None, :]),
    jaxnorm.frozen_batch_norm(x, scale, bias, mean, var),
    trained,
    inferred,
    y,
    h,
    z,
    r_max,
    d_max,
  ]


def modules(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """A Linen and an NNX module, and the Linen ones are Flax's subclasses."""
  linen: nn.BatchNorm = jaxnorm.BatchNorm(use_running_average=True)
  variables = linen.init(jax.random.key(0), x)
  y = linen.apply(variables, x)
  layer: nnx.BatchNorm = jnnx.BatchNorm(x.shape[-1], rngs=nnx.Rngs(0))
  return jnp.asarray(y), layer(x, use_running_average=False)


def interop() -> dict[str, jax.Array]:
  """PyTorch import and BatchNorm folding."""
  torch = convert.from_torch("LayerNorm", {"weight": np.ones(3), "bias": np.zeros(3)})
  kwargs: dict[str, object] = dict(torch.kwargs)
  assert "epsilon" in kwargs
  layer = {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}
  norm = {
    "params": {"scale": jnp.ones(3), "bias": jnp.zeros(3)},
    "batch_stats": {"mean": jnp.zeros(3), "var": jnp.ones(3)},
  }
  eps: dict[str, float] = jaxnorm.batch_norm_epsilons(
    jaxnorm.BatchNorm(use_running_average=True), jnp.ones((2, 3))
  )
  return jaxnorm.fold_batch_norm(layer, norm, epsilon=eps[""])


def use_everything() -> None:
  """Runs the three: the module is checked by mypy and executed by the tests."""
  x = jnp.arange(12.0).reshape(4, 3)
  assert all(a.size for a in pure_functions(x))
  assert all(a.shape == x.shape for a in modules(x))
  assert set(interop()) == {"kernel", "bias"}
