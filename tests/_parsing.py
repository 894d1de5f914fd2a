"""Parsing Python source in tests without tripping a CPython 3.11 bug.

On 3.11 the objects ``ast.parse`` builds share one recursion counter per interpreter. If a
garbage collection runs in the middle of a parse and a finalizer parses too (formatting a
traceback does, for its ``^^^`` markers: a leftover task's "exception was never retrieved"
log, say), the outer parse fails with ``SystemError: AST constructor recursion depth
mismatch``. The collector is paused for the parse so that other tests' garbage cannot land
there; 3.10, 3.12 and 3.13 do not need it, and it costs them nothing.
"""

from __future__ import annotations

import ast
import gc


def parse_python(source: str) -> ast.Module:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()
