"""A Sphinx extension that makes the API reference complete or the build fail.

autodoc leaves out, without a word, a public name nobody listed and a member without a
docstring. This extension records what autodoc documented and, once every page is read,
warns (an error under ``-W``) for each public name of jaxnorm missing from the reference and
for each documented one whose docstring is empty.
"""

import importlib
import inspect

from sphinx.util import logging

LOG = logging.getLogger(__name__)
# The modules whose public names make the API; jaxnorm's own is its __all__.
MODULES = ("jaxnorm", "jaxnorm.nnx", "jaxnorm.equinox", "jaxnorm.convert")
METHODS = ("__call__", "linen", "nnx", "set_view")


def public_names():
  """Every public name: ``module.name`` and the public methods a class defines itself."""
  names = []
  for modname in MODULES:
    mod = importlib.import_module(modname)
    listed = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
    for name in listed:
      obj = getattr(mod, name)
      if inspect.ismodule(obj) or not getattr(obj, "__module__", "").startswith("jaxnorm"):
        continue
      names.append(f"{modname}.{name}")
      if inspect.isclass(obj):
        names += [f"{modname}.{name}.{m}" for m in METHODS if m in vars(obj)]
  return names


def _record(app, what, name, obj, options, lines):
  app.env.jaxnorm_documented = getattr(app.env, "jaxnorm_documented", set()) | {name}
  if what in ("function", "class", "method", "module") and not any(s.strip() for s in lines):
    LOG.warning("public_api: %s %s has no docstring", what, name, type="public_api")


def _check(app, env):
  documented = getattr(env, "jaxnorm_documented", set())
  for name in public_names():
    if name not in documented:
      LOG.warning(
        "public_api: %s is public but not in the API reference (add it to docs/api/)",
        name,
        type="public_api",
      )


def setup(app):
  app.connect("autodoc-process-docstring", _record)
  app.connect("env-check-consistency", _check)
  return {"version": "1", "parallel_read_safe": False, "env_version": 1}
