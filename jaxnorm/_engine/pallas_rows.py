"""The row norms on the Pallas kernels (``implementation="pallas"``), behind a custom JVP.

``normalize_rows`` flattens a norm over the trailing axes of ``x`` into rows, runs the
forward kernel (:mod:`jaxnorm._engine.pallas`) and differentiates it with the closed-form rule of
the XLA path (``kernel.normalize``'s JVP, reused, not rewritten), whose transpose
is the fused backward kernel: the tangent is a ``linear_call`` of the two. So forward mode
runs the XLA tangent, reverse mode the Pallas backward (``dx``, ``dγ``, ``dβ``, the
residual's cotangent added in one pass), and ``jit``, ``vmap``, ``vmap`` of ``grad`` and
``remat`` work. Derivatives of second order do not: ``linear_call`` cannot differentiate
its residuals, so they raise a clear error naming ``implementation="xla"``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero, linear_call

from jaxnorm._config import Config
from jaxnorm._dtypes import standard_promotion
from jaxnorm._engine import pallas as _pallas
from jaxnorm._engine.inputs import broadcast_mask, check_epsilon
from jaxnorm._engine.router import affine_normalize

IMPLEMENTATIONS = (None, "xla", "pallas")


def check_implementation(implementation: Any) -> None:
  """Raises a ``ValueError`` unless ``implementation`` is None, ``"xla"`` or ``"pallas"``."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"implementation must be None (the default for the platform), 'xla' or 'pallas', "
      f"got {implementation!r}."
    )


def kernel_misfit(x: jax.Array, cfg: Config, *operands: Any) -> str | None:
  """Why the row kernels cannot compute this normalization, or None when they can: the
  statistics over a trailing run of axes (all of them the feature axes, when there are
  parameters), in float32, on one device, of a real input with rows of at most
  :data:`~jaxnorm._engine.pallas.MAX_ROW` elements."""
  trailing = tuple(range(x.ndim - len(cfg.axes), x.ndim))
  d = math.prod(x.shape[a] for a in cfg.axes)
  if cfg.axis_name is not None:
    return "the statistics are combined across devices (axis_name)"
  if cfg.channel_groups is not None:
    return "the statistics run over channel groups"
  if not cfg.axes or cfg.axes != trailing:
    return f"the reduced axes {cfg.axes} are not the trailing axes of an input of rank {x.ndim}"
  if any(o is not None for o in operands) and cfg.features != cfg.axes:
    return f"the feature axes {cfg.features} differ from the reduced axes {cfg.axes}"
  if jnp.dtype(cfg.dtype) != jnp.float32 or jnp.iscomplexobj(x):
    return f"the statistics are computed in {jnp.dtype(cfg.dtype)} (the kernels use float32)"
  if not 0 < d <= _pallas.MAX_ROW or x.size == 0:
    return f"a row has {d} elements (the kernels take 1 to {_pallas.MAX_ROW})"
  return None


# Where ``implementation=None`` takes the Pallas kernels: platform -> the row lengths
# (elements, inclusive) over which a device-timed run measured them faster than XLA
# (``benchmarks/gpu_suite.py``). Empty by measurement: on an H200 their forward+backward is
# 0.37-0.92x XLA's for float32 rows of 1,024-8,192 but 1.2-2.0x for Add & Norm and 16,384
# wide, a rule by row length cannot tell them apart, and the kernels have no second
# derivative, which a default would take from users (RESULTS items 57, 71).
PALLAS_BY_DEFAULT: dict[str, tuple[int, int]] = {}


def default_uses_kernels(platform: str, row: int) -> bool:
  """Whether ``implementation=None`` takes the kernels for rows of ``row`` elements on
  ``platform`` ("cpu", "gpu", "tpu"), by :data:`PALLAS_BY_DEFAULT`."""
  span = PALLAS_BY_DEFAULT.get(platform)
  return span is not None and span[0] <= row <= span[1]


def use_kernels(implementation: Any, misfit: str | None, row: int = 0) -> bool:
  """Whether to run the Pallas kernels for rows of ``row`` elements. ``None`` follows
  :func:`default_uses_kernels` on the default backend where the kernels apply (XLA
  everywhere as measured on an H100); an explicit ``"pallas"`` that
  cannot run raises with the reason."""
  check_implementation(implementation)
  if implementation is None:
    return misfit is None and default_uses_kernels(jax.default_backend(), row)
  if implementation != "pallas":
    return False
  if misfit is not None:
    raise ValueError(
      f"implementation='pallas' cannot compute this normalization: {misfit}. Use "
      f"implementation='xla' (or None, which falls back to XLA where no kernel applies)."
    )
  return True


def normalize_rows(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  cfg: Config,
  *,
  epsilon: Any,
  mask: jax.Array | None = None,
  residual: jax.Array | None = None,
  residual_dtype: Any = None,
) -> tuple[jax.Array, jax.Array | None]:
  """``(y, h)``: ``y`` the norm of ``h = x + residual`` (in ``residual_dtype``) or of ``x``
  (``h`` None), by the Pallas kernels; ``scale``/``bias`` as from ``affine_params``, the
  reduced axes trailing (:func:`kernel_misfit` is None)."""
  shape = x.shape
  d = math.prod(shape[a] for a in cfg.axes)

  def rows(a):
    return None if a is None else jnp.reshape(a, (-1, d))

  def params(a):
    return None if a is None else jnp.reshape(a, (1, d)).astype(jnp.float32)

  if residual is None and not jnp.issubdtype(x.dtype, jnp.inexact):
    x = x.astype(cfg.dtype)  # (with a residual the kernel adds in residual_dtype)
  spec = _pallas.RowSpec(
    d=d,
    center=cfg.center,
    epsilon_in_root=cfg.epsilon_in_root,
    has_residual=residual is not None,
    has_scale=scale is not None,
    has_bias=bias is not None,
    has_mask=mask is not None,
  )
  m = None if mask is None else rows(broadcast_mask(mask, shape)).astype(jnp.int8)
  eps = jnp.reshape(jnp.asarray(check_epsilon(epsilon), jnp.float32), (1, 1))
  row_cfg = cfg._replace(axes=(1,), features=(1,))
  h_dtype = None if residual is None else jnp.dtype(residual_dtype)
  y, h = _compiled_rows(
    (spec, row_cfg, h_dtype), rows(x), rows(residual), params(scale), params(bias), m, eps
  )
  return y.reshape(shape), (None if h is None else h.reshape(shape))


def _xla_rows(row_cfg, h, scale, bias, mask, eps):
  """The XLA path's output for the same rows (its JVP is the tangent of the kernels)."""
  mask = None if mask is None else mask != 0
  return affine_normalize(h, scale, bias, row_cfg, epsilon=eps[0, 0], mask=mask)[0]


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _rows(static, x, residual, scale, bias, mask, eps):
  spec, row_cfg, h_dtype = static
  return _pallas.forward(spec, x, residual, scale, bias, mask, eps, row_cfg.out_dtype, h_dtype)


@standard_promotion
def _rows_jvp(static, primals, tangents):
  spec, row_cfg, h_dtype = static
  x, residual, scale, bias, mask, eps = primals
  y, h = _rows(static, *primals)
  live = tuple(not isinstance(t, SymbolicZero) for t in tangents[:4])
  lin = tuple(t for t, keep in zip(tangents[:4], live, strict=False) if keep)
  normalized = x if h is None else h
  res = _first_order((normalized, scale, bias, mask, eps))

  def tangent(res, lin):
    hh, g, b, m, e = res
    it = iter(lin)  # the tangents given, in order; zeros for the absent ones
    dx, dres, dg, db = (
      next(it) if keep else (None if p is None else jnp.zeros(p.shape, p.dtype))
      for keep, p in zip(live, primals[:4], strict=True)
    )
    dx = jnp.asarray(dx)  # (x is always there; only the typing allows None)
    dh = dx if residual is None else dx.astype(h_dtype) + jnp.asarray(dres).astype(h_dtype)
    args = [(hh, dh)] + [(p, t) for p, t in ((g, dg), (b, db)) if p is not None]

    def fn(hh, *gb):
      sc, bi = _with_params(g, b, gb)
      return _xla_rows(row_cfg, hh, sc, bi, m, e)

    dy = jax.jvp(fn, tuple(p for p, _ in args), tuple(t for _, t in args))[1]
    return (dy,) if residual is None else (dy, dh)

  @standard_promotion
  def transpose(res, cts):
    hh, g, _, m, e = res
    dy, dh = cts if residual is not None else (cts[0], None)
    # dx in each differentiated input's dtype, written by the kernel (not copied or converted)
    wanted = [(p, keep) for p, keep in zip((x, residual), live, strict=False) if p is not None]
    dxs, dg, db = _pallas.backward(
      spec, hh, g, m, e, dy, dh, tuple(p.dtype for p, k in wanted if k)
    )
    it = iter(dxs)
    grads = (
      next(it) if live[0] else None,
      next(it) if residual is not None and live[1] else None,
      None if dg is None else dg.reshape(scale.shape).astype(scale.dtype),
      None if db is None else db.reshape(bias.shape).astype(bias.dtype),
    )
    return tuple(gr for gr, keep in zip(grads, live, strict=False) if keep)

  dy = dh = None
  if lin:
    out = linear_call(tangent, transpose, res, lin)
    dy, dh = out if residual is not None else (out[0], None)
  if not isinstance(tangents[5], SymbolicZero):  # a differentiated ε: one XLA term

    def fn(e):
      return _xla_rows(row_cfg, normalized, scale, bias, mask, e)

    de = jax.jvp(fn, (eps,), (tangents[5],))[1]
    dy = de if dy is None else dy + de
  if dy is None:
    dy = jnp.zeros(y.shape, y.dtype)
  if h is not None and dh is None:
    dh = jnp.zeros(h.shape, h.dtype)
  return (y, h), (dy, dh)


_rows.defjvp(_rows_jvp, symbolic_zeros=True)

# Compiled once per shape and kernel, as the XLA path's kernel is (eager calls run one
# program); under an outer jit this is inlined.
_compiled_rows = jax.jit(_rows, static_argnums=(0,))


def _with_params(scale, bias, given):
  """``(scale, bias)`` from the differentiated values ``given`` (the present ones, in order)."""
  it = iter(given)
  return (None if scale is None else next(it)), (None if bias is None else next(it))


@jax.custom_jvp
def _first_order(residuals):
  """``residuals`` unchanged; differentiating them (a second-order derivative of the
  kernels) raises a clear error instead of JAX's assertion inside ``linear_call``."""
  return residuals


@functools.partial(_first_order.defjvp, symbolic_zeros=True)
def _first_order_jvp(primals, tangents):
  if any(not isinstance(t, SymbolicZero) for t in jax.tree.leaves(tangents[0])):
    raise NotImplementedError(
      "implementation='pallas' has first derivatives only (grad, jvp, vjp, and vmap of "
      "them); this is a derivative of second order (e.g. a Hessian or grad of grad). "
      "Use implementation='xla' for it."
    )
  return primals[0], tangents[0]


def _register_linear_call_batching() -> None:
  """``vmap`` of a ``linear_call`` (here, ``vmap`` of ``grad``): JAX has no batching rule
  for it; this one maps its forward function, whose transpose JAX then derives. Registered
  only where JAX has none."""
  from jax._src import core
  from jax._src.custom_derivatives import linear_call_p
  from jax._src.interpreters import batching

  if linear_call_p in batching.fancy_primitive_batchers:
    return

  def rule(axis_data, args, dims, *, callee, **_):
    def fn(*a):
      return core.eval_jaxpr(callee.jaxpr, callee.consts, *a)

    out = jax.vmap(fn, in_axes=tuple(dims), axis_size=axis_data.size)(*args)
    return out, [0] * len(out)

  batching.fancy_primitive_batchers[linear_call_p] = rule


_register_linear_call_batching()
