"""Sphinx configuration of jaxnorm's documentation site.

Build (offline, every guide executed, warnings as errors), as CI does:

  pip install -e ".[docs]" && sphinx-build -W --keep-going -n -b html docs docs/_build/html
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's jaxnorm, also without an editable install
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
# The guides' kernels inherit this: the "many devices" guide runs on 8 virtual CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jaxnorm  # noqa: E402

project = "jaxnorm"
author = "the jaxnorm authors"
copyright = "2026, the jaxnorm authors"
release = version = jaxnorm.__version__

extensions = [
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx.ext.viewcode",
  "myst_nb",
  "public_api",  # docs/_ext/public_api.py: every public name documented, with a docstring
]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}

# The guides are MyST notebooks; every build runs them, so their code cannot go stale.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 300
# Anything a guide writes to stderr (a DeprecationWarning, say) is a build warning: an error.
nb_output_stderr = "warn"
# No LaTeX maths: rendering it needs MathJax from a CDN, which an offline reader lacks (raw
# "\(\hat x\)" on the page); formulas are written in Unicode, as in the docstrings.
# .ci/run fails the build if a page loads MathJax.
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "separated"
autodoc_default_options = {"exclude-members": "__init__, __new__"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# The build is offline (no intersphinx inventories to fetch), so references to other
# libraries' names render as plain text; every reference to a jaxnorm name must resolve.
nitpicky = True
nitpick_ignore_regex = [
  (r"py:.*", r"(jax|jaxlib|flax|nn|nnx|numpy|np|jnp|optax|typing|collections|builtins)(\..*)?"),
  (r"py:.*", r"(Any|Array|ArrayLike|Callable|Sequence|Mapping|Iterable|NamedTuple|Self)"),
  (r"py:.*", r"(int|float|bool|str|dict|list|tuple|None|object|type|Ellipsis)"),
  (r"py:.*", r"(Axes|Dtype|DTypeLike|PRNGKey|Shape|Initializer|Module|Rngs|Variable)"),
  (r"py:.*", r"(jaxtyping|equinox|eqx)(\..*)?"),  # Equinox's field annotations
]

html_theme = "sphinx_book_theme"
html_title = f"jaxnorm {release}"
html_theme_options = {
  "show_toc_level": 2,
  "home_page_in_toc": True,
  "use_download_button": False,
  "use_fullscreen_button": False,
}
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # denser tables (which_norm.md's fits at 1280 px)
# The theme reads the colour mode from here; unset, every page logged "Got invalid theme
# mode: . Resetting to auto." in the browser console.
html_context = {"default_mode": "auto"}
