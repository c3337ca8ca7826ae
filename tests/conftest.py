"""Strict test configuration: implicit rank promotion raises; hypothesis stays quick."""

import jax
import numpy as np
import pytest
from hypothesis import settings

jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile("jaxnorm", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("jaxnorm")


@pytest.fixture
def rng():
  """A seeded NumPy generator, fresh for each test."""
  return np.random.default_rng(0)
