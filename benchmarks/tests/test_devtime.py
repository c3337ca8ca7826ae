"""The device-timing harness of ``benchmarks/devtime.py`` (no timing asserted): its loop
program does every iteration's whole work, and its arithmetic is the slope it says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from benchmarks import devtime


def _norm(params, x, rest):
  del rest
  return jaxnorm.layer_norm(x, scale=params["scale"], bias=params["bias"])


def _args(shape=(4, 16, 32)):
  rng = np.random.default_rng(0)
  params = {
    "scale": jnp.asarray(rng.normal(1, 0.1, shape[-1]), jnp.float32),
    "bias": jnp.ones(shape[-1]),
  }
  return params, jnp.asarray(rng.normal(size=shape), jnp.float32), {}


def test_loop_program_chains_every_iteration_on_the_whole_input():
  """The compiled loop returns n chained applications ``x ← f(x)``: every iteration ran,
  on the whole of the previous iteration's output."""
  args = _args()
  x, rest = devtime.loop_program(_norm, carry=1)(args, 5)
  want = args[1]
  for _ in range(5):
    want = _norm(args[0], want, {})
  np.testing.assert_allclose(np.asarray(x), np.asarray(want), atol=1e-5)
  assert rest == []  # (the one output became the next input)


def test_every_output_stays_live():
  """A forward+backward's other outputs (the gradients of the parameters and of x) are the
  loop's state: the last iteration's come back, equal to one call's."""

  def fwd_bwd(params, x, rest):
    y, vjp = jax.vjp(lambda p, x: _norm(p, x, rest), params, x)
    return y, vjp(jnp.ones_like(y) * jnp.arange(y.shape[-1])[None, None])

  args = _args()
  x, rest = devtime.loop_program(fwd_bwd)(args, 3)
  prev = _norm(args[0], _norm(args[0], args[1], {}), {})  # (the third call's input)
  want_y, want_grads = fwd_bwd(args[0], prev, {})
  np.testing.assert_allclose(np.asarray(x), np.asarray(want_y), atol=1e-5)
  for a, b in zip(rest, jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def test_no_output_is_copied_into_the_loop_state():
  """Each output lives in one buffer of the loop's state: the loop body of a copy-like
  kernel holds one fusion and no copy (a copy would add traffic to every iteration)."""
  x = jnp.ones((64, 128), jnp.float32)
  program = devtime.loop_program(lambda x: x * 1.0001 + 0.5, carry=0)
  hlo = program.lower((x,), 4).compile().as_text()
  assert "f32[64,128]{1,0} copy" not in hlo  # (the loop counter's scalar copy is free)
  assert devtime.state_copies(program.lower((x,), 4).compile()) == 0
  assert hlo.count("f32[64,128]{1,0} fusion(") == 2  # (the first call, the loop's body)


def test_an_input_no_output_matches_takes_the_sum_of_all():
  """A function whose outputs have no leaf of the input's shape: the next input is x plus
  the sum of the outputs, so the outputs still cannot be dropped."""
  x = jnp.arange(6.0).reshape(2, 3)
  got, _ = devtime.loop_program(lambda x: jnp.sum(x, 0), carry=0)((x,), 2)
  once = x + jnp.sum(x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(once + jnp.sum(once)))


def test_per_iteration_is_the_slope():
  # A call costs 2 ms of dispatch plus 0.5 ms per iteration: 5 and 20 iterations.
  assert devtime.per_iteration(2e-3 + 5 * 5e-4, 2e-3 + 20 * 5e-4, 5, 20) == pytest.approx(5e-4)


def test_cache_labels():
  class Device:
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

  assert devtime.cache_label(200 << 20, Device) == "cold"
  assert devtime.cache_label(60 << 20, Device) == "L2-warm"
  assert devtime.cache_label(1 << 30, jax.devices()[0]) == "n/a"  # (the CPU)
