"""Small helpers with no better home."""

from __future__ import annotations

import math
from typing import Any

import attrs


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Make the public names of *module_name* say they live there, so reprs, tracebacks
    and the docs show ``runlet.Agent`` rather than ``runlet._agent.Agent``."""
    seen: set[int] = set()

    def fix(name: str, obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        module = getattr(obj, "__module__", None)
        if module is None or not module.startswith(module_name + "._"):
            return
        if isinstance(obj, type) and attrs.has(obj):
            # String annotations are resolved in the defining module; after the move
            # below they would be looked up in the package and fail.
            attrs.resolve_types(obj)
        try:
            obj.__module__ = module_name
        except (AttributeError, TypeError):  # some typing constructs refuse
            return
        if isinstance(obj, type):
            obj.__name__ = name
            obj.__qualname__ = name
            for attr_name, attr in obj.__dict__.items():
                if callable(attr) or isinstance(attr, (classmethod, staticmethod, property)):
                    fix(attr_name, attr)

    for name in namespace.get("__all__", ()):
        fix(name, namespace[name])


def is_seconds(value: object, *, positive: bool = False) -> bool:
    """Whether *value* is a finite, non-negative (or, if *positive*, positive) number of
    seconds: an ``int`` or ``float`` (a ``bool`` is not a number of seconds)."""
    if type(value) is not int and type(value) is not float:
        return False
    seconds: float = value
    return (seconds > 0 if positive else seconds >= 0) and seconds < math.inf
