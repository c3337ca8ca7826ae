"""``benchmarks/gpu_suite.py --smoke``: the device-timed suite runs end to end on the CPU
(tiny shapes), so that it works the day a GPU is lent. Nothing about speed is asserted."""

import json
import pathlib

import numpy as np

from benchmarks import gpu_suite


def test_smoke_run_writes_every_case(tmp_path):
  meta, rows = gpu_suite.main(["--smoke", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "gpu_suite.json").read_text())
  assert saved["meta"]["smoke"] and saved["rows"] == json.loads(json.dumps(rows))
  assert saved["meta"]["pallas_check_ok"] and (tmp_path / "pallas_device_check.json").exists()
  assert (tmp_path / "gpu_suite.md").read_text().startswith("# Device-timed suite: cpu")
  # (the whole programs: on a CPU the smallest, the Transformer stack's inference)
  assert [s["step"] for s in saved["steps"]] == ["Pre-LN Transformer inference, float32"]
  assert saved["steps"][0]["jaxnorm_us"] > 0 and saved["steps"][0]["flax_us"] > 0
  impls = {(r["norm"], r["pass_"], r["impl"]) for r in rows}
  for _, kind, _, _ in gpu_suite.SMOKE:
    for pass_ in gpu_suite.PASSES:
      assert {(kind, pass_, "jaxnorm"), (kind, pass_, "flax"), (kind, pass_, "jnp")} <= impls
  assert ("add_rms", "fwd+bwd", "jaxnorm-pallas") in impls  # (the row kernels, interpreted)
  tune = json.loads((tmp_path / "pallas_tune.json").read_text())  # (pallas_tune.py, after)
  assert tune["meta"]["smoke"] and [len(c["layouts"]) for c in tune["cells"]] == [2]
  assert all(c["error"] < 1e-5 for c in tune["cells"][0]["layouts"])
  assert (tmp_path / "pallas_tune.md").read_text().startswith("# Pallas GPU layouts: cpu")
  for r in rows:
    assert r["method"].startswith("loop") and r["device_us"] >= 0 and r["wall_us"] > 0, r
    assert r["cache"] == "n/a"


def test_the_floor_kernels_move_the_traffic_they_are_credited_with():
  """The forward+backward floor was one jit of both kernels, which XLA fuses into one that
  reads x once (3|x|) while it was credited with 5|x|; Add & Norm's was credited with 2|x|
  and 5|x| without the residual. Each floor kernel's compiled bytes are now its credit,
  but Add & Norm's on XLA:CPU, which writes h (the backward: the residual's cotangent) and
  reads it back for the second output (no multi-output fusion on the CPU): the suite
  records the ratio on the device it runs on."""
  import jax.numpy as jnp

  from benchmarks import bench_norms
  from tests.programs import inputs

  for kind, dtype in (("rms", jnp.bfloat16), ("add_rms", jnp.bfloat16), ("layer", jnp.float32)):
    x, cot = inputs(kind, (4, 32, 256), dtype)
    kernels = bench_norms.floor_kernels(x, cot)
    x0 = (x[0] if isinstance(x, tuple) else x).nbytes
    credit = {p: sum(b for _, _, b in k) / x0 for p, k in kernels.items()}
    if kind == "add_rms":  # x and y bfloat16, the residual, h and dh float32 (2|x| each)
      assert credit == {"forward": 1 + 2 + 1 + 2, "fwd+bwd": 6 + (2 + 1 + 2) + (1 + 2)}
    else:
      assert credit == {"forward": 2, "fwd+bwd": 5}
    traffic = {p: bench_norms.floor_traffic(k) for p, k in kernels.items()}
    if kind == "add_rms":  # (on the CPU, a float32 read-back per kernel: 2|x| each)
      assert abs(traffic["forward"] * 6 - 8) < 0.05, traffic
      assert abs(traffic["fwd+bwd"] * 14 - 18) < 0.05, traffic
    else:
      assert abs(traffic["forward"] - 1) < 0.01 and abs(traffic["fwd+bwd"] - 1) < 0.01, traffic


def test_device_names():
  from benchmarks import bench_norms

  class H100:
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

  assert bench_norms.device_name(H100) == "nvidia-h100-80gb-hbm3"


def test_a_wrong_peer_is_left_out_and_named(monkeypatch):
  """A device run is too scarce to lose to one wrong implementation: it is named and left
  out; jaxnorm's own XLA path being wrong still stops the run."""
  import jax.numpy as jnp
  import pytest

  from benchmarks import bench_norms

  monkeypatch.setattr(bench_norms, "EXCLUDED", [])  # (no leftover in another test's run)
  x = jnp.arange(4.0)
  impls = {
    "flax": (lambda x: x, None, (x,), None),
    "jaxnorm": (lambda x: x, None, (x,), None),
    "jaxnorm-pallas": (lambda x: x + 1, None, (x,), None),
  }
  assert bench_norms._check_peers("layer", impls, jnp.float32) == ["jaxnorm-pallas"]
  assert "jaxnorm-pallas layer: max |y − flax's y| = 1" in bench_norms.EXCLUDED[-1]
  impls["jaxnorm"] = impls.pop("jaxnorm-pallas")
  with pytest.raises(AssertionError, match="jaxnorm layer"):
    bench_norms._check_peers("layer", impls, jnp.float32)


def test_pallas_device_check_smoke(tmp_path):
  """``benchmarks/pallas_device_check.py --smoke``: the kernels' check against float64 runs
  on the CPU (interpreted), so that it works the day a device is lent."""
  from benchmarks import pallas_device_check

  assert pallas_device_check.main(["--smoke", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "pallas_device_check.json").read_text())
  assert len(saved["rows"]) == len(pallas_device_check.SMOKE)
  assert all(r["pallas_vs_float64"] < 1e-5 for r in saved["rows"])


def test_the_tune_commits_only_layouts_that_beat_the_rule_and_agree_with_xla():
  """A layout enters ``GPU_TABLE`` where it took under 97 % of the rule's time with outputs
  that agree with XLA's; a faster layout with wrong outputs, or a win within noise, does
  not. The candidates start with the rule's layout and never repeat it."""
  from benchmarks import pallas_tune

  rule = (1, 8, 132)

  def cell(d, dtype, *timed):
    layouts = [dict(layout=list(lay), us=us, error=err) for lay, us, err in timed]
    return dict(d=d, dtype=dtype, layouts=layouts)

  cells = [
    cell(4096, "bfloat16", (rule, 100.0, 1e-3), ((2, 8, 132), 90.0, 1e-3), ((1, 4, 66), 80.0, 0.5)),
    cell(8192, "bfloat16", ((1, 8, 132), 100.0, 1e-3), ((1, 16, 132), 98.0, 1e-3)),
    cell(768, "float32", ((5, 8, 132), 100.0, 0.0), ((5, 4, 264), 50.0, 1e-6)),
  ]
  table = pallas_tune.decide(cells, {"bfloat16": 2e-2, "float32": 1e-4})
  assert table == {(4096, 2): (2, 8, 132), (1024, 4): (5, 4, 264)}
  for d, count in ((768, 18), (4096, 18), (16384, 9)):  # (16,384: one row a block at most)
    got = pallas_tune.candidates(d)
    assert got[0] == jaxnorm_rule(d) and len(set(got)) == len(got) == count


def jaxnorm_rule(d):
  from jaxnorm._engine import pallas as _pallas

  return _pallas.gpu_rule(_pallas._next_power_of_2(d))


def test_a_subset_of_bench_norms_never_overwrites_the_full_tables():
  """``bench_norms.py --only <subset>`` wrote its subset over the committed full results,
  and a filter matching nothing wrote empty tables, then crashed: a subset now goes to
  ``results/<device>/partial`` unless ``--out`` says otherwise, and an empty filter stops
  at once, naming the cases."""
  import jax
  import pytest

  from benchmarks import bench_norms

  cpu, results = jax.devices("cpu")[0], pathlib.Path(bench_norms.__file__).parent / "results"
  assert bench_norms.output_dir(None, partial=False, device=cpu) == str(results / "cpu")
  assert bench_norms.output_dir(None, True, cpu) == str(results / "cpu" / "partial")
  assert bench_norms.output_dir("elsewhere", partial=True) == "elsewhere"
  assert bench_norms.selected(["group"]) and all(
    k == "group" for k, _ in bench_norms.selected(["group"])
  )
  with pytest.raises(SystemExit, match="matches no case; the cases are: .*layer/tfm768"):
    bench_norms.main(["--quick", "--only", "no-such-norm"])


def test_a_subset_of_the_device_suite_goes_to_partial(tmp_path, monkeypatch):
  """``gpu_suite.py --cases <regex>`` (or ``--smoke``) without ``--out`` wrote over the
  device's full results; it now writes into their ``partial`` folder."""
  # (gpu_suite's own bench_norms: it imports the runners as scripts do)
  monkeypatch.setattr(gpu_suite.bench_norms, "results_dir", lambda device: str(tmp_path))
  gpu_suite.main(["--smoke", "--tune", "0", "--cases", "rms"])
  assert (tmp_path / "partial" / "gpu_suite.json").exists()
  assert not (tmp_path / "gpu_suite.json").exists()


def test_each_variant_changes_the_gpu_program_of_the_cases_it_names(monkeypatch):
  """``gpu_suite.py --variant`` times an engine alternative in the device run's process:
  each one changes the program traced for GPUs of a norm its cases regex names (a variant
  that patched nothing would time the shipped engine twice) and names at least one of the
  suite's cases."""
  import re

  import jax

  import jaxnorm
  from benchmarks import variants
  from tests.devices import tracing_for

  forms = {  # (a batch on the side of gpu.PER_SAMPLE_BATCH each variant moves)
    "global-shifts": (lambda x: jaxnorm.batch_norm(x)[0], (4, 8, 8, 8)),
    "rows-merged": (jaxnorm.layer_norm, (2, 768)),
    "fused-rows-16384": (jaxnorm.layer_norm, (2, 12288)),
    "columns-whole": (lambda x: jaxnorm.group_norm(x, num_groups=4), (2, 32, 32, 8)),
  }

  def jaxpr(name):
    fn, shape = forms[name]
    jax.clear_caches()  # (the engine's inner jit keeps what it traced)
    with tracing_for("gpu"):
      return str(jax.make_jaxpr(fn)(np.ones(shape, np.float32)))

  for name, variant in variants.VARIANTS.items():
    named = [c for c in gpu_suite.SUITE if re.search(variant.cases, _case_text(c))]
    assert named and {c[1] for c in named} <= {"batch_train", "layer", "group"}, name
    shipped = jaxpr(name)
    with monkeypatch.context() as patch:
      variant.apply(patch.setattr)
      assert jaxpr(name) != shipped, name
    assert jaxpr(name) == shipped  # (undone)


def _case_text(case):
  label, kind, shape, dtype = case
  return f"{label} {kind} {np.dtype(dtype).name} {'x'.join(map(str, shape))}"


def test_a_variant_run_writes_its_own_files(tmp_path, monkeypatch):
  """A variant's rows go beside the shipped run's, in files named after it, labelled."""
  from jaxnorm._engine import gpu

  # (the run patches its whole process, as a device run should: restored after this test)
  monkeypatch.setattr(gpu, "PER_SAMPLE_BATCH", gpu.PER_SAMPLE_BATCH)
  gpu_suite.main(["--smoke", "--variant", "global-shifts", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "gpu_suite_global-shifts.json").read_text())
  assert saved["meta"]["variant"].startswith("global-shifts: ")
  assert not (tmp_path / "gpu_suite.json").exists()
  assert "Variant global-shifts" in (tmp_path / "gpu_suite_global-shifts.md").read_text()


def test_a_variant_times_the_whole_programs_it_names(tmp_path, monkeypatch):
  """``rows-merged`` concerns the LayerNorm models' inference: its run times those whole
  programs with the variant applied (the shipped run's steps are the others' reference)."""
  from jaxnorm._engine import gpu

  monkeypatch.setattr(gpu, "FUSED_ROW", gpu.FUSED_ROW)  # (restored after this test)
  gpu_suite.main(["--smoke", "--variant", "rows-merged", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "gpu_suite_rows-merged.json").read_text())
  assert [s["step"] for s in saved["steps"]] == ["Pre-LN Transformer inference, float32"]
  assert "Pre-LN Transformer inference" in (tmp_path / "gpu_suite_rows-merged.md").read_text()


def test_the_device_run_script_brings_back_one_archive(tmp_path):
  """``benchmarks/device_run.sh`` (a device run in one call, whose tool brings back at most
  8 files) on tiny shapes on the CPU (``SMOKE=1``): one archive holding the suite's
  results and each variant's."""
  import os
  import subprocess
  import sys
  import tarfile

  from benchmarks import variants

  root = pathlib.Path(__file__).resolve().parents[2]
  env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable}
  subprocess.run(["bash", "benchmarks/device_run.sh", str(tmp_path)], cwd=root, env=env,
                 check=True, capture_output=True, timeout=300)  # fmt: skip
  with tarfile.open(tmp_path / "device_run.tgz") as archive:
    names = {pathlib.Path(n).name for n in archive.getnames()}
  assert {"gpu_suite.json", "gpu_suite.md", "gpu_suite.log", "pallas_device_check.json"} <= names
  assert {f"gpu_suite_{v}.json" for v in variants.VARIANTS} <= names
  assert (tmp_path / "gpu_suite.md").exists()
