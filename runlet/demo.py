"""An agent run that stops for a person, offline: ``python -m runlet.demo``.

A support agent first asks the customer how they want their refund (an ``ask_human``
choice), then calls an approval-gated ``refund`` tool. In a terminal you approve, reject
or edit the call; with ``--yes`` (or without a terminal) the demo answers by itself.
Between the interruption and the resume, the checkpoint makes a JSON round trip, as it
would on its way to a database.

Options::

    --backend {asyncio,trio}   the event loop (default asyncio)
    --yes                      approve and pick the first option without asking
    --provider {scripted,openai,anthropic}
                               the model: a built-in script (default, no key needed) or a
                               real API (reads OPENAI_API_KEY / ANTHROPIC_API_KEY)
    --model NAME               the provider's model name
    --base-url URL             an OpenAI-compatible server, e.g. http://127.0.0.1:11434/v1
    --store FILE               keep checkpoints in this SQLite file (SQLiteCheckpointStore)
    --no-answer                with --store: stop at the first question and exit; the run
                               waits in the file
    --answer-pending           with --store: answer the runs waiting in the file, from
                               this (another) process
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import sqlite3
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from . import (
    Agent,
    HumanRequest,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    Model,
    ModelRequest,
    RunletError,
    Runtime,
    ToolCall,
    ToolContext,
    ToolSpec,
    ask_human,
    structure_checkpoint,
    unstructure_checkpoint,
)
from .testing import ScriptedModel

INSTRUCTIONS = (
    "You are a support agent. Before refunding, ask the customer how they want the "
    "money back (ask_human with kind='choice', options 'card' and 'credit'), then call "
    "refund with the order id and that method. Finish with one short sentence."
)


async def refund(arguments: Mapping[str, Any], context: ToolContext) -> dict[str, Any]:
    """Pretend to refund an order. A real tool would use context.tool_call_id as the
    idempotency key of the payment API call."""
    return {"refunded": arguments["order_id"], "method": arguments["method"], "status": "ok"}


REFUND = ToolSpec(
    name="refund",
    description="Refund an order to the card or as store credit.",
    input_schema={
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "method": {"enum": ["card", "credit"]},
        },
        "required": ["order_id", "method"],
        "additionalProperties": False,
    },
    handler=refund,
    requires_approval=True,
)


def scripted_support(request: ModelRequest) -> Message:
    """What a model would do here, as a pure function of the transcript."""
    last = request.messages[-1]
    if last.tool_result is None:
        question = ToolCall(
            "call_ask",
            "ask_human",
            {
                "kind": "choice",
                "prompt": "How would you like your refund for order 123?",
                "options": [
                    {"id": "card", "label": "Back to my card", "description": "3-5 days"},
                    {"id": "credit", "label": "Store credit", "description": "instant"},
                ],
            },
        )
        return Message.assistant("Let me check how you want the refund.", [question])
    if last.tool_result.tool_call_id == "call_ask":
        method = json.loads(last.content)["selected"]
        call = ToolCall("call_refund", "refund", {"order_id": "123", "method": method})
        return Message.assistant("", [call])
    if last.tool_result.is_error:
        return Message.assistant("Understood: I did not issue the refund.")
    done = json.loads(last.content.rsplit("Result: ", 1)[-1])
    return Message.assistant(f"Done: order {done['refunded']} refunded as {done['method']}.")


Ask = Callable[[str], Awaitable[str]]


# Said of an answer the demo gave itself.
_BY_ITSELF = " (answered by the demo: --yes, or no terminal to ask in)"


async def decide(request: HumanRequest, ask: Ask | None) -> HumanResponse:
    """Answer *request*: by asking in the terminal, or by itself when *ask* is None."""
    if request.kind == "choice":
        for number, option in enumerate(request.options, 1):
            print(f"  {number}. {option.label} ({option.description or option.id})")
        picked = request.options[0]
        while ask is not None:
            answer = (await ask(f"Pick 1-{len(request.options)} [1]: ")).strip() or "1"
            if answer.isdigit() and 1 <= int(answer) <= len(request.options):
                picked = request.options[int(answer) - 1]
                break
            print(f"  Type a number from 1 to {len(request.options)}.")
        print(f"  -> {picked.label}{_BY_ITSELF if ask is None else ''}")
        return HumanResponse(request.id, "select", value=picked.id)
    if request.kind == "input":
        text = await ask("Your answer: ") if ask is not None else "yes"
        return HumanResponse(request.id, "submit", value=text)
    if ask is None:
        print(f"  -> approved{_BY_ITSELF}")
        return HumanResponse(request.id, "approve")
    while True:  # only a clear yes approves: anything else (Enter too) is asked again
        answer = (await ask("Approve, reject or edit? [a/r/e] ")).strip().lower()
        if answer in ("a", "approve", "y", "yes", "r", "reject", "e", "edit"):
            break
        print("  Type a (approve), r (reject) or e (edit).")
    if answer.startswith("r"):
        return HumanResponse(request.id, "reject")
    if answer.startswith("e"):
        edited = dict(request.tool_call.arguments)
        edited["order_id"] = (await ask(f"New order id [{edited['order_id']}]: ")) or edited[
            "order_id"
        ]
        return HumanResponse(request.id, "approve", edited_arguments=edited)
    return HumanResponse(request.id, "approve")


def make_model(args: argparse.Namespace) -> Model:
    """The model the demo talks to."""
    if args.provider == "openai":
        from .providers.openai import OpenAIChatModel

        return OpenAIChatModel(args.model or "gpt-4o-mini", base_url=args.base_url)
    if args.provider == "anthropic":
        from .providers.anthropic import AnthropicModel

        return AnthropicModel(args.model or "claude-sonnet-4-5", base_url=args.base_url)
    return ScriptedModel(scripted_support)


async def demo(model: Model, ask: Ask | None) -> str:
    """Run the support agent to the end, answering each interruption; return its
    final output."""
    store = InMemoryCheckpointStore()
    runtime = Runtime(checkpoint_store=store)
    agent = Agent("support", INSTRUCTIONS, model, (ask_human(), REFUND))
    print("user: Please refund order 123.")
    result = await runtime.run(agent, "Please refund order 123.")
    while result.status == "interrupted":
        request = result.interruption
        assert request is not None
        assert result.checkpoint_id is not None
        print(f"[interrupted: {request.kind}] {request.prompt}")
        # The checkpoint as a durable store would keep it: plain JSON.
        saved = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))
        print(f"  (checkpoint {result.checkpoint_id}: {len(saved)} bytes of JSON)")
        await store.save(structure_checkpoint(json.loads(saved)))
        response = await decide(request, ask)
        result = await runtime.resume(agent, checkpoint_id=result.checkpoint_id, response=response)
    for message in result.transcript:
        if message.tool_result is not None:
            print(f"  tool {message.tool_result.tool_call_id}: {message.content}")
    print(f"agent: {result.output}")
    print(f"({result.usage.requests} model requests, run {result.run_id})")
    return result.output or ""


async def durable_demo(
    model: Model, ask: Ask | None, path: str, *, mode: str, again: str = ""
) -> str:
    """The demo with its checkpoints in a SQLite file: ``mode`` is ``"start"`` (run until
    the first question, then stop), ``"answer"`` (answer the runs waiting in the file) or
    ``"both"``. *again* holds the model options to repeat in the command it suggests.
    Returns the last run's final output ("" when none finished)."""
    from .stores.sqlite import SQLiteCheckpointStore

    agent = Agent("support", INSTRUCTIONS, model, (ask_human(), REFUND))
    output = ""
    async with SQLiteCheckpointStore(path) as store:
        runtime = Runtime(checkpoint_store=store)
        if mode != "answer":
            print("user: Please refund order 123.")
            started = await runtime.run(agent, "Please refund order 123.")
            if started.interruption is None:  # a real model may answer without asking
                print(f"agent: {started.output}")
                return started.output or ""
            print(f"[interrupted: {started.interruption.kind}] {started.interruption.prompt}")
            print(f"  (checkpoint {started.checkpoint_id} saved in {path})")
        if mode == "start":
            print(
                f"Answer it from another process: {_python()} -m runlet.demo --store "
                f"{shlex.quote(path)} --answer-pending{again}"
            )
            return output
        waiting = await store.list_pending(agent_name="support")
        if not waiting:
            print(
                f"No run is waiting in {path}. Start one: {_python()} -m runlet.demo --store "
                f"{shlex.quote(path)} --no-answer"
            )
        for found in waiting:
            request, checkpoint_id = found.request, found.checkpoint_id
            print(
                f"[waiting since {found.created_at:%H:%M:%S}, run {found.run_id}] {request.prompt}"
            )
            while True:
                response = await decide(request, ask)
                result = await runtime.resume(agent, checkpoint_id=checkpoint_id, response=response)
                if result.interruption is None or result.checkpoint_id is None:
                    break
                request, checkpoint_id = result.interruption, result.checkpoint_id
                print(f"[interrupted: {request.kind}] {request.prompt}")
            output = result.output or ""
            print(f"agent: {output}")
    return output


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m runlet.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--yes", action="store_true", help="answer without asking")
    parser.add_argument(
        "--provider", choices=("scripted", "openai", "anthropic"), default="scripted"
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--store", metavar="FILE", help="a SQLite file for the checkpoints")
    parser.add_argument("--no-answer", action="store_true", help="stop at the first question")
    parser.add_argument("--answer-pending", action="store_true", help="answer waiting runs")
    args = parser.parse_args(argv)
    if (args.no_answer or args.answer_pending) and args.store is None:
        parser.error("--no-answer and --answer-pending need --store FILE")
    if args.no_answer and args.answer_pending:
        parser.error("use --no-answer in one process and --answer-pending in another")
    return args


def missing_extra(args: argparse.Namespace) -> str | None:
    """What the chosen options need that is not installed, said as what to do about it;
    ``None`` when nothing is missing."""
    needs: list[tuple[str, str, str]] = []
    if args.backend == "trio":
        needs.append(("the trio backend", "trio", "trio"))
    if args.provider != "scripted":
        needs.append((f"the {args.provider} provider", "httpx", "http"))
    for what, package, extra in needs:
        if importlib.util.find_spec(package) is None:
            return (
                f"{what.capitalize()} needs {package}, which is not installed: "
                f'pip install "runlet[{extra}]" (in a clone: pip install -e ".[{extra}]").'
            )
    return None


def _python() -> str:
    """This interpreter, as a shell command (``.venv/bin/python`` from the project's
    directory): a plain ``python`` may have no Runlet, or be no command at all."""
    if not sys.executable:
        return "python"
    try:
        executable = os.path.relpath(sys.executable)
    except (ValueError, OSError):  # on another drive (Windows), or no current directory
        executable = sys.executable
    if executable.startswith(os.pardir) or not os.path.dirname(executable):
        executable = sys.executable  # outside this directory, or right in it
    return shlex.quote(executable)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m runlet.demo``. Returns the exit status: 0; 1 when the
    demo cannot go on (no API key, a server that cannot be reached, a store file that
    cannot be opened: the message says what is wrong); 2 when the options need a package
    that is not installed (the message says which); 130 after Ctrl-C."""
    args = parse(argv)
    missing = missing_extra(args)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    interactive = not args.yes and sys.stdin.isatty()

    async def ask(prompt: str) -> str:
        # input() blocks the event loop, on purpose: nothing else runs while the person
        # decides, and Ctrl-C stops the demo at once (in a worker thread, it would wait
        # for Enter and then take the empty answer).
        return read_line(prompt)

    async def go() -> None:
        if args.store is not None:
            mode = "start" if args.no_answer else "answer" if args.answer_pending else "both"
            await durable_demo(
                make_model(args),
                ask if interactive else None,
                args.store,
                mode=mode,
                again=model_options(args),
            )
            return
        await demo(make_model(args), ask if interactive else None)

    print(f"Runlet demo on {args.backend}, model: {args.provider}")
    try:
        anyio.run(go, backend=args.backend)
    except KeyboardInterrupt:
        print("\nStopped: nothing more was run.", file=sys.stderr)
        return 130
    except EOFError:  # Ctrl-D, or piped answers that ran out
        print("\nStopped at the end of the input: nothing more was run.", file=sys.stderr)
        return 1
    except (RunletError, sqlite3.Error, OSError) as error:
        # A missing API key, a server that cannot be reached, a store file that cannot
        # be opened, an answer another process gave first: what happened, not a traceback.
        print(f"The demo stopped: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def read_line(prompt: str) -> str:
    """``input(prompt)``, which Ctrl-C interrupts at once on every backend.

    Under asyncio, the event loop's runner handles Ctrl-C by cancelling its main task,
    which takes effect only at that task's next ``await``: ``input()`` would go on
    waiting, and whatever came after the next Enter (an approved refund, say) would run
    before the demo stopped. So while it waits, Ctrl-C raises ``KeyboardInterrupt``.
    """
    if threading.current_thread() is not threading.main_thread():
        return input(prompt)  # pragma: no cover - the demo asks from its main thread
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return input(prompt)
    finally:
        signal.signal(signal.SIGINT, previous)


def model_options(args: argparse.Namespace) -> str:
    """The command-line options that choose the model, to repeat in a suggested command."""
    given = [("--backend", args.backend if args.backend != "asyncio" else None)]
    given += [("--provider", args.provider if args.provider != "scripted" else None)]
    given += [("--model", args.model), ("--base-url", args.base_url)]
    return "".join(f" {flag} {shlex.quote(value)}" for flag, value in given if value)


if __name__ == "__main__":
    raise SystemExit(main())
