"""The norm programs the compiled-program tests count and the benchmarks time: one case
grid of jaxnorm's and Flax's modules (:func:`module`, by kind: ``batch_train``,
``batch_eval``, ``layer``, ``rms``, ``group``, ``instance``, ``add_layer``, ``add_rms``),
their inputs, their forward and forward+backward (:func:`module_forward`,
:func:`forward_backward`) and each library's compiled programs for a sharding
(:func:`compiled`). The benchmarks in ``benchmarks/`` import these, so that a bound a test
asserts and a table a benchmark prints are counted on the same program."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm

# jaxnorm, Flax's default (E[x²] − E[x]²) and Flax's two-pass program (use_fast_variance=False)
LIBS = ("jaxnorm", "flax", "flax2")


def module(lib, kind, ndim, dtype):
  """The norm ``kind`` of ``lib`` (``jaxnorm`` or ``flax.linen``) for ``ndim``-dimensional
  inputs: float32 parameters, ``dtype`` activations (Flax's mixed precision)."""
  kw = {} if dtype == jnp.float32 else {"dtype": dtype}
  if kind == "batch_train":
    return lib.BatchNorm(use_running_average=False, **kw)
  if kind == "batch_eval":
    return lib.BatchNorm(use_running_average=True, **kw)
  if kind in ("layer", "add_layer"):
    return lib.LayerNorm(reduction_axes=(1, 2, 3), **kw) if ndim == 4 else lib.LayerNorm(**kw)
  if kind in ("rms", "add_rms"):
    return lib.RMSNorm(**kw)
  if kind == "group":
    return lib.GroupNorm(num_groups=32, **kw)
  if kind == "instance":
    return lib.InstanceNorm(**kw)
  raise ValueError(f"unknown norm kind {kind!r}")


def inputs(kind, shape, dtype):
  """The input (a pair ``(x, residual)`` for Add & Norm, the residual in float32) and a
  random cotangent of the output (a pair for Add & Norm)."""
  x = jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype)
  cot = jax.random.normal(jax.random.key(2), shape, jnp.float32).astype(dtype)
  if not kind.startswith("add_"):
    return x, cot
  residual = jax.random.normal(jax.random.key(3), shape, jnp.float32)
  return (x, residual), (cot, jax.random.normal(jax.random.key(4), shape, jnp.float32))


def module_forward(module, kind, fused_add):
  """``forward(params, x, rest)`` of a norm module: BatchNorm training with its statistics
  mutable (the output alone returned); Add & Norm as jaxnorm's fused call (``fused_add``)
  or as Flax's add, then the norm."""
  add = kind.startswith("add_")
  mutable = ["batch_stats"] if kind == "batch_train" else False

  def forward(params, x, rest):
    v = {"params": params, **rest}
    if add and fused_add:
      return module.apply(v, x[0], residual=x[1])
    if add:  # Flax: the add, then the norm
      h = x[0].astype(jnp.float32) + x[1]
      return module.apply(v, h), h
    out = module.apply(v, x, mutable=mutable)
    return out[0] if mutable else out

  return forward


def forward_backward(forward):
  """``fwd_bwd(params, x, rest, cot)``: the output and the VJP of ``cot`` w.r.t. the
  parameters and the input."""

  def fwd_bwd(params, x, rest, cot):
    y, vjp = jax.vjp(lambda p, x: forward(p, x, rest), params, x)
    return y, vjp(cot)

  return fwd_bwd


def abstract(tree, sharding):
  """``tree``'s arrays as shapes and dtypes laid out by ``sharding`` (nothing to hold)."""
  return jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(jnp.shape(a), a.dtype, sharding=sharding), tree
  )


def compiled(kind, shape, dtype, sharding, libs=LIBS):
  """Each library's compiled forward and forward+backward of norm ``kind`` on an input of
  ``shape`` laid out by ``sharding`` (parameters replicated on its mesh), from shapes alone:
  ``({(lib, "forward" | "fwd+bwd"): compiled}, |x| in bytes)``."""
  dt = jnp.dtype(dtype)
  x, cot = jax.eval_shape(lambda: inputs(kind, shape, dt))
  x0 = x[0] if isinstance(x, tuple) else x
  variables = jax.eval_shape(
    lambda: module(nn, kind, len(shape), dt).init(jax.random.key(0), jnp.zeros(x0.shape, x0.dtype))
  )
  rest = {k: v for k, v in variables.items() if k != "params"}
  params = abstract((variables["params"], rest), NamedSharding(sharding.mesh, P()))
  xa, cota = abstract(x, sharding), abstract(cot, sharding)
  out = {}
  for lib in libs:
    if lib == "flax2" and kind in ("rms", "add_rms", "batch_eval"):
      continue  # (no variance)
    norm = module(jaxnorm if lib == "jaxnorm" else nn, kind, len(shape), dt)
    if lib == "flax2":
      norm = norm.clone(use_fast_variance=False)
    forward = module_forward(norm, kind, fused_add=lib == "jaxnorm")
    out[(lib, "forward")] = jax.jit(forward).lower(params[0], xa, params[1]).compile()
    fwd_bwd = forward_backward(forward)
    out[(lib, "fwd+bwd")] = jax.jit(fwd_bwd).lower(params[0], xa, params[1], cota).compile()
  return out, x0.size * dt.itemsize


def renorm_by_hand(p, x, _=None, epsilon=1e-5):
  """Batch Renorm's training output as a Flax user writes it without jaxnorm (Flax has
  none): Flax BatchNorm's one-pass statistics, the paper's ``r`` and ``d`` at
  :func:`jaxnorm.renorm_limits` of the step counter; ``p`` is ``(params, batch_stats)``
  of :class:`jaxnorm.BatchRenorm`."""
  (params, rest), axes = p, tuple(range(x.ndim - 1))
  xf = x.astype(jnp.float32)
  mean = xf.mean(axes, keepdims=True)
  var = jnp.maximum((xf * xf).mean(axes, keepdims=True) - mean * mean, 0.0)
  running, gamma, beta = (
    a.reshape(mean.shape) for a in (rest["batch_stats"]["mean"], params["scale"], params["bias"])
  )
  r_max, d_max = jaxnorm.renorm_limits(rest["batch_stats"]["steps"])
  sigma = jnp.sqrt(rest["batch_stats"]["var"].reshape(mean.shape) + epsilon)
  r = jax.lax.stop_gradient(jnp.clip(jnp.sqrt(var + epsilon) / sigma, 1 / r_max, r_max))
  d = jax.lax.stop_gradient(jnp.clip((mean - running) / sigma, -d_max, d_max))
  y = (xf - mean) * jax.lax.rsqrt(var + epsilon) * r + d
  return (y * gamma + beta).astype(x.dtype)
