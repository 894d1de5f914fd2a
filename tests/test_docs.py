"""The examples in the documentation run, under asyncio and trio, and do what they say.

The convention, for every page listed in ``PAGES``:

1. Every fenced block opened with exactly three backticks and ``python`` is part of the
   page's example program. Other blocks (``console``, ``text``, directives) are not run.
2. The page's Python blocks are joined in order into one module. Each block keeps its line
   numbers from the Markdown file, so a traceback points at the page.
3. The module is compiled with top-level ``await`` allowed (like ``python -m asyncio``) and
   run in the test's event loop, in a fresh namespace whose ``__name__`` is not
   ``"__main__"`` and in an empty working directory.
4. Afterwards, a top-level ``async def main()`` is awaited if the page defines one (so a
   page can show a complete script ending in ``anyio.run(main)``), and so is every
   top-level ``async def test_*()`` (so the testing page can show test functions).
5. Examples show their outcomes with ``assert`` statements. The test also requires each
   page to contain some, and checks a few outcomes itself from the module's namespace.

Examples use :class:`runlet.testing.ScriptedModel`, so they need no network.
"""

from __future__ import annotations

import ast
import gc
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _parsing import parse_python

import runlet
import runlet.testing

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).parent.parent / "docs"
PAGES = [
    "index.md",
    "human-in-the-loop.md",
    "streaming.md",
    "testing.md",
    "models.md",
    "custom-models.md",
]

_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def example_source(page: str) -> str:
    """The page's Python blocks as one module, each block on its own Markdown lines."""
    text = (DOCS / page).read_text(encoding="utf-8")
    lines: list[str] = []
    for match in _PYTHON_BLOCK.finditer(text):
        first_line = text.count("\n", 0, match.start(1))  # 0-based line of the code
        lines.extend([""] * (first_line - len(lines)))
        lines.extend(match.group(1).splitlines())
    return "\n".join(lines) + "\n"


async def run_page(page: str) -> dict[str, Any]:
    source = example_source(page)
    code = compile(
        source,
        str(DOCS / page),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )
    namespace: dict[str, Any] = {"__name__": f"docs_{Path(page).stem.replace('-', '_')}"}
    coroutine = eval(code, namespace)
    if coroutine is not None:
        await coroutine
    for name, value in list(namespace.items()):
        if (name == "main" or name.startswith("test_")) and inspect.iscoroutinefunction(value):
            await value()
    return namespace


def check_index(ns: dict[str, Any]) -> None:
    assert ns["model"].remaining == 0
    assert [request.messages[-1].role for request in ns["model"].requests] == ["user", "tool"]


def check_human_in_the_loop(ns: dict[str, Any]) -> None:
    # Every approved refund ran once; order 71 twice, under the at-least-once plain store.
    refunds = ["123", "124", "7", "9", "11", "21", "55", "41", "77", "71", "71", "91", "101"]
    assert ns["refunded"] == refunds
    assert ns["looked_up"] == ["7", "9"]
    assert ns["paid_out"] == [20, 500]
    assert ns["sent_transfers"] == [(250, "DE02 1203")]
    moved = sorted(ns["payment_api"].refunds.values())
    assert moved == ["refund of order 61", "refund of order 62"]  # once each, despite crashes
    assert ns["done"].output == "Order 41 is refunded."
    assert len(ns["store"]) == 1  # only the run for order 31 still waits for an answer


def check_streaming(ns: dict[str, Any]) -> None:
    assert ns["pieces"]
    assert ns["cleaned_up"]
    assert ns["sent"][-1] == {"type": "text", "text": "Order 3 is refunded."}


def check_testing(ns: dict[str, Any]) -> None:
    tests = [name for name in ns if name.startswith("test_")]
    assert len(tests) >= 3


def check_models(ns: dict[str, Any]) -> None:
    assert len(ns["sent"]) == 2  # the prompt-caching run: the tool call, then the answer
    assert ns["answer"] == ["4"]
    assert ns["result"].usage.requests == 2


def check_custom_models(ns: dict[str, Any]) -> None:
    assert ns["sent_back"]
    assert ns["sent_back"][0]["content"].startswith("<think>")


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "index.md": check_index,
    "human-in-the-loop.md": check_human_in_the_loop,
    "streaming.md": check_streaming,
    "testing.md": check_testing,
    "models.md": check_models,
    "custom-models.md": check_custom_models,
}


@pytest.mark.parametrize("page", PAGES)
async def test_examples_run(
    page: str, anyio_backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = await run_page(page)
    CHECKS[page](namespace)


@pytest.mark.parametrize("page", PAGES)
def test_examples_assert_outcomes(page: str) -> None:
    tree = parse_python(example_source(page))
    asserts = [node for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert len(asserts) >= 3, f"{page} shows no outcomes; add assert statements"


def test_api_page_lists_every_public_name() -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. auto\w+:: ([\w.]+)", api, re.MULTILINE))
    expected = {f"runlet.{name}" for name in runlet.__all__}
    expected |= {f"runlet.testing.{name}" for name in runlet.testing.__all__}
    assert expected - documented == set()


class _ParsesWhenCollected:
    """Garbage (a reference cycle) whose finalizer parses Python, as a traceback log does."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("total = (1 + 2) * 3")


def test_a_collection_during_a_parse_cannot_break_it() -> None:
    # On Python 3.11, ast.parse raises SystemError here; parse_python must not.
    source = "".join(f"def f{i}(a):\n    return [a + {i} for _ in range(3)]\n" for i in range(2000))
    threshold = gc.get_threshold()
    gc.set_threshold(10)
    try:
        for _ in range(5):
            for _ in range(50):
                _ParsesWhenCollected()
            tree = parse_python(source)
            assert len(tree.body) == 2000
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
