"""Sphinx configuration for the Runlet documentation.

Build with ``sphinx-build -W -n -b html docs docs/_build/html``: warnings are errors and
every cross-reference must resolve.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer

import runlet

project = "Runlet"
author = "The Runlet developers"
copyright = "2025, The Runlet developers"
release = runlet.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"Runlet {release}"

# Docstrings use Google style (Args:, Returns:, Raises:, Attributes:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
python_use_unqualified_type_names = True
# Public aliases keep their short names in signatures instead of being expanded.
autodoc_type_aliases = {
    name: f"runlet.{name}"
    for name in (
        "Handler",
        "HumanAction",
        "HumanRequestKind",
        "ModelStreamItem",
        "Role",
        "RunStatus",
        "StreamEvent",
    )
}
autodoc_type_aliases["ScriptItem"] = "runlet.testing.ScriptItem"

# There is no network at build time, so no intersphinx: names from the standard library
# and third-party packages are left unlinked instead of failing the nitpicky build.
nitpick_ignore_regex = [
    ("py:.*", r"(collections\.abc|typing|typing_extensions|contextlib|types|os)\..*"),
    ("py:.*", r"(anyio|attrs|cattrs|httpx|datetime|psycopg|psycopg_pool)(\..*)?"),
    # The type variable of runlet.structure(data, cls) -> T.
    ("py:class", r"runlet\._checkpoint\.T"),
]


def _private_modules(package: str) -> list[str]:
    path = importlib.import_module(package).__path__
    return [f"{package}.{info.name}" for info in pkgutil.iter_modules(path) if info.name[0] == "_"]


_DATA_DOCS: dict[str, list[str]] = {}


def _data_docs(package: str) -> None:
    """Collect the ``#:`` comments and docstrings that follow module-level constants and
    type aliases in the private modules, keyed by their public name."""
    module = importlib.import_module(package)
    public = set(module.__all__)
    for private in _private_modules(package):
        for (_, name), lines in ModuleAnalyzer.for_module(private).find_attr_docs().items():
            if name in public:
                _DATA_DOCS[f"{package}.{name}"] = list(lines)


def _use_private_data_docs(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    # Constants and type aliases are re-exported from private modules, where their
    # documentation lives; autodoc only looks in the public module, so fill it in.
    if what == "data" and name in _DATA_DOCS:
        lines[:] = _DATA_DOCS[name]


_ALIAS_REF = re.compile(r"TypeAliasForwardRef\('([^']+)'\)")


def _tidy_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    # Users never construct protocols or a RunStream, so their signatures would only
    # show internals (``*args, **kwargs`` or private classes).
    if what == "class" and (getattr(obj, "_is_protocol", False) or obj is runlet.RunStream):
        return "", None
    # Sphinx leaves aliases nested inside generics as "TypeAliasForwardRef('x')".
    if signature is None and return_annotation is None:
        return None
    return (
        signature and _ALIAS_REF.sub(r"\1", signature),
        return_annotation and _ALIAS_REF.sub(r"\1", return_annotation),
    )


def setup(app: Sphinx) -> None:
    for package in ("runlet", "runlet.testing"):
        _data_docs(package)
    app.connect("autodoc-process-docstring", _use_private_data_docs)
    app.connect("autodoc-process-signature", _tidy_signature)
