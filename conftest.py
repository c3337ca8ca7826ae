"""Root pytest configuration: doctests in ``jaxnorm/`` print arrays with 4 decimals."""

import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
  np.set_printoptions(precision=4, suppress=True)
  doctest_namespace["jnp"] = jnp
  doctest_namespace["np"] = np
  yield
  np.set_printoptions(precision=8, suppress=False)
