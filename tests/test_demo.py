"""The README demo: an offline run with a choice and an approval."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import runlet.demo
from runlet import (
    Agent,
    Checkpoint,
    HumanRequest,
    Runtime,
    ToolCall,
    ask_human,
    structure_checkpoint,
)
from runlet.demo import decide, demo, durable_demo, main, make_model, parse, scripted_support
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call


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
        assert shown.count("(answered by the demo: --yes, or no terminal to ask in)") == 2

    async def test_each_checkpoint_goes_back_to_the_store_through_json(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        restored: list[Checkpoint] = []

        def structure(data: Any) -> Checkpoint:
            assert json.loads(json.dumps(data)) == data  # plain JSON, as a database keeps it
            restored.append(structure_checkpoint(data))
            return restored[-1]

        monkeypatch.setattr(runlet.demo, "structure_checkpoint", structure)
        output = await demo(ScriptedModel(scripted_support), None)
        assert output == "Done: order 123 refunded as card."
        assert [c.request.kind for c in restored] == ["choice", "approval"]

    async def test_person_picks_credit_and_edits_the_order(self) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("2", "e", "999"))
        assert output == "Done: order 999 refunded as credit."

    async def test_a_choice_that_is_not_an_offered_number_is_asked_again(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("card", "0", "3", "2", "a"))
        assert output == "Done: order 123 refunded as credit."
        assert 3 == capsys.readouterr().out.count("Type a number from 1 to 2.")

    async def test_an_approval_answer_that_is_not_clear_is_asked_again(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # "no" must never approve a refund.
        output = await demo(ScriptedModel(scripted_support), answers("1", "no", "n", "r"))
        assert output == "Understood: I did not issue the refund."
        assert 2 == capsys.readouterr().out.count("Type a (approve), r (reject) or e (edit).")

    async def test_a_durable_run_the_model_finishes_without_asking_just_ends(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        output = await durable_demo(
            ScriptedModel(["Nothing to refund."]), None, str(tmp_path / "d.db"), mode="start"
        )
        assert output == "Nothing to refund."
        assert "agent: Nothing to refund." in capsys.readouterr().out

    async def test_person_rejects_the_refund(self) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("1", "r"))
        assert output == "Understood: I did not issue the refund."

    async def test_pressing_enter_picks_the_first_option_but_never_approves(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("", "  ", "", "a"))
        assert output == "Done: order 123 refunded as card."
        assert capsys.readouterr().out.count("Type a (approve), r (reject) or e (edit).") == 2

    async def test_answers_are_read_whatever_their_case(self) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("1", " R "))
        assert output == "Understood: I did not issue the refund."

    async def test_an_empty_new_order_id_keeps_the_old_one(self) -> None:
        output = await demo(ScriptedModel(scripted_support), answers("2", "E", ""))
        assert output == "Done: order 123 refunded as credit."

    async def test_input_requests_are_answered_yes_without_a_terminal(self) -> None:
        request = HumanRequest("req_1", "input", "Go on?", tool_call=ToolCall("c", "t"))
        response = await decide(request, None)
        assert (response.action, response.value) == ("submit", "yes")

    async def test_answering_waiting_runs_leaves_other_agents_runs_alone(
        self, tmp_path: Path
    ) -> None:
        path = str(tmp_path / "demo.db")
        question = call("ask_human", kind="input", prompt="Name?")
        other = Agent("other", "", ScriptedModel([question]), (ask_human(),))
        async with SQLiteCheckpointStore(path) as store:
            waiting = await Runtime(checkpoint_store=store).run(other, "hi")

        output = await durable_demo(ScriptedModel(scripted_support), None, path, mode="both")

        assert output == "Done: order 123 refunded as card."
        async with SQLiteCheckpointStore(path) as store:
            still = [found.checkpoint_id for found in await store.list_pending()]
        assert still == [waiting.checkpoint_id]

    async def test_input_requests_take_the_typed_text(self) -> None:
        request = HumanRequest("req_1", "input", "Order number?", tool_call=ToolCall("c", "t"))
        response = await decide(request, answers("A-7"))
        assert (response.action, response.value) == ("submit", "A-7")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_command_line_runs_on_each_backend(
    backend: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    loops: list[str] = []
    real_demo = runlet.demo.demo

    async def demo_noting_the_loop(*args: Any) -> str:
        try:
            asyncio.get_running_loop()
            loops.append("asyncio")
        except RuntimeError:  # no asyncio loop: trio runs this
            loops.append("trio")
        return await real_demo(*args)

    monkeypatch.setattr(runlet.demo, "demo", demo_noting_the_loop)
    assert main(["--yes", "--backend", backend]) == 0
    assert loops == [backend]
    shown = capsys.readouterr().out
    assert f"Runlet demo on {backend}" in shown
    assert "agent: Done: order 123 refunded as card." in shown


def test_command_line_without_a_terminal_answers_by_itself(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a tty: nobody to ask

    assert main([]) == 0

    assert "agent: Done: order 123 refunded as card." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "model"),
    [
        (
            ["--provider", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"],
            "OpenAIChatModel(model='m', url='http://127.0.0.1:9/v1/chat/completions')",
        ),
        (["--provider", "openai"], "OpenAIChatModel(model='gpt-4o-mini', "),
        (
            ["--provider", "anthropic", "--model", "m", "--base-url", "http://127.0.0.1:9"],
            "AnthropicModel(model='m', url='http://127.0.0.1:9/v1/messages')",
        ),
        (["--provider", "anthropic"], "AnthropicModel(model='claude-sonnet-4-5', "),
    ],
)
def test_provider_options_choose_the_model(argv: list[str], model: str) -> None:
    assert repr(make_model(parse(argv))).startswith(model)


def test_the_default_model_is_the_offline_script() -> None:
    assert isinstance(make_model(parse([])), ScriptedModel)


@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [
        ("trio", ["--backend", "trio"], '"runlet[trio]"'),
        ("httpx", ["--provider", "openai"], '"runlet[http]"'),
        ("httpx", ["--provider", "anthropic", "--backend", "trio"], '"runlet[http]"'),
    ],
)
def test_command_line_says_what_to_install_when_a_package_is_missing(
    missing: str,
    argv: list[str],
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # None in sys.modules makes the package unimportable, as after a plain install.
    monkeypatch.setitem(sys.modules, missing, None)

    assert main(["--yes", *argv]) == 2

    shown = capsys.readouterr()
    assert f"pip install {extra}" in shown.err
    assert "Runlet demo on" not in shown.out  # nothing ran


def test_plain_install_command_line_without_trio_exits_cleanly() -> None:
    """The README's command after a plain ``pip install -e .``: a message, no traceback."""
    code = (
        "import sys; sys.modules['trio'] = None; "
        "from runlet.demo import main; raise SystemExit(main(['--backend', 'trio', '--yes']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert 2 == done.returncode
    assert "Traceback" not in done.stderr
    assert 'pip install "runlet[trio]"' in done.stderr


def test_a_provider_without_a_key_says_so_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (OpenAI-compatible servers may need no key, so only Anthropic refuses to start.)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    assert main(["--yes", "--provider", "anthropic", "--model", "m"]) == 1

    shown = capsys.readouterr()
    assert "The demo stopped: ConfigurationError" in shown.err
    assert "API_KEY" in shown.err
    assert "Traceback" not in shown.err


def test_the_suggested_command_keeps_the_model_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(["--store", "d.db", "--no-answer", "--provider", "openai", "--model", "m x"])
    assert " --provider openai --model 'm x'" == runlet.demo.model_options(args)
    assert "" == runlet.demo.model_options(parse(["--store", "d.db", "--no-answer"]))


def test_a_store_file_that_cannot_be_opened_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--yes", "--store", str(tmp_path / "no" / "such" / "dir.db")]) == 1
    shown = capsys.readouterr().err
    assert "The demo stopped: ConfigurationError: Could not open the SQLite database" in shown
    assert "dir.db" in shown
    assert "Traceback" not in shown


def _at_a_terminal(backend: str, keys: bytes) -> tuple[int, str]:
    """Run the demo on a pseudo-terminal, press *keys* at its first prompt, and return
    its exit code and what it printed."""
    import os
    import pty
    import select
    import signal
    import time

    pid, terminal = pty.fork()
    if pid == 0:  # pragma: no cover - the child becomes the demo
        # As a shell starts it: Ctrl-C neither blocked nor ignored (a test process may
        # have either, and both survive exec).
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, "-m", "runlet.demo", "--backend", backend])
    shown = b""
    pressed = False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([terminal], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                data = os.read(terminal, 4096)
            except OSError:  # the demo exited: the terminal is closed
                break
            if not data:
                break
            shown += data
            if not pressed and b"Pick 1-2" in shown:
                # input() printed its prompt; press the keys once it waits in read(), as a
                # person would: a Ctrl-C landing in between is only seen after the next
                # line, by any Python program.
                while _state(pid) != "S" and time.monotonic() < deadline:
                    os.sched_yield()
                os.write(terminal, keys)
                pressed = True
    finally:
        os.close(terminal)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


def _state(pid: int) -> str:
    """The process's state letter from /proc ("S": asleep, waiting for an event)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("keys", "code", "said"),
    [
        (b"\x03", 130, "Stopped: nothing more was run."),  # Ctrl-C
        (b"\x04", 1, "Stopped at the end of the input: nothing more was run."),  # Ctrl-D
    ],
    ids=["ctrl-c", "ctrl-d"],
)
def test_a_key_that_stops_the_demo_at_a_prompt_stops_it_at_once(
    backend: str, keys: bytes, code: int, said: str
) -> None:
    # On asyncio, Ctrl-C only cancelled the main task, at its next await: input() went on
    # waiting, and after Enter and "a" the refund ran before the demo said it stopped.
    exit_code, shown = _at_a_terminal(backend, keys)
    assert (code, True) == (exit_code, said in shown), shown
    assert "Traceback" not in shown
    assert "tool call_refund" not in shown
