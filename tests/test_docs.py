"""What the documentation site must hold beyond its executed cells (the docs build runs
every guide's cells with warnings as errors, ``.ci/run``): the recipes users looked for,
no norm applied outside a model with fixed parameters, and code that stays readable."""

import pathlib
import re

DOCS = pathlib.Path(__file__).parents[1] / "docs"


def _cells(page):
  return re.findall(r"```\{code-cell\} ipython3\n(.*?)```", (DOCS / page).read_text(), re.S)


def test_the_transformer_guide_has_each_block_in_linen_and_nnx():
  """QK-norm attention (an RMSNorm per head on q and k), a Llama pre-norm block with the
  residual adds fused into the norms and a float32 stream, and a DiT block with
  AdaLN-Zero, each in Linen and NNX; listed in the site's guides."""
  code = "\n".join(_cells("guides/transformer.md"))
  linen, nnx = code.split("from jaxnorm import nnx as jnnx")
  both = ("residual=stream", "residual_dtype=jnp.float32", "gated_residual")
  for needle in ('jaxnorm.RMSNorm(dtype=self.dtype, name="q_norm")', "jaxnorm.AdaLayerNorm()"):
    assert needle in linen, needle
  for needle in ("jnnx.RMSNorm(head_dim", "jnnx.AdaLayerNorm(dim, condition_dim"):
    assert needle in nnx, needle
  assert all(n in linen and n in nnx for n in both)
  assert "guides/transformer" in (DOCS / "index.md").read_text()
  # deep stacks: scanned layers and remat, in both (each checked against a Python loop)
  for needle in ("nn.scan(", "nn.remat(", "nnx.scan(", "nnx.remat", "nnx.vmap("):
    assert needle in code, needle


def test_no_guide_normalizes_with_parameters_fixed_outside_the_model():
  """The Add & Norm guide once normalized the model's input with a ones scale passed to
  apply by hand: copied, that norm never trains."""
  fixed = re.compile(r"\.apply\(\{\"params\": \{\"scale\": jnp\.ones")
  for page in sorted(DOCS.rglob("*.md")):
    assert not fixed.search(page.read_text()), page


def test_code_scrolls_and_outputs_wrap_in_the_rendered_pages():
  """Long code lines were cut at the content column's right edge, then wrapped to column 0
  (read as dedented Python): code now scrolls sideways with its lines whole, and outputs
  wrap."""
  css = (DOCS / "_static" / "custom.css").read_text()
  code = re.search(r"\.bd-article pre\s*\{([^}]*)\}", css)
  assert code and "white-space: pre;" in code.group(1) and "overflow-x: auto" in code.group(1)
  outputs = re.search(r"\.bd-article \.cell_output pre\s*\{([^}]*)\}", css)
  assert outputs and "white-space: pre-wrap" in outputs.group(1)


def test_the_front_end_guides_scan_batch_norm_layers():
  """BatchNorm under ``nn.scan`` (its ``batch_stats`` stacked per layer) and under
  ``nnx.scan`` over ``nnx.vmap``-made layers: the recipe CNN users look for, executed by
  the docs build."""
  linen = "\n".join(_cells("guides/linen.md"))
  nnx = "\n".join(_cells("guides/nnx.md"))
  assert '"batch_stats": 0' in linen and "nn.scan(" in linen and "nn.remat(" in linen
  assert "jnnx.BatchNorm(" in nnx and "@nnx.scan(" in nnx and "nnx.vmap(" in nnx
