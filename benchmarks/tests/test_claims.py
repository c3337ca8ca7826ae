"""The README's accuracy figures hold on fresh data: each claim of
``benchmarks/claims.py`` (its bound stated in the README or the guides, word for word) is
measured again on seeds the script does not use (it starts at 0, these at 10,000) and must
stay within its bound. Flax's and Equinox's figures are not asserted here (a test must not
break when they fix a bug)."""

import pathlib
import re

import flax
import numpy as np
import pytest

from benchmarks import claims

ROOT = pathlib.Path(__file__).parents[2]
DOCS = " ".join(
  re.sub(r"\s+", " ", p.read_text())
  for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
)
FRESH = range(10_000, 10_002)  # (two draws each: the whole claim set in about 15 s)


@pytest.mark.parametrize("name", list(claims.CLAIMS))
def test_the_docs_state_the_claim(name):
  assert claims.CLAIMS[name].text in DOCS, claims.CLAIMS[name].text


@pytest.mark.parametrize("name", list(claims.CLAIMS))
def test_the_claim_holds_on_fresh_seeds(name):
  if name in claims.AGAINST_FLAX and flax.__version__ != claims.FLAX_MEASURED:
    pytest.skip(f"compared with Flax {claims.FLAX_MEASURED}'s outputs; this is {flax.__version__}")
  lo, hi = claims.CLAIMS[name].bound
  values = claims.measure(name, FRESH)
  assert all(lo <= v <= hi for v in values), (name, values, (lo, hi))


def test_the_bounds_can_fail():
  """The variance bound catches what it guards against: ``E[x²] − E[x]²`` in float32 (a
  textbook implementation, written here) is off by more than 1e5 times the bound."""
  rng = np.random.default_rng(10_000)
  x = (rng.normal(0.0, 1.0, (4096, 4)) + 1e4).astype(np.float32)
  naive = (x * x).mean(0, dtype=np.float32) - np.square(x.mean(0, dtype=np.float32))
  error = np.abs(np.float64(naive) - np.float64(x).var(0)).max()
  assert error > 1e5 * claims.CLAIMS["variance_1e4"].bound[1]
