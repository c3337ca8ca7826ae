#!/usr/bin/env bash
# The device run in one call of the device tool, within its 10 minutes (RESULTS items 71, 72):
# the suite (Pallas check, cases, layout tuner, whole steps), each engine variant
# (variants.py) on its cases, and tests/test_pallas.py on the device (one process: several
# each preallocate 75 % of the GPU). Everything lands in one archive, since the tool brings
# back at most 8 files. Its timeouts add up to 560 s (suite 320, 45 per variant, tests 60):
# a run the tool kills at 600 s never writes its archive.
#
#   bash benchmarks/device_run.sh "$OUT"      # then: tar xzf device_run.tgz -C results/<device>/
#
# SMOKE=1 runs the same plumbing on tiny shapes on a CPU in seconds, without the tests
# (benchmarks/tests/test_gpu_suite.py), so that the script does not rot between device runs.
set -uo pipefail
out=${1:?usage: device_run.sh OUT_FOLDER}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'tar czf "$out/device_run.tgz" -C "$work" . && cp "$work"/gpu_suite.md "$out"/ 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if [[ ${SMOKE:-0} == 1 ]]; then
  suite=(--smoke --tune 0) variant=(--smoke) each=70  # (a loaded CI machine's CPU)
else
  suite=(--budget 200 --tune 60) variant=() each=45
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$work/device.txt"
fi
timeout 320 "$python" benchmarks/gpu_suite.py --out "$work" "${suite[@]}" 2>&1 |
  tee "$work/gpu_suite.log"
for name in $(cd benchmarks && "$python" -c 'import variants; print(*variants.VARIANTS)'); do
  timeout "$each" "$python" benchmarks/gpu_suite.py --variant "$name" --out "$work" "${variant[@]}" 2>&1 |
    tee -a "$work/variants.log"
done
if [[ ${SMOKE:-0} != 1 ]]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 "$python" -m pytest -p no:cacheprovider -q -n 0 \
    tests/test_pallas.py 2>&1 | tail -5 | tee "$work/test_pallas.log"
fi
