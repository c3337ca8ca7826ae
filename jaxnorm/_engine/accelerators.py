"""Flax's program for the norms, with statistics that stay exact: TPUs, GPUs and meshes.

Where the router sends a norm here (real data, no mask, no ``axis_name``, ε in the root,
on every platform but XLA:CPU's single device), it is written as Flax writes it —
statistics, then ``(x − μ)·r·γ + β`` differentiated by JAX — so XLA emits Flax's kernels
and traffic (``benchmarks/accelerator_programs.py``). The one difference is the
statistics, the router's exact ones (:func:`~jaxnorm._engine.router.exact_moments`),
which GSPMD partitions exactly with nothing custom in the program (sharded programs
export, compile ahead of time for TPUs and hit the persistent cache).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._config import Config
from jaxnorm._dtypes import count_dtype, promote, real_dtype
from jaxnorm._engine.maths import Moments, affine, elements_per_group, group_sum, squeezed
from jaxnorm._engine.platform import switch
from jaxnorm._engine.sharding import sharded_axes


def applies(x: jax.Array, scale: Any, bias: Any, mask: Any, cfg: Config) -> bool:
  """Whether :func:`affine_normalize` computes this call: real data, no mask, no mapped
  axis, ε inside the root (the rest takes the closed-form kernel on every platform,
  :mod:`jaxnorm._engine.kernel`)."""
  return (
    mask is None
    and cfg.axis_name is None
    and cfg.epsilon_in_root
    and x.size > 0
    and not any(jnp.iscomplexobj(a) for a in (x, scale, bias))
    and not jnp.issubdtype(cfg.dtype, jnp.complexfloating)
  )


def affine_normalize(
  x: jax.Array, scale: Any, bias: Any, epsilon: jax.Array, cfg: Config, statistics: Any
) -> tuple[jax.Array, Moments]:
  """``(y, Moments)`` as :func:`jaxnorm._engine.router.affine_normalize` returns them (the
  statistics with kept dims, a group's repeated on its channels), in Flax's form, the
  centred statistics from ``statistics(x, axes, groups, dtype)`` (the router's choice:
  :func:`~jaxnorm._engine.router.exact_moments`)."""
  acc = promote(cfg.dtype, jnp.float32)
  xs = x.astype(cfg.dtype)
  groups = cfg.channel_groups
  n = elements_per_group(x.shape, cfg.axes, groups)
  if cfg.center:
    # (x itself where converting it is exact: its shift is then sliced before the conversion)
    exact = jnp.issubdtype(x.dtype, jnp.floating) and promote(x.dtype, cfg.dtype) == cfg.dtype
    raw = x if exact else xs
    mean, var = statistics(raw, cfg.axes, groups, acc)
  else:
    wide = xs.astype(acc)
    mean, var = jnp.zeros((), acc), group_sum(wide * wide, cfg.axes, groups) / n

  def guard(var):  # (an overflowed Σx²: NaN, not a confident 0)
    return jnp.where(var < jnp.inf, var, jnp.nan)

  # The per-group arithmetic in the statistics' own shape (the reduced axes squeezed), as
  # Flax's: kept as size 1, XLA:TPU met each sum's f32[C] across a change of tiling and
  # left the arithmetic in kernels of its own (a ResNet-50 step 625 kernels against 532,
  # RESULTS item 79). Channel groups keep theirs (squeezed, a UNet step took 10 more).
  own_shape = groups is None
  own = squeezed(var, cfg.axes) if own_shape else var
  # (not RMSNorm's on XLA:GPU: the guard split it in three kernels, RESULTS item 41)
  guarded = guard(own) if cfg.center else switch(own, like=x, tpu=guard, default=lambda v: v)
  r = lax.rsqrt(guarded + epsilon.astype(acc)).astype(cfg.dtype)
  centred = (xs - mean.astype(cfg.dtype)) if cfg.center else xs
  if own_shape and (scale is None or all(scale.shape[a] == 1 for a in cfg.axes)):
    # γ constant over each group: r·γ in that shape too, then (x − μ)·(r·γ) + β.
    factor = r if scale is None else r * squeezed(scale, cfg.axes)
    y = affine(centred, jnp.expand_dims(factor, cfg.axes), None, bias, False)
  else:
    # (x − μ)·r·γ where r·γ is x's size (per-row r, per-feature or per-sample γ), read
    # again and under explicit sharding replicated, its transpose gathering x; RMSNorm's
    # per-feature γ excepted: x·r·γ 11|x| against 10 on XLA:GPU. Else r·γ first, as Flax:
    # the derivative's reductions share one shape; a separate ·γ made XLA:GPU write x̂
    # out (16|x| against 11, bfloat16 InstanceNorm).
    r = jnp.expand_dims(r, cfg.axes) if own_shape else r
    per_element = (
      scale is not None
      and jnp.broadcast_shapes(r.shape, scale.shape) == x.shape
      and (
        cfg.center
        or jnp.size(scale) > math.prod(x.shape[a] for a in cfg.features)
        or bool(sharded_axes(x))
      )
    )
    y = affine(centred, r, scale, bias, per_element)
  kept = tuple(1 if a in cfg.axes else d for a, d in enumerate(x.shape))
  mean_out = jnp.broadcast_to(mean, kept)
  count = jnp.full(kept, n, count_dtype(acc))
  return y.astype(cfg.out_dtype), Moments(
    mean_out.astype(cfg.dtype), var.astype(real_dtype(cfg.dtype)), count
  )
