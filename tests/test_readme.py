"""Every Python block of the README runs as written, each on its own (a fresh namespace)."""

import pathlib
import re

import pytest

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_python_blocks():
  assert len(BLOCKS) >= 1


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index):
  exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {})
