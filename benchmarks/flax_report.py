"""How jaxnorm's modules differ from their flax.linen twins, measured (not a test: Flax's
defects are reported here, never asserted, so jaxnorm's CI does not depend on them).

1. Ordinary data (normal, mean 0.7, std 1.3, float32): the distance between jaxnorm's and
   Flax's outputs (and BatchNorm's updated running statistics) in float32 ulps at the
   output's scale (``|a − b| / (eps·max(|b|, 1))``, eps = 2⁻²³; normalized outputs are O(1),
   and an ulp of a value near 0 is no unit of rounding), per module: the figure behind
   "equal to float32 rounding" in the README, over several draws (a single draw's maximum
   is one sample of a distribution).
2. Far off-centre data (mean 1e4, std 1): each library's largest output error against a
   float64 NumPy computation of the formula, and the error of BatchNorm's batch variance.
3. Inputs where Flax goes silently wrong: one value per feature in BatchNorm training, a
   fully masked group, a NaN batch followed by clean ones.
4. NNX: jaxnorm.nnx against flax.nnx on the same ordinary data (ulps as in 1), and
   GroupNorm with reduction_axes=-1 on (B, T, C), where flax.nnx.GroupNorm repeats the
   group statistics along axis 1: each library's error against float64.

  python benchmarks/flax_report.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm

MODULES = [  # (name, kwargs, input shape)
  ("BatchNorm", dict(use_running_average=False), (32, 8, 8, 64)),
  ("LayerNorm", {}, (16, 128, 768)),
  ("LayerNorm", dict(reduction_axes=(1, 2, 3)), (32, 8, 8, 64)),
  ("RMSNorm", {}, (16, 128, 768)),
  ("GroupNorm", dict(num_groups=32), (32, 8, 8, 64)),
  ("InstanceNorm", {}, (32, 8, 8, 64)),
]


def _apply(module, variables, x, **kw):
  return module.apply(variables, x, mutable=["batch_stats"], **kw)


def _ulps(a, b):
  """|a − b| in float32 ulps at the scale of b, elementwise: / (eps·max(|b|, 1))."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b) / (np.finfo(np.float32).eps * np.maximum(np.abs(b), 1.0))


DRAWS = 10  # a distribution of draws, not one: a single draw's maximum varies by ~30 %


def ulp_table(rng):
  print(f"## 1. Ordinary data: jaxnorm vs Flax in float32 ulps at the output's scale, "
        f"{DRAWS} draws\n")  # fmt: skip
  print("| module | shape | output: median | 99.9th pct | max: median of draws | max: largest "
        "| running stats: largest |")  # fmt: skip
  print("|---|---|---|---|---|---|---|")
  for name, kw, shape in MODULES:
    ours, theirs = getattr(jaxnorm, name)(**kw), getattr(nn, name)(**kw)
    medians, pcts, maxima, stats = [], [], [], []
    for _ in range(DRAWS):
      x = jnp.asarray(rng.normal(0.7, 1.3, shape), jnp.float32)
      variables = theirs.init(jax.random.key(0), x)
      (y_o, s_o), (y_t, s_t) = _apply(ours, variables, x), _apply(theirs, variables, x)
      u = _ulps(y_o, y_t)
      medians.append(np.median(u))
      pcts.append(np.percentile(u, 99.9))
      maxima.append(u.max())
      if s_t:
        leaves = zip(jax.tree_util.tree_leaves(s_o), jax.tree_util.tree_leaves(s_t), strict=True)
        stats.append(max(_ulps(a, b).max() for a, b in leaves))
    print(
      f"| {name} {kw or ''} | {shape} | {np.median(medians):.0f} | {np.median(pcts):.1f} "
      f"| {np.median(maxima):.1f} | {max(maxima):.1f} | {f'{max(stats):.1f}' if stats else '—'} |"
    )


def offset_table(rng):
  print("\n## 2. Mean 1e4, std 1 (float32 data): largest error against float64\n")
  print("| module | jaxnorm | Flax (default fast variance) |")
  print("|---|---|---|")
  for name, kw, shape in MODULES:
    shape = (8, 6, 6, 64) if len(shape) == 4 else (4, 16, 768)
    x = (rng.normal(0.0, 1.0, shape) + 1e4).astype(np.float32)
    ours, theirs = getattr(jaxnorm, name)(**kw), getattr(nn, name)(**kw)
    variables = theirs.init(jax.random.key(0), x)
    y_o, y_t = _apply(ours, variables, x)[0], _apply(theirs, variables, x)[0]
    expected = _reference(name, kw, np.float64(x))
    err_o = np.abs(np.asarray(y_o, np.float64) - expected).max()
    err_t = np.abs(np.asarray(y_t, np.float64) - expected).max()
    print(f"| {name} {kw or ''} | {err_o:.2g} | {err_t:.3g} |")
  # The variance itself (true value 1): BatchNorm's batch variance, stored with momentum 0.
  var_errors = {}
  for lib in (jaxnorm, nn):
    errs = []
    for _ in range(DRAWS):
      x = (rng.normal(0.0, 1.0, (8, 6, 6, 64)) + 1e4).astype(np.float32)
      m = lib.BatchNorm(use_running_average=False, momentum=0.0)
      _, upd = _apply(m, m.init(jax.random.key(0), x), x)
      errs.append(
        np.abs(np.float64(upd["batch_stats"]["var"]) - np.float64(x).var((0, 1, 2))).max()
      )
    var_errors[lib.__name__] = (min(errs), max(errs))
  (jo_lo, jo_hi), (fl_lo, fl_hi) = var_errors["jaxnorm"], var_errors["flax.linen"]
  print(f"\nBatchNorm's batch variance (true value ~1) over {DRAWS} draws, largest error per "
        f"draw: jaxnorm {jo_lo:.2g}–{jo_hi:.2g}, Flax {fl_lo:.3g}–{fl_hi:.3g}")  # fmt: skip


def _reference(name, kw, x):
  """The formula in float64 NumPy for the MODULES above (default parameters: γ=1, β=0)."""
  center = name != "RMSNorm"
  eps = 1e-5 if name == "BatchNorm" else 1e-6
  if name == "BatchNorm":
    axes = tuple(range(x.ndim - 1))
  elif name == "InstanceNorm":
    axes = tuple(range(1, x.ndim - 1))
  elif name == "GroupNorm":
    g = kw["num_groups"]
    xs = x.reshape(x.shape[:-1] + (g, x.shape[-1] // g))
    axes = tuple(range(1, xs.ndim - 2)) + (xs.ndim - 1,)
    mean = xs.mean(axes, keepdims=True)
    var = ((xs - mean) ** 2).mean(axes, keepdims=True)
    return ((xs - mean) / np.sqrt(var + eps)).reshape(x.shape)
  else:
    axes = kw.get("reduction_axes", -1)
  mean = x.mean(axes, keepdims=True) if center else 0.0
  var = ((x - mean) ** 2).mean(axes, keepdims=True)
  return (x - mean) / np.sqrt(var + eps)


def silent_errors(rng):
  print("\n## 3. Where Flax goes silently wrong\n")
  x1 = jnp.full((1, 3), 5.0)
  bn = dict(use_running_average=False)
  variables = nn.BatchNorm(**bn).init(jax.random.key(0), jnp.ones((4, 3)))
  y = _apply(nn.BatchNorm(**bn), variables, x1)[0]
  try:
    _apply(jaxnorm.BatchNorm(**bn), variables, x1)
    ours = "no error"
  except ValueError as e:
    ours = f"ValueError: {str(e)[:60]}…"
  print(
    f"- BatchNorm training on one value per feature: Flax returns {np.asarray(y)[0]} (β); "
    f"jaxnorm raises {ours}"
  )

  x = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)
  mask = jnp.ones((4, 8), bool).at[1].set(False)
  params = {"params": {"scale": jnp.ones(8), "bias": jnp.zeros(8)}}
  y_t = nn.LayerNorm().apply(params, x, mask=mask)
  y_o = jaxnorm.LayerNorm().apply(params, x, mask=mask)
  print(
    f"- LayerNorm row with every element masked: Flax gives NaN: "
    f"{bool(np.isnan(y_t[1]).all())}; jaxnorm gives β (finite: {bool(np.isfinite(y_o).all())})"
  )

  for lib in (nn, jaxnorm):
    m = lib.BatchNorm(use_running_average=False, momentum=0.9)
    v = m.init(jax.random.key(0), x)
    bad = x.at[0, 2].set(jnp.nan)
    for batch in [bad] + [jnp.asarray(rng.normal(size=(4, 8)), jnp.float32) for _ in range(50)]:
      _, upd = _apply(m, v, batch)
      v = {**v, **upd}
    finite = bool(np.isfinite(v["batch_stats"]["mean"]).all())
    print(f"- {lib.__name__}: running mean finite after one NaN batch and 50 clean ones: {finite}")

  # float32 rows at 1e18: each square fits, their sum (~1e39) overflows.
  big = jnp.asarray(rng.normal(size=(4, 768)) * 1e18, jnp.float32)

  def rows(y):  # per row: "exact" (unit RMS), "NaN" or "zeros"
    y = np.asarray(y, np.float64).reshape(4, -1)
    rms = np.sqrt(np.mean(y * y, axis=1))
    return ", ".join("NaN" if np.isnan(r) else "zeros" if r == 0 else f"RMS {r:.3f}" for r in rms)

  for name, kw, x_ in (
    ("LayerNorm", {}, big),
    ("RMSNorm", {}, big),
    ("BatchNorm", dict(use_running_average=False), big.T),
    ("GroupNorm", dict(num_groups=2), big.reshape(4, 8, 96)),
  ):
    out = []
    for lib in (nn, jaxnorm):
      m = getattr(lib, name)(**kw)
      v = m.init(jax.random.key(0), x_)
      y = _apply(m, v, x_)[0]
      out.append(rows(y.T if name == "BatchNorm" else y))
      dy = jax.grad(lambda x, m=m, v=v: jnp.sum(_apply(m, v, x)[0] ** 2))(x_)
      out.append("NaN" if np.isnan(dy).all() else "zeros" if (dy == 0).all() else "finite")
    print(
      f"- {name} on float32 rows at 1e18 (the sum of squares overflows): Flax {out[0]} "
      f"(gradient {out[1]}); jaxnorm {out[2]} (gradient {out[3]})"
    )


def nnx_table(rng):
  from flax import nnx

  from jaxnorm import nnx as jnnx

  print("\n## 4. jaxnorm.nnx vs flax.nnx in float32 ulps at the output's scale\n")
  print("| module | shape | output: median | 99.9th pct | max | BatchStats: max |")
  print("|---|---|---|---|---|---|")
  for name, kw, shape in MODULES:
    if name == "LayerNorm" and kw:
      continue  # the NNX constructor has the same meaning; one LayerNorm row suffices
    args = (shape[-1], 32) if name == "GroupNorm" else (shape[-1],)
    x = jnp.asarray(rng.normal(0.7, 1.3, shape), jnp.float32)
    ours, theirs = (lib_cls(*args, rngs=nnx.Rngs(0)) for lib_cls in
                    (getattr(jnnx, name), getattr(nnx, name)))  # fmt: skip
    u = _ulps(ours(x), theirs(x))
    stats = "—"
    if name == "BatchNorm":
      pairs = ((ours.mean, theirs.mean), (ours.var, theirs.var))
      stats = f"{max(_ulps(a[...], b[...]).max() for a, b in pairs):.0f}"
    print(
      f"| {name} | {shape} | {np.median(u):.0f} | {np.percentile(u, 99.9):.0f} "
      f"| {u.max():.0f} | {stats} |"
    )
  x = rng.normal(0.5, 2.0, (8, 16, 64)).astype(np.float32)
  g = 8
  xs = np.float64(x).reshape(8, 16, g, 64 // g)
  mean = xs.mean(-1, keepdims=True)
  var = ((xs - mean) ** 2).mean(-1, keepdims=True)
  expected = ((xs - mean) / np.sqrt(var + 1e-6)).reshape(x.shape)
  errs = []
  for lib in (jnnx, nnx):
    module = lib.GroupNorm(64, g, reduction_axes=-1, rngs=nnx.Rngs(0))
    errs.append(np.abs(np.asarray(module(x), np.float64) - expected).max())
  print(
    f"\nGroupNorm(64, {g}, reduction_axes=-1) on (8, 16, 64), largest error against float64: "
    f"jaxnorm.nnx {errs[0]:.2g}, flax.nnx {errs[1]:.3g}"
  )


def main():
  rng = np.random.default_rng(0)
  print(f"jax {jax.__version__}, flax {__import__('flax').__version__}, {jax.devices()[0]}\n")
  ulp_table(rng)
  offset_table(rng)
  silent_errors(rng)
  nnx_table(rng)


if __name__ == "__main__":
  main()
