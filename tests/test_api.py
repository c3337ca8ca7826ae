"""The public API: every public function, class constructor and call has a full signature
annotation (mypy checks them in CI) and a docstring."""

import inspect

import jaxnorm
from jaxnorm import convert
from jaxnorm import nnx as jnnx
from tests import typing_public_api

METHODS = ("__call__", "__init__", "linen", "nnx", "set_view")


def _public(module, names=None):
  names = names if names is not None else [n for n in dir(module) if not n.startswith("_")]
  for name in names:
    obj = getattr(module, name)
    if getattr(obj, "__module__", "").startswith("jaxnorm") and not inspect.ismodule(obj):
      yield f"{module.__name__}.{name}", obj


def _callables():
  for name, obj in [*_public(jaxnorm, jaxnorm.__all__), *_public(jnnx), *_public(convert)]:
    if inspect.isclass(obj):
      yield name, obj
      for meth in METHODS:
        if meth in vars(obj):
          yield f"{name}.{meth}", vars(obj)[meth]
    elif callable(obj):
      yield name, obj


def test_every_public_signature_is_annotated():
  missing = []
  for name, fn in _callables():
    if inspect.isclass(fn):
      continue
    sig = inspect.signature(fn)
    missing += [f"{name}({p})" for p in sig.parameters if p not in ("self", "cls")
                and sig.parameters[p].annotation is inspect.Parameter.empty]  # fmt: skip
    if not name.endswith("__init__") and sig.return_annotation is inspect.Signature.empty:
      missing.append(f"{name} -> ?")
  assert not missing, missing


def test_every_public_name_has_a_docstring():
  assert [name for name, obj in _callables() if not inspect.getdoc(obj)] == []


def test_the_strictly_typed_usage_runs():
  # mypy checks tests/typing_public_api.py with --strict's flags; here it runs.
  typing_public_api.use_everything()
