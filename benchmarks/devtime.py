"""Device time: what a compiled function costs on the device, not what a call costs the host.

Three ways to time one jitted ``fn(*args)``, reported side by side by ``gpu_suite.py``:

- ``cupti`` (NVIDIA GPUs): CUPTI's kernel timings through
  ``jax.experimental.mosaic.gpu.profiler.measure`` — the sum of the kernels one call
  launches, per call, medians over calls; no host time in it.
- ``loop`` (every platform, the CPU included): one jitted program that runs the function
  ``n`` times in a ``lax.fori_loop``, each iteration's input the whole of the previous
  iteration's output (``x ← y``: no added operation, no added traffic), timed by wall
  clock at two loop lengths: ``(T(n₂) − T(n₁))/(n₂ − n₁)`` per iteration, the dispatch and
  synchronisation of the call cancelled out.
- ``wall``: one call, end to end (``block_until_ready`` around it): dispatch included, the
  figure earlier H100 tables quoted; its own column, labelled as such.

Each iteration depending on the previous one's output, the compiler can neither drop nor
hoist one: the program returns ``n`` chained applications
(``benchmarks/tests/test_devtime.py`` checks that).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# L2 (or last-level on-chip) cache per device kind, bytes: working sets of at least twice
# this are "cold" (bandwidth claims); smaller ones are reported "L2-warm".
L2_BYTES = {"H100": 50 << 20, "H200": 50 << 20, "A100": 40 << 20, "L4": 48 << 20, "B200": 126 << 20}


def l2_bytes(device: Any) -> int | None:
  """The L2 cache of ``device``'s kind, when known (None on CPUs and unknown kinds)."""
  if device.platform == "cpu":
    return None
  kind = device.device_kind
  return next((b for name, b in L2_BYTES.items() if name in kind), None)


def cache_label(working_set: int, device: Any) -> str:
  """ "cold" when the working set is at least twice the device's L2, else "L2-warm"
  ("n/a" on CPUs, whose caches this does not model)."""
  l2 = l2_bytes(device)
  if l2 is None:
    return "n/a" if device.platform == "cpu" else "unknown L2"
  return "cold" if working_set >= 2 * l2 else "L2-warm"


def _next_input(x: Any, outputs: Any) -> tuple[Any, list]:
  """The next iteration's input and the outputs it did not take: each leaf of ``x``
  replaced by the first unused output leaf of its shape and dtype (a norm's output is a
  well-scaled input to the next norm, and taking it adds no operation, hence no traffic),
  or, where none matches, ``x`` plus the sum of every output (a reduction, but no output
  can then be dead code)."""
  leaves = jax.tree.leaves(outputs)
  pool = list(leaves)

  @functools.cache
  def total():  # (once, however many inputs take it)
    return sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in leaves)

  def one(a):
    for k, leaf in enumerate(pool):
      if leaf.shape == a.shape and leaf.dtype == a.dtype:
        return pool.pop(k)
    return (a.astype(jnp.float32) + total()).astype(a.dtype)

  return jax.tree.map(one, x), pool


def loop_program(fn: Callable[..., Any], carry: int = 1) -> Callable[..., Any]:
  """A jitted ``program(args, n)`` that applies ``fn(*args)`` ``n`` times (``n`` a
  runtime count: one compiled program for every length), the argument at position ``carry``
  replaced by each call's output (:func:`_next_input`), the outputs it does not take kept
  in the loop's state (each output lives in one buffer: no copy); returns the last input
  and those outputs of the last call. Each iteration depends on the whole of the previous
  one's output, so none can be skipped or hoisted out of the loop."""

  def program(args, n):
    def call(x):
      full = list(args)
      full[carry] = x
      return fn(*full)

    def body(_, state):
      return _next_input(state[0], call(state[0]))

    first = _next_input(args[carry], call(args[carry]))  # (call 1; the state's shapes)
    return jax.lax.fori_loop(1, n, body, first)

  return jax.jit(program)


def state_copies(compiled: Any) -> int:
  """Full-size copies in a compiled loop program (scalars aside): a kernel that cannot
  write in place over its input (XLA:CPU's YNNPACK fusions) has its output copied into
  the loop's state each iteration, traffic no single call pays; the method column says
  so."""
  return len(re.findall(r"= \w+\[\d[\d,]*\]\S* copy\(", compiled.as_text()))


def _median_wall(call: Callable[[], Any], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def per_iteration(t_short: float, t_long: float, n_short: int, n_long: int) -> float:
  """Seconds per iteration from two loop lengths: the slope, fixed costs cancelled."""
  return (t_long - t_short) / (n_long - n_short)


def loop_time(
  fn: Callable[..., Any],
  args: tuple,
  *,
  carry: int = 1,
  n: int = 20,
  repeats: int = 5,
  min_seconds: float = 0.02,
) -> tuple[float, int]:
  """Seconds per call of ``fn(*args)`` inside one program (``loop`` above), and the
  program's :func:`state_copies`: at least ``n`` iterations, more (up to 4096) until the
  longer loop runs ``min_seconds``, so that the slope stands above the noise of a call's
  dispatch."""
  count = jnp.asarray(1, jnp.int32)
  program = loop_program(fn, carry).lower(args, count).compile()  # (n: a runtime value)

  def run(k):
    return program(args, jnp.asarray(k, jnp.int32))

  long = n
  while _median_wall(lambda k=long: run(k), 1) < min_seconds and long < 4096:
    long *= 4
  short = max(1, long // 4)
  t_short = _median_wall(lambda: run(short), repeats)
  t_long = _median_wall(lambda: run(long), repeats)
  return max(per_iteration(t_short, t_long, short, long), 0.0), state_copies(program)


def wall_time(fn: Callable[..., Any], args: tuple, *, repeats: int = 10) -> float:
  """Seconds of one call, end to end (dispatch and synchronisation included)."""
  jax.block_until_ready(fn(*args))
  return _median_wall(lambda: fn(*args), repeats)


def faults_per_call(fn: Callable[..., Any], args: tuple, *, calls: int = 5) -> float:
  """Minor page faults per call of ``fn(*args)`` in this process: on a CPU, glibc hands
  large freed buffers back to the OS, so each call first-touches its fresh outputs (one
  fault per 4 KiB page), a cost the wall clock includes and the loop does not
  (``MALLOC_MMAP_THRESHOLD_=4294967296`` keeps them: then the two agree)."""
  import resource

  jax.block_until_ready(fn(*args))
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(calls):
    jax.block_until_ready(fn(*args))
  return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def cupti_available() -> bool:
  """Whether CUPTI timing can run here (an NVIDIA GPU and Mosaic GPU's profiler)."""
  if jax.devices()[0].platform != "gpu":
    return False
  try:
    from jax.experimental.mosaic.gpu import profiler  # noqa: F401
  except ImportError:
    return False
  return True


def cupti_time(fn: Callable[..., Any], args: tuple, *, iterations: int = 20) -> float:
  """Seconds of device time per call of ``fn(*args)``: CUPTI's sum of the kernels of each
  call, median over ``iterations`` calls."""
  from jax.experimental.mosaic.gpu import profiler

  jax.block_until_ready(fn(*args))
  _, timings = profiler.measure(fn, iterations=iterations)(*args)
  timings = [t for t in np.atleast_1d(timings) if t is not None]
  return float(np.median(timings)) * 1e-3  # (milliseconds)


def device_time(
  fn: Callable[..., Any],
  args: tuple,
  *,
  carry: int = 1,
  n: int = 20,
  min_seconds: float = 0.02,
  repeats: int = 5,
) -> tuple[float, str]:
  """``(seconds, method)``: CUPTI where it runs, else (or where CUPTI fails: the method
  then says why) the in-jit loop."""
  why = ""
  if cupti_available():
    try:
      return cupti_time(fn, args, iterations=n), "cupti"
    except Exception as e:  # (a GPU run is rare: fall back, say so, keep going)
      why = f" (cupti failed: {type(e).__name__})"
  seconds, copies = loop_time(fn, args, carry=carry, n=n, min_seconds=min_seconds, repeats=repeats)
  return seconds, "loop" + (f" (+{copies} copy)" if copies else "") + why
