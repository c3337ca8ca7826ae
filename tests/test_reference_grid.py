"""Every norm × layout × dtype × eager/jit against the float64 NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from tests import reference as ref
from tests.cases import CASES, LAYOUTS

# Tolerances on outputs of order 1–5, against a reference fed the same rounded input.
ATOL = {jnp.float32: 2e-5, jnp.bfloat16: 6e-2, jnp.float16: 8e-3}
GRID = [(case, layout) for case in CASES for layout in LAYOUTS]
GRID_IDS = [f"{case.name}-{layout}" for case, layout in GRID]


@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
  "dtype", [jnp.float32, jnp.bfloat16, jnp.float16], ids=["f32", "bf16", "f16"]
)
@pytest.mark.parametrize("case,layout", GRID, ids=GRID_IDS)
def test_matches_reference(case, layout, dtype, use_jit, rng):
  shape, channel = LAYOUTS[layout]
  channels = shape[channel]
  x = jnp.asarray(rng.normal(1.5, 2.0, shape), dtype)
  gamma = jnp.asarray(rng.normal(1.0, 0.3, channels), jnp.float32)
  beta = jnp.asarray(rng.normal(0.0, 0.3, channels), jnp.float32)
  fn = functools.partial(case.call, layout=layout)
  y = (jax.jit(fn) if use_jit else fn)(x, gamma, beta)
  # Flax's dtype rule: the input promoted with the float32 parameters.
  assert y.dtype == jnp.result_type(dtype, jnp.float32)
  assert y.shape == x.shape
  x64 = np.asarray(x.astype(jnp.float32))
  expected = case.reference(x64, np.asarray(gamma), np.asarray(beta), layout)
  np.testing.assert_allclose(np.asarray(y, np.float64), expected, atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_half_precision_without_params_keeps_dtype(dtype, rng):
  x = jnp.asarray(rng.normal(size=(4, 16)), dtype)
  y = jaxnorm.layer_norm(x)
  assert y.dtype == dtype
  expected = ref.layer_norm(np.asarray(x.astype(jnp.float32)))
  np.testing.assert_allclose(np.asarray(y, np.float64), expected, atol=ATOL[dtype] * 2)


@pytest.mark.parametrize(
  "center,scale", [(True, True), (False, True), (True, False), (False, False)]
)
@pytest.mark.parametrize("axes", [-1, 0, (0, 2), (1, -1), (0, 1, 2)])
def test_normalize_any_axes(axes, center, scale, rng):
  x = rng.normal(0.5, 1.5, (4, 5, 6)).astype(np.float32)
  y = jaxnorm.normalize(x, axes, center, scale)
  if not center and not scale:
    expected = x.astype(np.float64)
  elif not center:
    expected = ref.rms_norm(x, axes=axes, eps=1e-5)
  else:
    expected = ref.normalize(x, axes, center, scale)
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5, rtol=0)


def test_integer_input_gives_float32(rng):
  x = jnp.asarray(rng.integers(0, 10, (3, 7)))
  y = jaxnorm.normalize(x, -1)
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y), ref.normalize(np.asarray(x), -1), atol=2e-5)
