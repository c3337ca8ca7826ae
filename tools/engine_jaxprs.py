"""The engine's traced programs, to show a change to it changes no program (or which).

Traces every route of the router (``jaxnorm/_engine/router.py``): 12 norm forms, float32
and bfloat16, forward and gradient, traced for XLA:CPU, GPUs and TPUs (JAX's abstract mesh
of that platform's device, no device needed) and on meshes (8 CPU devices; 4 GPUs' and 4
TPUs' abstract meshes under automatic sharding), plus running
averages, complex data, the Pallas kernels and Equinox, and writes their jaxprs with
function names normalized away. Before and after a change to the engine::

  python tools/engine_jaxprs.py /tmp/before.json      # on the old commit
  python tools/engine_jaxprs.py /tmp/after.json --compare /tmp/before.json

``--compare`` prints each program that differs and exits 1 if any does (moving code
between files changes none; RESULTS-worthy changes change some, to be explained).
"""

import argparse
import json
import os
import re
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import flax.linen  # noqa: E402, F401
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxnorm  # noqa: E402
from jaxnorm import equinox as jeq  # noqa: E402
from tests.devices import tracing_for  # noqa: E402

RNG = np.random.default_rng(0)
X4 = RNG.normal(2, 1, (8, 4, 4, 16)).astype(np.float32)  # (N, H, W, C): BatchNorm's columns
X3 = RNG.normal(2, 1, (8, 16, 1024)).astype(np.float32)  # (B, T, D): LayerNorm's rows
G, B, G3 = np.ones(16, np.float32), np.zeros(16, np.float32), np.ones(1024, np.float32)


def _vmapped_batch_norm(x):
  def one(y):
    return jaxnorm.batch_norm(y, axis_name="i")[0]

  return jax.vmap(one, axis_name="i")(x.reshape(2, 4, 4, 4, 16))


# name -> (norm, input): every row of the router's table, on columns and rows.
FORMS = {
  "batch": (lambda x: jaxnorm.batch_norm(x, scale=G, bias=B)[0], X4),
  "layer": (lambda x: jaxnorm.layer_norm(x, scale=G3, bias=G3), X3),
  "rms": (lambda x: jaxnorm.rms_norm(x, scale=G3), X3),
  "group": (lambda x: jaxnorm.group_norm(x, num_groups=4, scale=G, bias=B), X4),
  "instance": (lambda x: jaxnorm.instance_norm(x, scale=G, bias=B), X4),
  "layerhwc": (lambda x: jaxnorm.layer_norm(x, reduction_axes=(1, 2, 3)), X4),
  "addlayer": (lambda x: jaxnorm.add_layer_norm(x, x * 0.5, scale=G3, bias=G3)[0], X3),
  "masked": (lambda x: jaxnorm.layer_norm(x, mask=x > 1.0), X3),
  "batchmasked": (lambda x: jaxnorm.batch_norm(x, mask=x > 1.0)[0], X4),
  "moments": (lambda x: jaxnorm.moments(x, (0, 1, 2)).var, X4),
  "axisname": (_vmapped_batch_norm, X4),
  "epsout": (lambda x: jaxnorm.rms_norm(x, epsilon_in_root=False), X3),
  "rmsnoscale": (lambda x: jaxnorm.rms_norm(x), X4),
}


def _normalized(text):
  """A jaxpr's text without what names a Python function or object."""
  text = re.sub(r"<function [^>]*>", "<fn>", text)
  text = re.sub(r"0x[0-9a-f]+", "0x", text)
  text = re.sub(r"name=[\w.<>\-]+", "name=_", text)
  return re.sub(r"jvp=\w+", "jvp=_", text)


def _jaxpr(fn, x):
  jax.clear_caches()  # (JAX keeps what was traced for another platform)
  try:
    return _normalized(str(jax.make_jaxpr(fn)(x)))
  except Exception as e:  # (a route that no longer traces is a difference too)
    return f"ERROR {type(e).__name__}: {str(e)[:200]}"


def _loss(norm):
  def loss(x):
    return jnp.sum(jnp.sin(norm(x).astype(jnp.float32)))

  return loss


def _module_programs():
  """Running-average BatchNorm, complex data, the Pallas kernels, Equinox."""
  inference = jaxnorm.linen.BatchNorm(use_running_average=True)
  training = jaxnorm.linen.BatchNorm(use_running_average=False)
  variables = inference.init(jax.random.key(0), X4)
  eqx_norm = jeq.LayerNorm(1024)
  return {
    "bn-infer": (lambda x: inference.apply(variables, x), X4),
    "bn-train-grad": (
      jax.grad(lambda x: jnp.sum(training.apply(variables, x, mutable=["batch_stats"])[0])),
      X4,
    ),
    "complex": (lambda x: jaxnorm.layer_norm(x + 1j * x), X3),
    "pallas": (
      jax.grad(lambda x: jnp.sum(jaxnorm.layer_norm(x, scale=G3, implementation="pallas"))),
      X3,
    ),
    "eqx": (jax.grad(lambda x: jnp.sum(eqx_norm(x[0, 0]))), X3),
  }


def programs():
  """``{route: normalized jaxpr}`` for every route."""
  out = {}
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
  for platform in ("cpu", "gpu", "tpu"):
    for dtype in (jnp.float32, jnp.bfloat16):
      for form, (norm, x) in FORMS.items():
        x = x.astype(dtype)
        for pass_name, fn in (("fwd", norm), ("grad", jax.grad(_loss(norm)))):
          name = f"{form}-{dtype.__name__}/{pass_name}"
          with tracing_for(platform):
            out[f"{platform}/one/{name}"] = _jaxpr(fn, x)
          if platform == "cpu" and form != "axisname":
            out[f"cpu/mesh/{name}"] = _jaxpr(fn, jax.device_put(x, NamedSharding(mesh, P("d"))))
          elif form != "axisname":  # (a 4-device mesh of the platform in the context)
            with tracing_for(platform, devices=4):
              out[f"{platform}/mesh/{name}"] = _jaxpr(fn, x)
    with tracing_for(platform):
      for name, (fn, x) in _module_programs().items():
        out[f"{platform}/{name}"] = _jaxpr(fn, x)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out", help="where to write the jaxprs (JSON)")
  parser.add_argument("--compare", help="a file this script wrote before the change")
  args = parser.parse_args()
  out = programs()
  with open(args.out, "w") as f:
    json.dump(out, f, indent=0, sort_keys=True)
  errors = [k for k, v in out.items() if v.startswith("ERROR")]
  print(f"{len(out)} programs traced, {len(errors)} failed to trace: {errors}")
  if args.compare:
    with open(args.compare) as f:
      before = json.load(f)
    changed = sorted(k for k in before.keys() | out.keys() if before.get(k) != out.get(k))
    print(f"{len(changed)} of {len(before)} differ from {args.compare}: {changed}")
    sys.exit(1 if changed or errors else 0)
  sys.exit(1 if errors else 0)


if __name__ == "__main__":
  main()
