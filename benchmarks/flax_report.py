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
5. Equinox: eqx.nn.BatchNorm's bfloat16 batch statistics against float64, and
   jaxnorm.equinox's.

Every figure is a range over draws (and shapes), never one draw.

  python benchmarks/flax_report.py > benchmarks/results/cpu/flax_report.md
"""

from __future__ import annotations

import warnings

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


DRAWS = 20  # a distribution of draws, not one: a single draw's maximum varies by ~30 %
SEEDS = 20  # draws of the off-centre data per shape (the error of one draw is one sample)
# Off-centre shapes: the error of Flax's fast variance depends on the count per statistic.
OFFSET_SHAPES = {4: [(8, 6, 6, 64), (32, 8, 8, 64)], 3: [(4, 16, 768), (16, 128, 768)]}
VARIANCE_SHAPES = [(8, 6, 6, 64), (32, 8, 8, 64), (4096, 4)]


def _range(values, fmt=".2g"):
  """``lo–hi`` of ``values`` (one value when they agree)."""
  lo, hi = min(values), max(values)
  return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def ulp_table(rng):
  print(f"## 1. Ordinary data: jaxnorm vs Flax in float32 ulps at the output's scale, "
        f"{DRAWS} draws\n")  # fmt: skip
  print("| module | shape | output: median (range over draws) | 99.9th pct | max (range over "
        "draws) | running stats: max |")  # fmt: skip
  print("|---|---|---|---|---|---|")
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
      f"| {name} {kw or ''} | {shape} | {_range(medians, '.2f')} | {_range(pcts, '.1f')} "
      f"| {_range(maxima, '.2f')} | {_range(stats, '.2f') if stats else '—'} |"
    )


def offset_table(rng):
  print(f"\n## 2. Mean 1e4, std 1 (float32 data): largest output error against float64, "
        f"range over {SEEDS} draws of each of the shapes {OFFSET_SHAPES}\n")  # fmt: skip
  print("| module | jaxnorm | Flax (default fast variance) |")
  print("|---|---|---|")
  for name, kw, shape in MODULES:
    ours, theirs = getattr(jaxnorm, name)(**kw), getattr(nn, name)(**kw)
    errors: tuple[list[float], list[float]] = ([], [])
    for off_shape in OFFSET_SHAPES[len(shape)]:
      for _ in range(SEEDS):
        x = (rng.normal(0.0, 1.0, off_shape) + 1e4).astype(np.float32)
        variables = theirs.init(jax.random.key(0), x)
        expected = _reference(name, kw, np.float64(x))
        for out, module in zip(errors, (ours, theirs), strict=True):
          y = np.asarray(_apply(module, variables, x)[0], np.float64)
          out.append(np.abs(y - expected).max())
    print(f"| {name} {kw or ''} | {_range(errors[0])} | {_range(errors[1], '.3g')} |")
  # The variance itself (true value ~1): BatchNorm's batch variance, stored with momentum 0.
  print(f"\nBatchNorm's batch variance (true value ~1), largest error per draw, {SEEDS} draws "
        f"per shape:\n")  # fmt: skip
  print("| shape | jaxnorm | Flax |")
  print("|---|---|---|")
  for shape in VARIANCE_SHAPES:
    errs: tuple[list[float], list[float]] = ([], [])
    for _ in range(SEEDS):
      x = (rng.normal(0.0, 1.0, shape) + 1e4).astype(np.float32)
      true = np.float64(x).var(tuple(range(x.ndim - 1)))
      for out, lib in zip(errs, (jaxnorm, nn), strict=True):
        m = lib.BatchNorm(use_running_average=False, momentum=0.0)
        _, upd = _apply(m, m.init(jax.random.key(0), x), x)
        out.append(np.abs(np.float64(upd["batch_stats"]["var"]) - true).max())
    print(f"| {shape} | {_range(errs[0])} | {_range(errs[1], '.3g')} |")


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
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y_o = _apply(jaxnorm.BatchNorm(**bn), variables, x1)[0]
  print(
    f"- BatchNorm training on one value per feature: Flax returns {np.asarray(y)[0]} (β), "
    f"silently; jaxnorm returns {np.asarray(y_o)[0]} with "
    f"{[type(w.message).__name__ for w in caught]}"
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

  # Garbage (NaN) at masked-out positions: do the valid gradients stay finite?
  xg = jnp.asarray(rng.normal(size=(4, 6, 8)), jnp.float32)
  valid = jnp.broadcast_to((jnp.arange(6) < 4)[None, :, None], xg.shape)
  xg = jnp.where(valid, xg, jnp.nan)
  for name, kw in (("BatchNorm", dict(use_running_average=False)), ("GroupNorm",
                   dict(num_groups=2)), ("InstanceNorm", {}), ("LayerNorm", {})):  # fmt: skip
    finite = []
    for lib in (nn, jaxnorm):
      m = getattr(lib, name)(**kw)
      v = m.init(jax.random.key(0), jnp.zeros_like(xg))

      def loss(x, m=m, v=v):
        return jnp.where(valid, _apply(m, v, x, mask=valid)[0], 0.0).sum()

      finite.append(bool(np.isfinite(jax.grad(loss)(xg)[np.asarray(valid)]).all()))
    print(f"- {name} with NaN at masked-out positions: gradients at valid positions finite: "
          f"Flax {finite[0]}, jaxnorm {finite[1]}")  # fmt: skip

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

  print(f"\n## 4. jaxnorm.nnx vs flax.nnx in float32 ulps at the output's scale, {DRAWS} "
        f"draws (ranges over draws)\n")  # fmt: skip
  print("| module | shape | output: median | 99.9th pct | max | BatchStats: max |")
  print("|---|---|---|---|---|---|")
  for name, kw, shape in MODULES:
    if name == "LayerNorm" and kw:
      continue  # the NNX constructor has the same meaning; one LayerNorm row suffices
    args = (shape[-1], 32) if name == "GroupNorm" else (shape[-1],)
    figures: list[list[float]] = [[], [], [], []]
    for _ in range(DRAWS):
      x = jnp.asarray(rng.normal(0.7, 1.3, shape), jnp.float32)
      ours, theirs = (lib_cls(*args, rngs=nnx.Rngs(0)) for lib_cls in
                      (getattr(jnnx, name), getattr(nnx, name)))  # fmt: skip
      u = _ulps(ours(x), theirs(x))
      figures[0].append(np.median(u))
      figures[1].append(np.percentile(u, 99.9))
      figures[2].append(u.max())
      if name == "BatchNorm":
        pairs = ((ours.mean, theirs.mean), (ours.var, theirs.var))
        figures[3].append(max(_ulps(a[...], b[...]).max() for a, b in pairs))
    stats = _range(figures[3], ".2f") if figures[3] else "—"
    print(f"| {name} | {shape} | {_range(figures[0], '.2f')} | {_range(figures[1], '.1f')} "
          f"| {_range(figures[2], '.2f')} | {stats} |")  # fmt: skip
  g = 8
  errs: tuple[list[float], list[float]] = ([], [])
  for _ in range(SEEDS):
    x = rng.normal(0.5, 2.0, (8, 16, 64)).astype(np.float32)
    xs = np.float64(x).reshape(8, 16, g, 64 // g)
    mean = xs.mean(-1, keepdims=True)
    var = ((xs - mean) ** 2).mean(-1, keepdims=True)
    expected = ((xs - mean) / np.sqrt(var + 1e-6)).reshape(x.shape)
    for out, lib in zip(errs, (jnnx, nnx), strict=True):
      module = lib.GroupNorm(64, g, reduction_axes=-1, rngs=nnx.Rngs(0))
      out.append(np.abs(np.asarray(module(x), np.float64) - expected).max())
  print(
    f"\nGroupNorm(64, {g}, reduction_axes=-1) on (8, 16, 64) of mean 0.5, std 2, largest "
    f"error against float64 over {SEEDS} draws: jaxnorm.nnx {_range(errs[0])}, flax.nnx "
    f"{_range(errs[1], '.3g')}"
  )


def equinox_table(rng):
  """eqx.nn.BatchNorm on bfloat16 data of mean 100, std 2 (``dtype=bfloat16``: Equinox's
  float32 state fails on bfloat16 input): the batch statistics it stores and its outputs
  against float64, over batch sizes and draws; jaxnorm.equinox's likewise (both store the
  statistics in bfloat16, whose spacing at 100 is 0.5)."""
  import equinox as eqx

  import jaxnorm.equinox as jeqx

  print(f"\n## 5. Equinox BatchNorm(dtype=bfloat16), bfloat16 data of mean 100, std 2 "
        f"(4 channels of 8x8): largest errors against float64, {SEEDS} draws\n")  # fmt: skip
  print("| batch | eqx.nn: stored mean | stored variance (true ~4) | output | "
        "jaxnorm.equinox: stored mean | stored variance | output |")  # fmt: skip
  print("|---|---|---|---|---|---|---|")
  for batch in (8, 64, 1024):
    errs: list[list[float]] = [[] for _ in range(6)]
    for _ in range(SEEDS):
      x = jnp.asarray(rng.normal(100.0, 2.0, (batch, 4, 8, 8)), jnp.bfloat16)
      xf = np.asarray(x, np.float64)
      true_mean, true_var = xf.mean((0, 2, 3)), xf.var((0, 2, 3))
      expected = (xf - true_mean[:, None, None]) / np.sqrt(true_var[:, None, None] + 1e-5)
      for i, lib in enumerate((eqx.nn, jeqx)):
        with warnings.catch_warnings():
          warnings.simplefilter("ignore")
          bn, state = eqx.nn.make_with_state(lib.BatchNorm)(
            4, "batch", momentum=0.0, mode="ema", dtype=jnp.bfloat16
          )
        fn = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        y, state = fn(x, state)
        mean, var = state.get(bn.ema_state_index)
        errs[3 * i].append(np.abs(np.asarray(mean, np.float64) - true_mean).max())
        errs[3 * i + 1].append(np.abs(np.asarray(var, np.float64) - true_var).max())
        errs[3 * i + 2].append(np.abs(np.asarray(y, np.float64) - expected).max())
    print(f"| {batch} | " + " | ".join(_range(e) for e in errs) + " |")


def main():
  rng = np.random.default_rng(0)
  print(f"jax {jax.__version__}, flax {__import__('flax').__version__}, {jax.devices()[0]}\n")
  ulp_table(rng)
  offset_table(rng)
  silent_errors(rng)
  nnx_table(rng)
  equinox_table(rng)


if __name__ == "__main__":
  main()
