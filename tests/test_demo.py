"""The README demo: an offline run with a choice and an approval."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from runlet import HumanRequest, ToolCall
from runlet.demo import decide, demo, main, scripted_support
from runlet.testing import ScriptedModel


def answers(*replies: str) -> Callable[[str], Awaitable[str]]:
    """An `ask` that replies from a list, as a person at the terminal would."""
    queue = list(replies)

    async def ask(prompt: str) -> str:
        return queue.pop(0)

    return ask


@pytest.mark.anyio
class TestDemo:
    async def test_answers_by_itself_without_a_terminal(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        output = await demo(ScriptedModel(scripted_support), None)
        assert output == "Done: order 123 refunded as card."
        shown = capsys.readouterr().out
        assert "[interrupted: choice]" in shown
        assert "[interrupted: approval]" in shown
        assert "bytes of JSON" in shown

    async def test_person_picks_credit_and_edits_the_order(self) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("2", "e", "999"))
        assert output == "Done: order 999 refunded as credit."

    async def test_person_rejects_the_refund(self) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("1", "r"))
        assert output == "Understood: I did not issue the refund."

    async def test_input_requests_take_the_typed_text(self) -> None:
        request = HumanRequest("req_1", "input", "Order number?", tool_call=ToolCall("c", "t"))
        response = await decide(request, answers("A-7"))
        assert (response.action, response.value) == ("submit", "A-7")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_command_line_runs_on_each_backend(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--yes", "--backend", backend]) == 0
    shown = capsys.readouterr().out
    assert f"Runlet demo on {backend}" in shown
    assert "agent: Done: order 123 refunded as card." in shown
