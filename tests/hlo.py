"""What a compiled program launches and moves, read from its HLO text: one definition of a
kernel, of the bytes a kernel moves and of the collectives, for every test and benchmark
that counts programs (the compiled-program tests' bounds are counted with it; the runners in
``benchmarks/`` import it from here, as they import the float64 reference).

Two kernel counts, by what each backend's compiled text holds: on XLA:GPU a kernel is a
fusion, custom call, copy or unfused reduction at any level but inside a fusion, and the
bytes are a model (XLA's ``cost_analysis`` returns nothing without a device):
:func:`kernels_and_bytes`. On TPUs and XLA:CPU, whose ``cost_analysis`` gives the bytes,
the top-level operations of the entry computation other than bookkeeping: :func:`kernels`.
"""

from __future__ import annotations

import math
import re

# Every collective an SPMD partitioner emits (each also as its asynchronous ``-start``).
COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")
BOOKKEEPING = {
  "parameter", "tuple", "get-tuple-element", "bitcast", "constant", "after-all",
  "partition-id", "replica-id", "copy-start", "copy-done",
}  # fmt: skip
SIZES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def count(hlo: str, ops=COLLECTIVES) -> dict[str, int]:
  """How many of each operation in ``ops`` (collectives by default; ``"conditional"``)."""
  return {op: len(re.findall(rf" {op}(?:-start)?\(", hlo)) for op in ops}


def kernels(hlo: str) -> int:
  """Top-level operations of the entry computation other than bookkeeping (TPUs, XLA:CPU)."""
  entry = hlo[hlo.index("\nENTRY") :]
  entry = entry[: entry.index("\n}")]
  ops = re.findall(r"^\s*(?:ROOT )?%\S+ = (?:\([^=]*?\)|\S+) ([a-z\-]+)\(", entry, re.M)
  return sum(op not in BOOKKEEPING for op in ops)


KERNEL = re.compile(r"^\s*(?:ROOT )?%\S+ = (.+?) (fusion|custom-call|copy|reduce|sort|scatter)\(")


def _bytes(shape_text: str) -> int:
  total = 0
  for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape_text):
    total += SIZES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
  return total


def _computations(hlo: str) -> dict[str, list[str]]:
  """Each named computation's instruction lines."""
  bodies: dict[str, list[str]] = {}
  name = None
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?(%\S+) .*\{$", line)
    if head:
      name = head.group(1)
      bodies[name] = []
    elif line.startswith("}"):
      name = None
    elif name and " = " in line:
      bodies[name].append(line)
  return bodies


def _parameter_reads(body: list[str]) -> dict[int, int | None]:
  """For each parameter of a fused computation, the bytes it reads when it is only
  sliced (through bitcasts, conversions): the slices' outputs (a shift reads one element of each
  group, not its operand); None when it is read whole."""
  ops = {}
  for line in body:
    m = re.match(r"^\s*(?:ROOT )?(%\S+) = (\([^=]*?\)|\S+) ([a-z\-]+)\((.*?)\)", line)
    if m:
      ops[m.group(1)] = (m.group(2), m.group(3), re.findall(r"%[\w.\-]+", m.group(4)), line)
  users: dict[str, list[str]] = {n: [] for n in ops}
  for n, (_, _, args, _) in ops.items():
    for a in args:
      users.setdefault(a, []).append(n)

  def sliced(n):  # bytes read through slices alone, or None
    total = 0
    for u in users.get(n, []):
      shape, op, _, _ = ops[u]
      if op == "slice":
        total += _bytes(shape)
      elif op in ("bitcast", "convert", "negate", "reshape"):  # (elementwise on the way)
        inner = sliced(u)
        if inner is None:
          return None
        total += inner
      else:
        return None
    return total

  reads = {}
  for n, (_, op, _, line) in ops.items():
    if op == "parameter":
      index = int(re.search(r"parameter\((\d+)\)", line).group(1))
      reads[index] = sliced(n)
  return reads


def kernels_and_bytes(hlo: str) -> tuple[int, int]:
  """Top-level kernels of the entry computation and of the computations it calls, loops
  or branches into (not of fusions' bodies: a fusion is one kernel), and their operands'
  and results' bytes (an operand a fusion only slices counts its slices)."""
  shapes: dict[str, str] = {}
  for line in hlo.splitlines():
    m = re.match(r"^\s*(?:ROOT )?(%\S+) = (\([^=]*?\)|\S+) ", line)
    if m:
      shapes[m.group(1)] = m.group(2)
  bodies = _computations(hlo)
  fused = set(re.findall(r" fusion\(.*?calls=(%[\w.\-]+)", hlo))
  count, moved = 0, 0
  for name, lines in bodies.items():
    if name in fused:
      continue
    for line in lines:
      m = KERNEL.match(line)
      if not m:
        continue
      count += 1
      operands = re.search(r"\((.*?)\)(?:,|$)", line[line.index(m.group(2)) :])
      names = re.findall(r"%[\w.\-]+", operands.group(1)) if operands else []
      called = re.search(r"calls=(%[\w.\-]+)", line)
      reads = _parameter_reads(bodies.get(called.group(1), [])) if called else {}
      moved += _bytes(m.group(1))
      for i, n in enumerate(names):
        part = reads.get(i)
        moved += _bytes(shapes.get(n, "")) if part is None else part
  return count, moved


def measure(compiled, nbytes: int, platform: str) -> tuple[int, float]:
  """Kernels and bytes over ``nbytes`` of a compiled program: the bytes model on GPUs
  (:func:`kernels_and_bytes`), XLA's ``cost_analysis`` with :func:`kernels` elsewhere."""
  text = compiled.as_text()
  if platform == "gpu":
    count, moved = kernels_and_bytes(text)
    return count, moved / nbytes
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return kernels(text), cost["bytes accessed"] / nbytes
