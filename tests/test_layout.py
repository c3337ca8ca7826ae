"""The repository's layout as ``docs/development.md`` draws it: every module of the package
is in its layout block, and the tests stand alone, never importing ``benchmarks/`` (the
runners there import ``tests/``'s programs, models and counter, not the other way)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).parents[1]


def test_the_layout_names_every_module_of_the_package():
  layout = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
  layout = layout[layout.index("```") : layout.index("```", layout.index("```") + 3)]
  engine = ROOT / "jaxnorm" / "_engine"
  missing = [
    str(p.relative_to(ROOT))
    for p in sorted((ROOT / "jaxnorm").rglob("*.py"))
    if p.name != "__init__.py" or p.parent.name == "jaxnorm"
    if not (
      str(p.relative_to(ROOT)) in layout
      or (p.parent == engine and re.search(rf"(^|[ ,]){re.escape(p.name)}[ ,]", layout, re.M))
    )
  ]
  assert not missing, f"docs/development.md's layout does not name: {missing}"


def test_no_test_imports_the_benchmarks():
  importing = [
    str(p.relative_to(ROOT))
    for p in sorted((ROOT / "tests").rglob("*.py"))
    if re.search(r"^\s*(from benchmarks\b|import benchmarks\b)", p.read_text("utf-8"), re.M)
  ]
  assert not importing, f"these test files import benchmarks/: {importing}"


def test_the_docs_name_runners_and_results_that_exist():
  """Every ``benchmarks/*.py`` runner and ``results/...`` file the README and the guides
  name exists (results moved per device and runners merged: a stale path would send a
  reader to nothing)."""
  texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
  missing = set()
  for path in texts:
    text = path.read_text("utf-8")
    for name in re.findall(r"benchmarks/[\w./-]+?\.(?:py|sh)\b", text):
      if not (ROOT / name).exists():
        missing.add(f"{path.name}: {name}")
    for name in re.findall(r"results/[\w./-]+?\.(?:md|json|jsonl|png)\b", text):
      if not (ROOT / "benchmarks" / name).exists() and not (ROOT / name).exists():
        missing.add(f"{path.name}: {name}")
  assert not missing, sorted(missing)
