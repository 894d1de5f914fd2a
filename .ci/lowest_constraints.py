"""Pin Runlet's runtime dependencies to the lowest versions ``pyproject.toml`` declares.

``nox -s tests_lowest`` installs with these constraints, so a lower bound that no longer
works fails CI instead of a user's install. Run it as a script to see the constraints::

    python .ci/lowest_constraints.py [pyproject.toml]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox and pytest bring tomli on 3.10
    import tomli as tomllib

# The optional dependencies that are part of the library at run time (the test suite
# needs them all); test, docs and benchmark tools are not pinned.
RUNTIME_EXTRAS = ("http", "trio", "postgres", "otel")


def lowest_constraints(pyproject: Mapping[str, Any]) -> list[str]:
    """One ``name==minimum`` line (with its environment marker, if any) per runtime
    dependency and per dependency of :data:`RUNTIME_EXTRAS`.

    Raises:
        ValueError: A dependency declares no lower bound (``>=``, ``==`` or ``~=``).
    """
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    lines = []
    runtime = (r for e in RUNTIME_EXTRAS for r in extras.get(e, ()))
    for text in [*project["dependencies"], *runtime]:
        requirement = Requirement(text)
        if requirement.name == project["name"]:
            continue
        lows = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if len(lows) != 1:
            raise ValueError(
                f"{text!r} must declare exactly one lower bound (>=, == or ~=) so the "
                "lowest versions can be tested."
            )
        marker = f"; {requirement.marker}" if requirement.marker else ""
        lines.append(f"{requirement.name}=={lows[0]}{marker}")
    return lines


def read(path: Path) -> list[str]:
    """:func:`lowest_constraints` of the ``pyproject.toml`` at *path*."""
    with path.open("rb") as file:
        return lowest_constraints(tomllib.load(file))


if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(read(Path(sys.argv[1]) if len(sys.argv) > 1 else here)))
