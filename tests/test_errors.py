"""Every impossible request raises at trace time, saying what was expected, what was got,
and how to fix it."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm

X = jnp.ones((4, 5, 6))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
  "call,error,pattern",
  [
    (
      lambda x: jaxnorm.normalize(x, 3),
      ValueError,
      r"axes=3 is out of range for an input of rank 3.*\[-3, 2\]",
    ),
    (
      lambda x: jaxnorm.normalize(x, (0, -3)),
      ValueError,
      r"names the same axis more than once.*\(0, 0\).*list each axis once",
    ),
    (lambda x: jaxnorm.normalize(x, 1.5), TypeError, r"axes must be integers.*got 1.5"),
    (
      lambda x: jaxnorm.layer_norm(x, reduction_axes=(1, 5)),
      ValueError,
      r"reduction_axes=\(1, 5\) is out of range",
    ),
    (lambda x: jaxnorm.batch_norm(x, axis=-4), ValueError, r"axis=-4 is out of range"),
    (
      lambda x: jaxnorm.group_norm(x, num_groups=4),
      ValueError,
      r"num_groups=4 does not divide the 6 channels.*\[1, 2, 3, 6\]",
    ),
    (
      lambda x: jaxnorm.group_norm(x, num_groups=None, group_size=4),
      ValueError,
      r"group_size=4 does not divide the 6 channels",
    ),
    (
      lambda x: jaxnorm.group_norm(x, num_groups=2, group_size=3),
      ValueError,
      r"exactly one of num_groups and group_size.*pass num_groups=None",
    ),
    (
      lambda x: jaxnorm.group_norm(x, num_groups=None),
      ValueError,
      r"exactly one of num_groups and group_size",
    ),
    (
      lambda x: jaxnorm.group_norm(x, num_groups=2, reduction_axes=1),
      ValueError,
      r"reduction_axes \(1,\) must include the channel axis 2",
    ),
    (
      lambda x: jaxnorm.layer_norm(x, jnp.ones(5)),
      ValueError,
      r"scale has shape \(5,\), but an input of shape \(4, 5, 6\) has features of shape "
      r"\(6,\).*pass a scale of shape \(6,\)",
    ),
    (
      lambda x: jaxnorm.batch_norm(x, None, jnp.ones((6, 1))),
      ValueError,
      r"bias has shape \(6, 1\).*pass a bias of shape \(6,\)",
    ),
    (
      lambda x: jaxnorm.group_norm(x, jnp.ones(3), num_groups=2),
      ValueError,
      r"scale has shape \(3,\)",
    ),
    (lambda x: jaxnorm.batch_norm(x, mean=jnp.zeros(6)), ValueError, r"only one of mean and var"),
    (
      lambda x: jaxnorm.batch_norm(x, mean=jnp.zeros(5), var=jnp.ones(5)),
      ValueError,
      r"mean has shape \(5,\).*have shape \(6,\)",
    ),
    (
      lambda x: jaxnorm.batch_norm(x, axis=-1, reduction_axes=(0, 2)),
      ValueError,
      r"reduction_axes \(0, 2\) overlap the feature axis \(2,\)",
    ),
    (
      lambda x: jaxnorm.instance_norm(x, feature_axes=0),
      ValueError,
      r"includes axis 0, the batch axis of InstanceNorm",
    ),
    (
      lambda x: jaxnorm.layer_norm(x, epsilon=float("nan")),
      ValueError,
      r"epsilon must be >= 0.*got nan",
    ),
    (lambda x: jaxnorm.rms_norm(x, epsilon=-1e-6), ValueError, r"epsilon must be >= 0.*-1e-06"),
    (
      lambda x: jaxnorm.group_norm(x, num_groups=2, feature_axis=(1, 2)),
      ValueError,
      r"one axis, but got feature_axis=\(1, 2\) \(2 axes\); pass a single int",
    ),
    (
      lambda x: jaxnorm.layer_norm(x.astype(jnp.complex64), dtype=jnp.float32),
      TypeError,
      r"dtype=float32 would discard the imaginary part of a complex64 input",
    ),
    (
      lambda x: jaxnorm.normalize(x, -1, mask=jnp.ones((5, 5), bool)),
      ValueError,
      r"mask of shape \(5, 5\) does not broadcast to the input's shape \(4, 5, 6\)",
    ),
  ],
)
def test_pure_function_errors(call, error, pattern, jit):
  with pytest.raises(error, match=pattern):
    (jax.jit(call) if jit else call)(X)


def test_zero_epsilon_is_the_textbook_formula():
  x = jnp.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
  y = jaxnorm.rms_norm(x, epsilon=0)
  np.testing.assert_allclose(y[0], np.array([1, 2, 3, 4]) / np.sqrt(7.5), rtol=1e-6)
  assert np.all(np.isnan(y[1]))  # x / RMS(x) with RMS 0: what the formula gives
  np.testing.assert_allclose(
    jaxnorm.layer_norm(x[:1], epsilon=0.0), (x[:1] - 2.5) / np.sqrt(1.25), rtol=1e-6
  )
  bn = jaxnorm.BatchNorm(epsilon=0)
  variables = bn.init(jax.random.key(0), x, use_running_average=False)
  np.testing.assert_allclose(bn.apply(variables, x, True), x, rtol=1e-6)  # var 1, mean 0


@pytest.mark.parametrize(
  "momentum", [1.5, np.float32(1.5), jnp.float32(-0.5), np.array(float("nan")), jnp.array(2.0)]
)
def test_every_concrete_momentum_is_checked(momentum):
  stats = jaxnorm.Moments(jnp.zeros(3), jnp.ones(3), jnp.ones(3))
  with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\].*0.1 is 0.9"):
    jaxnorm.update_running_average(jnp.zeros(3), jnp.ones(3), stats, momentum)
  bn = jaxnorm.BatchNorm(use_running_average=False, momentum=momentum)
  with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\]"):
    bn.init(jax.random.key(0), jnp.ones((4, 3)))


def test_traced_momentum_is_accepted():
  stats = jaxnorm.Moments(jnp.full(3, 2.0), jnp.ones(3), jnp.ones(3))
  mean, _ = jax.jit(lambda m: jaxnorm.update_running_average(jnp.zeros(3), jnp.ones(3), stats, m))(
    0.5
  )
  np.testing.assert_allclose(mean, 1.0)


def test_running_average_errors():
  stats = jaxnorm.Moments(jnp.zeros(3), jnp.ones(3), jnp.ones(3))
  with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\].*got 1.5.*0.1 is 0.9"):
    jaxnorm.update_running_average(jnp.zeros(3), jnp.ones(3), stats, 1.5)
  with pytest.raises(ValueError, match=r"running mean has shape \(4,\).*shape \(3,\)"):
    jaxnorm.update_running_average(jnp.zeros(4), jnp.ones(3), stats, 0.9)


def test_use_running_average_exactly_once():
  x = jnp.ones((4, 3))
  with pytest.raises(ValueError, match=r"use_running_average exactly once.*got neither"):
    jaxnorm.BatchNorm().init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"got both \(True and False\)"):
    jaxnorm.BatchNorm(use_running_average=True).init(
      jax.random.key(0), x, use_running_average=False
    )


def test_training_on_one_value_per_statistic_warns_and_gives_flax_s_result():
  """A batch of one in training: a warning that names the layer and says the output is the
  bias, and Flax's result (β; running mean towards x, variance towards 0), so that Flax's
  idioms on dummy batches (``nnx.tabulate``, transforms' tests) keep working; the warning
  filter turns it into an error."""

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return jaxnorm.BatchNorm(use_running_average=False, momentum=0.5, name="bn")(x)

  x = jnp.asarray([[1.0, -2.0, 3.0]])
  variables = Net().init(jax.random.key(0), x)  # (init's dummy batch: no warning needed)
  variables["params"]["bn"]["bias"] = jnp.asarray([0.1, 0.2, 0.3])
  with pytest.warns(jaxnorm.SingleValueWarning, match=r"BatchNorm 'bn' is training on one "
                    r"value per statistic.*shape \(1, 3\).*just the bias"):  # fmt: skip
    y, updated = Net().apply(variables, x, mutable=["batch_stats"])
  np.testing.assert_allclose(y, [[0.1, 0.2, 0.3]], atol=1e-6)
  np.testing.assert_allclose(updated["batch_stats"]["bn"]["mean"], 0.5 * x[0], rtol=1e-6)
  np.testing.assert_allclose(updated["batch_stats"]["bn"]["var"], [0.5] * 3, rtol=1e-6)
  with pytest.warns(jaxnorm.SingleValueWarning, match=r"batch_norm is training on one value"):
    jaxnorm.batch_norm(X[:1, :1])
  bn = jaxnorm.nnx.BatchNorm(3, rngs=nnx.Rngs(0))
  with pytest.warns(jaxnorm.SingleValueWarning, match=r"BatchNorm\(3\) is training"):
    bn(x)
  with warnings.catch_warnings():
    warnings.filterwarnings("error", category=jaxnorm.SingleValueWarning)
    with pytest.raises(jaxnorm.SingleValueWarning):
      jaxnorm.batch_norm(X[:1, :1])


def test_flax_idioms_on_a_dummy_batch_of_one():
  """``nnx.tabulate`` on a batch of one (failed while training on one value was an error)."""
  rngs = nnx.Rngs(0)
  model = nnx.Sequential(nnx.Linear(4, 8, rngs=rngs), jaxnorm.nnx.BatchNorm(8, rngs=rngs))
  with pytest.warns(jaxnorm.SingleValueWarning):
    table = nnx.tabulate(model, jnp.ones((1, 4)))
  assert "BatchNorm" in table


def test_module_param_shape_mismatch_is_reported():
  ln = jaxnorm.LayerNorm()
  variables = ln.init(jax.random.key(0), jnp.ones((2, 8)))
  with pytest.raises(Exception, match=r"(?i)shape"):
    ln.apply(variables, jnp.ones((2, 6)))


def test_module_errors_name_the_fix():
  with pytest.raises(ValueError, match=r"num_groups=32 does not divide the 12 channels"):
    jaxnorm.GroupNorm().init(jax.random.key(0), jnp.ones((2, 4, 12)))
  with pytest.raises(ValueError, match=r"feature_axis=3 is out of range"):
    jaxnorm.GroupNorm(num_groups=2, feature_axis=3).init(jax.random.key(0), jnp.ones((2, 4, 8)))
  with pytest.raises(ValueError, match=r"one axis, but got feature_axis=\(1, 2\)"):
    jaxnorm.GroupNorm(num_groups=2, feature_axis=(1, 2)).init(
      jax.random.key(0), jnp.ones((2, 4, 8))
    )


@pytest.mark.parametrize(
  "call,error,pattern",
  [
    (lambda: jaxnorm.GroupNorm(num_groups=2.0).init(jax.random.key(0), X), TypeError,
     r"num_groups must be an int, got 2.0 \(a float\)"),
    (lambda: jaxnorm.nnx.GroupNorm(6, num_groups=2.0, rngs=nnx.Rngs(0))(X), TypeError,
     r"num_groups must be an int"),
    (lambda: jaxnorm.group_norm(X, num_groups=None, group_size=3.0), TypeError,
     r"group_size must be an int"),
    (lambda: jaxnorm.normalize(X, axes=True), TypeError,
     r"axes must be integers.*got True \(an element of type bool\)"),
    (lambda: jaxnorm.LayerNorm(reduction_axes=()).init(jax.random.key(0), X), ValueError,
     r"reduction_axes=\(\) reduces over no axis of a rank-3 input.*bias"),
    (lambda: jaxnorm.rms_norm(X, reduction_axes=()), ValueError, r"reduces over no axis"),
    (lambda: jaxnorm.normalize(X, axes=()), ValueError, r"axes=\(\) reduces over no axis"),
    (lambda: jaxnorm.instance_norm(jnp.ones((4, 6))), ValueError,
     r"rank-2 input.*no axis left to compute statistics over.*use LayerNorm"),
    (lambda: jaxnorm.layer_norm(jnp.float32(1)), ValueError,
     r"names an axis of a 0-d input \(a scalar\).*x\[None\]"),
  ],
)  # fmt: skip
def test_requests_once_accepted_silently(call, error, pattern):
  """Each of these once ran: a float group count, a bool axis (axis 1), no reduced axis
  (the output was β, or sign(x) for RMSNorm), a 0-d input (said 'every axis must lie in
  [0, -1]')."""
  with pytest.raises(error, match=pattern):
    call()


def test_an_unbound_axis_name_says_which_and_how_to_bind_it():
  """JAX's own error is a bare ``NameError: unbound axis name: batch``; jaxnorm's names the
  axis and the transforms that bind it, for every front end and under differentiation."""
  eqx = pytest.importorskip("equinox")
  import jaxnorm.equinox as jeqx

  x = jnp.ones((8, 4, 3, 3))
  bn, state = eqx.nn.make_with_state(jeqx.BatchNorm)(4, "batch", mode="batch")
  linen = jaxnorm.BatchNorm(axis_name="d", use_running_average=False)
  variables = linen.init(jax.random.key(0), X)  # (init runs locally, as Flax's)
  calls = [
    lambda: jax.vmap(bn, in_axes=(0, None), out_axes=(0, None))(x, state),
    lambda: linen.apply(variables, X, mutable=["batch_stats"]),
    lambda: jaxnorm.nnx.LayerNorm(6, axis_name="d", rngs=nnx.Rngs(0))(X),
    lambda: jax.grad(lambda x: jaxnorm.group_norm(x, num_groups=2, axis_name="d").sum())(X),
  ]
  for call in calls:
    with pytest.raises(NameError, match=r"axis_name='(batch|d)' is not bound here.*jax\.vmap"):
      call()
