"""Runs Flax's own tests of SpectralNorm and WeightNorm with jaxnorm's classes patched in.

Flax's test files are not installed with flax; they ship in its source distribution. This
downloads the sdist of the installed flax version from PyPI (pip download), extracts
``tests/linen/linen_test.py`` and ``tests/nnx/nn/normalization_test.py``, and runs their
SpectralNorm/WeightNorm tests with ``flax.linen.SpectralNorm``/``WeightNorm`` and
``flax.nnx.SpectralNorm``/``WeightNorm`` replaced by jaxnorm's. Every test must pass except
the ones listed in ``EXPECTED_FAILURES``, each a documented, deliberate fix; an expected
failure that passes is an error too (the list must stay true).

Usage: ``python tools/flax_tests.py [--sdist PATH]`` (exit 0 when the outcome is as
expected). CI runs it (``.ci/run``); it needs the network (PyPI) unless ``--sdist`` is given.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tarfile
import tempfile

import flax

FILES = ("tests/linen/linen_test.py", "tests/nnx/nn/normalization_test.py")
SELECT = "spectral or weight_norm or weightnorm"
# test id substring -> why jaxnorm differs (README's differences table says the same).
EXPECTED_FAILURES: dict[str, str] = {}

CONFTEST = """
import flax.linen, flax.nnx, jaxnorm, jaxnorm.nnx

for _name in ("SpectralNorm", "WeightNorm"):
  setattr(flax.linen, _name, getattr(jaxnorm, _name))
  setattr(flax.nnx, _name, getattr(jaxnorm.nnx, _name))
"""


def _sdist(workdir: pathlib.Path) -> pathlib.Path:
  subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--quiet",
      "--no-deps",
      "--no-binary",
      ":all:",
      f"flax=={flax.__version__}",
      "-d",
      str(workdir),
    ],
    check=True,
  )
  return next(workdir.glob("flax-*.tar.gz"))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sdist", type=pathlib.Path, help="flax's .tar.gz (default: download)")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp)
    sdist = args.sdist or _sdist(work)
    tests = work / "flax_tests"
    tests.mkdir()
    with tarfile.open(sdist) as tar:
      for member in tar.getmembers():
        rel = member.name.split("/", 1)[-1]
        if rel in FILES:
          (tests / pathlib.Path(rel).name).write_bytes(tar.extractfile(member).read())
    found = sorted(p.name for p in tests.glob("*.py"))
    if len(found) != len(FILES):
      print(f"flax_tests: {sdist.name} lacks some of {FILES} (found {found})", file=sys.stderr)
      return 1
    (tests / "conftest.py").write_text(CONFTEST)
    report = work / "report.txt"
    proc = subprocess.run(
      [
        sys.executable,
        "-m",
        "pytest",
        str(tests),
        "-k",
        SELECT,
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-rfEX",
        "--rootdir",
        str(tests),
        "--junitxml",
        str(report),
      ],
      capture_output=True,
      text=True,
    )
    print(proc.stdout[-6000:], proc.stderr[-2000:])
    failed = {
      line.split(" ")[1]
      for line in proc.stdout.splitlines()
      if line.startswith(("FAILED ", "ERROR "))
    }
    passed_line = [line for line in proc.stdout.splitlines() if " passed" in line]
    if not passed_line:
      print("flax_tests: no test passed; the selection ran nothing", file=sys.stderr)
      return 1
    unexpected = {t for t in failed if not any(k in t for k in EXPECTED_FAILURES)}
    missing = {k for k in EXPECTED_FAILURES if not any(k in t for t in failed)}
    for t in sorted(failed - unexpected):
      reason = next(v for k, v in EXPECTED_FAILURES.items() if k in t)
      print(f"expected failure: {t}: {reason}")
    if unexpected or missing:
      print(
        f"flax_tests: unexpected failures {sorted(unexpected)}; expected failures that "
        f"passed {sorted(missing)}",
        file=sys.stderr,
      )
      return 1
    print(f"flax_tests: as expected with flax {flax.__version__}: {passed_line[-1].strip()}")
    return 0


if __name__ == "__main__":
  sys.exit(main())
