"""Property tests: any rank, any shape, any set of axes, against the float64 reference."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import jaxnorm
from tests import reference as ref


@st.composite
def arrays_and_axes(draw):
  ndim = draw(st.integers(1, 4))
  shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
  axes = draw(
    st.lists(st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim, unique_by=lambda a: a % ndim)
  )
  seed = draw(st.integers(0, 2**16))
  offset = draw(st.sampled_from([0.0, 3.0, -50.0]))
  x = np.random.default_rng(seed).normal(offset, 2.0, shape).astype(np.float32)
  return x, tuple(axes)


@given(arrays_and_axes(), st.booleans(), st.booleans())
def test_normalize_matches_reference(case, center, use_mask):
  x, axes = case
  mask = None
  if use_mask:
    mask = np.random.default_rng(x.size).random(x.shape) < 0.6
  y = np.asarray(jaxnorm.normalize(x, axes, center, mask=mask), np.float64)
  if center:
    expected = ref.normalize(x, axes, mask=mask)
  else:
    _, ms, n = ref.stats(x, axes, center=False, mask=mask)
    expected = np.where(n > 0, x / np.sqrt(ms + 1e-5), 0.0)
  # Groups of one element (or constant ones) normalize to ~0; allow float32 rounding of
  # x − mean relative to sqrt(eps) there.
  np.testing.assert_allclose(y, expected, atol=5e-4, rtol=1e-4)
  assert y.shape == x.shape


@given(arrays_and_axes())
def test_moments_match_reference(case):
  x, axes = case
  m = jaxnorm.moments(x, axes, keepdims=True)
  mean, var, n = ref.stats(x, axes)
  np.testing.assert_allclose(np.asarray(m.mean), mean, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(m.var), var, atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(np.asarray(m.count), np.broadcast_to(n, m.count.shape))
