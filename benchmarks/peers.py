"""The peers of the speed suite: each norm as Equinox, Haiku and tokamax write it.

Every builder returns ``(forward(params, x, rest), params, rest)`` in the suite's calling
convention (``x`` a pair ``(x, residual)`` for Add & Norm, whose peers add first and then
normalize, as Flax's baseline does), or None where the library has no such norm. Each peer
is used as its users would: Equinox's modules per sample under ``jax.vmap`` (its GroupNorm,
and so its InstanceNorm as one group per channel, wants channels first: it is given the
NCHW copy of the input), Haiku's through ``hk.transform`` (``transform_with_state`` for its
BatchNorm), tokamax's ``layer_norm`` over the last axis (LayerNorm and RMSNorm of
Transformer rows). ε is Flax's for every norm. The peers are optional (``pip install
-e ".[bench]"``); a missing one is skipped.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

EPS = {"batch_train": 1e-5, "batch_eval": 1e-5}  # else 1e-6 (Flax's LayerNorm family)


def _eps(kind):
  return EPS.get(kind, 1e-6)


def norm_kind(kind):
  """The norm of a suite case (``add_rms`` → ``rms``)."""
  return kind[len("add_") :] if kind.startswith("add_") else kind


def _with_residual(kind, norm):
  """``norm(params, x, rest)``, or for Add & Norm ``(norm(h), h)`` with ``h = x + r`` in
  float32 (the residual stream), as the suite's Flax baseline."""
  if not kind.startswith("add_"):
    return norm

  def forward(params, x, rest):
    h = x[0].astype(jnp.float32) + x[1]
    return norm(params, h, rest).astype(x[0].dtype), h

  return forward


def available():
  """The peers that import here, by name."""
  out = {}
  for name, module in (("equinox", "equinox"), ("haiku", "haiku"), ("tokamax", "tokamax")):
    try:
      out[name] = __import__(module)
    except ImportError:
      continue
  if "tokamax" in out:
    # tokamax reads its absl flags from sys.argv on first use, and refuses flags it does
    # not know (the suite's own); mark them parsed from the program name alone.
    from absl import flags

    if not flags.FLAGS.is_parsed():
      flags.FLAGS([sys.argv[0]])
  return out


def equinox(eqx, kind, x, dtype):
  """Equinox's LayerNorm, RMSNorm, GroupNorm (and InstanceNorm as GroupNorm with one
  channel per group); None for BatchNorm (its ``State`` protocol is timed by issue 23's
  front end)."""
  base = norm_kind(kind)
  x = x[0] if isinstance(x, tuple) else x
  c = x.shape[-1]
  if base == "layer":
    shape = x.shape[1:] if x.ndim == 4 else (c,)
    module = eqx.nn.LayerNorm(shape, eps=_eps(kind))
  elif base == "rms":
    module = eqx.nn.RMSNorm(c, eps=_eps(kind), use_bias=False)
  elif base in ("group", "instance"):
    module = eqx.nn.GroupNorm(32 if base == "group" else c, c, eps=_eps(kind))
  else:
    return None
  params, static = eqx.partition(module, eqx.is_array)
  per_sample = base in ("group", "instance") or x.ndim == 4

  def norm(params, x, rest):
    m = eqx.combine(params, static)
    if per_sample:  # (N, ...) → one call per sample
      return jax.vmap(m)(x)
    return jax.vmap(m)(x.reshape(-1, c)).reshape(x.shape)  # one call per row

  return _with_residual(kind, norm), params, {}


def _layout(kind):
  """The map from the suite's NHWC arrays to the layout Equinox's module takes."""
  if norm_kind(kind) in ("group", "instance"):  # GroupNorm: channels first (NCHW)
    return lambda a: jnp.moveaxis(a, -1, 1)
  return lambda a: a


def haiku(hk, kind, x, dtype):
  """Haiku's LayerNorm, RMSNorm, GroupNorm, InstanceNorm and BatchNorm."""
  base = norm_kind(kind)
  eps = _eps(kind)

  def layer(h, training=base == "batch_train"):
    if base == "layer":
      axis = (1, 2, 3) if h.ndim == 4 else -1
      return hk.LayerNorm(axis=axis, create_scale=True, create_offset=True, eps=eps)(h)
    if base == "rms":
      return hk.RMSNorm(axis=-1, eps=eps)(h)
    if base == "group":
      return hk.GroupNorm(groups=32, eps=eps)(h)
    if base == "instance":
      return hk.InstanceNorm(create_scale=True, create_offset=True, eps=eps)(h)
    bn = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.99, eps=eps)
    return bn(h, is_training=training)

  x0 = x[0] if isinstance(x, tuple) else x
  if base.startswith("batch"):
    t = hk.without_apply_rng(hk.transform_with_state(layer))
    params, state = t.init(None, x0, True)  # (init in training: it creates the averages)
    # The suite's running statistics (mean 0.1, var 1.5), as Flax's and jaxnorm's get.
    state = {
      name: {k: jnp.full_like(v, 0.1 if "mean" in name else 1.5) if k == "average" else v
             for k, v in ema.items()}
      for name, ema in state.items()
    }  # fmt: skip

    def norm(params, x, rest):
      y, _ = t.apply(params, rest, x)  # (the new state is computed, as in training)
      return y

    return _with_residual(kind, norm), params, state
  t = hk.without_apply_rng(hk.transform(layer))
  params = t.init(None, x0)
  return _with_residual(kind, lambda p, x, rest: t.apply(p, x)), params, {}


def tokamax(tk, kind, x, dtype, implementation=None):
  """tokamax's ``layer_norm`` over the last axis (``subtract_mean=False`` for RMSNorm);
  None for the other norms and for LayerNorm over several axes."""
  base = norm_kind(kind)
  x0 = x[0] if isinstance(x, tuple) else x
  if base not in ("layer", "rms") or x0.ndim == 4:
    return None
  c = x0.shape[-1]
  params = {"scale": jnp.ones(c, jnp.float32)}
  if base == "layer":
    params["offset"] = jnp.zeros(c, jnp.float32)

  def norm(params, x, rest):
    y = tk.layer_norm(x, params["scale"], params.get("offset"), epsilon=_eps(kind),
                      subtract_mean=base == "layer", implementation=implementation)  # fmt: skip
    return y.astype(dtype)

  return _with_residual(kind, norm), params, {}


def _same(a):
  return a


def build(kind, x, dtype, libs):
  """``{peer: (forward, params, rest, layout)}`` for every available peer that has this
  norm; ``layout`` maps the suite's input (and cotangent) to the one the peer takes."""
  out = {}
  if "equinox" in libs:
    built = equinox(libs["equinox"], kind, x, dtype)
    if built is not None:
      out["equinox"] = (*built, _layout(kind))
  if "haiku" in libs:
    out["haiku"] = (*haiku(libs["haiku"], kind, x, dtype), _same)
  if "tokamax" in libs:
    built = tokamax(libs["tokamax"], kind, x, dtype)
    if built is not None:
      out["tokamax"] = (*built, _same)
      if jax.devices()[0].platform == "gpu":
        out["tokamax_triton"] = (*tokamax(libs["tokamax"], kind, x, dtype, "triton"), _same)
  return out
