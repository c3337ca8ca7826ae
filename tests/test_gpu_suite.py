"""``benchmarks/gpu_suite.py --smoke``: the device-timed suite runs end to end on the CPU
(tiny shapes), so that it works the day a GPU is lent. Nothing about speed is asserted."""

import json

from benchmarks import gpu_suite


def test_smoke_run_writes_every_case(tmp_path):
  meta, rows = gpu_suite.main(["--smoke", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "gpu_suite.json").read_text())
  assert saved["meta"]["smoke"] and saved["rows"] == json.loads(json.dumps(rows))
  assert (tmp_path / "gpu_suite.md").read_text().startswith("# Device-timed suite: cpu")
  impls = {(r["norm"], r["pass_"], r["impl"]) for r in rows}
  for _, kind, _, _ in gpu_suite.SMOKE:
    for pass_ in gpu_suite.PASSES:
      assert {(kind, pass_, "jaxnorm"), (kind, pass_, "flax"), (kind, pass_, "jnp")} <= impls
  assert ("add_rms", "fwd+bwd", "jaxnorm-pallas") in impls  # (the row kernels, interpreted)
  for r in rows:
    assert r["method"].startswith("loop") and r["device_us"] >= 0 and r["wall_us"] > 0, r
    assert r["cache"] == "n/a"


def test_device_names():
  class H100:
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

  assert gpu_suite.device_name(H100) == "nvidia-h100-80gb-hbm3"
