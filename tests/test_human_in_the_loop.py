"""Human in the loop: approvals, ask_human(), several calls in one message, and a resume
that loses nothing when it fails (issue 3; spec page ``human-in-the-loop``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import attrs
import pytest

import runlet
from runlet import (
    REJECTION_MESSAGE,
    Agent,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    ModelRequest,
    ModelResponse,
    Runtime,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    ask_human,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
    "additionalProperties": False,
}

PLANS = [
    {"id": "basic", "label": "Basic"},
    {"id": "pro", "label": "Pro", "description": "For teams"},
]


class Refund:
    """An approval-gated handler that records its calls; it can block on an event."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.contexts: list[ToolContext] = []
        self.started: anyio.Event | None = None
        self.release: anyio.Event | None = None

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.calls.append(dict(arguments))
        self.contexts.append(context)
        if self.started is not None and self.release is not None:
            self.started.set()
            await self.release.wait()
        return f"Refunded order {arguments['order_id']}."


def refund_tool(handler: Refund) -> ToolSpec:
    return ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, handler, requires_approval=True)


def support_agent(model: runlet.Model, handler: Refund, *extra: ToolSpec) -> Agent:
    return Agent("support", "Ask before refunds.", model, (refund_tool(handler), *extra))


def runtime() -> Runtime:
    return Runtime(checkpoint_store=InMemoryCheckpointStore())


def tool_results(transcript: Sequence[Message]) -> list[ToolResult]:
    return [m.tool_result for m in transcript if m.tool_result is not None]


def roles(transcript: Sequence[Message]) -> list[str]:
    return [m.role for m in transcript]


async def interrupt(rt: Runtime, agent: Agent, text: str = "Refund order 123.") -> runlet.RunResult:
    result = await rt.run(agent, text)
    assert "interrupted" == result.status
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    return result


def respond(result: runlet.RunResult, action: str, **kwargs: Any) -> HumanResponse:
    assert result.interruption is not None
    return HumanResponse(request_id=result.interruption.id, action=action, **kwargs)  # type: ignore[arg-type]


async def resume(
    rt: Runtime, agent: Agent, result: runlet.RunResult, response: HumanResponse
) -> runlet.RunResult:
    assert result.checkpoint_id is not None
    return await rt.resume(agent, checkpoint_id=result.checkpoint_id, response=response)


# --- The spec page's examples ------------------------------------------------------------


class Provider:
    """A model adapter that is not part of Runlet: it calls the one tool it is given on
    the user's message and answers with the tool's result once it has one."""

    def __init__(self, first_call: ToolCall) -> None:
        self.first_call = first_call
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        last = request.messages[-1]
        if last.role == "user":
            return ModelResponse(Message.assistant(tool_calls=[self.first_call]))
        return ModelResponse(Message.assistant(f"Done: {last.content}"))


def make_provider(kind: str, first_call: ToolCall) -> Provider | ScriptedModel:
    if kind == "adapter":
        return Provider(first_call)

    def answer(request: ModelRequest) -> str | ToolCall:
        last = request.messages[-1]
        return first_call if last.role == "user" else f"Done: {last.content}"

    return ScriptedModel(answer)


def show_approval(prompt: str) -> None:
    assert 'Allow refund with {"order_id": "123"}?' == prompt


def show_choice(prompt: str, options: Sequence[runlet.HumanOption]) -> str:
    assert "Which plan?" == prompt
    assert (
        runlet.HumanOption("basic", "Basic"),
        runlet.HumanOption("pro", "Pro", "For teams"),
    ) == tuple(options)
    return options[1].id


@pytest.mark.parametrize("model_kind", ["adapter", "scripted"])
async def test_spec_example_approve_a_refund(model_kind: str) -> None:
    provider = make_provider(model_kind, ToolCall("call_1", "refund", {"order_id": "123"}))

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return f"Refunded order {arguments['order_id']}."

    refund_tool = ToolSpec(
        name="refund",
        description="Refund an order.",
        input_schema={
            "type": "object",
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string"}},
        },
        handler=refund,
        requires_approval=True,
    )
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = Agent(
        name="support",
        instructions="Ask for approval before issuing refunds.",
        model=provider,
        tools=(refund_tool,),
    )

    result = await runtime.run(agent, "Refund order 123.")
    assert "interrupted" == result.status
    request = result.interruption
    assert request is not None
    assert result.checkpoint_id is not None
    assert "approval" == request.kind
    show_approval(request.prompt)

    result = await runtime.resume(
        agent,
        checkpoint_id=result.checkpoint_id,
        response=HumanResponse(request_id=request.id, action="approve"),
    )

    assert "completed" == result.status
    assert "Done: Refunded order 123." == result.output


@pytest.mark.parametrize("model_kind", ["adapter", "scripted"])
async def test_spec_example_ask_a_human_to_choose(model_kind: str) -> None:
    arguments = {"kind": "choice", "prompt": "Which plan?", "options": PLANS}
    provider = make_provider(model_kind, ToolCall("call_1", "ask_human", arguments))
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = Agent(
        name="planner",
        instructions="When a plan is unclear, ask the user to choose an option.",
        model=provider,
        tools=(ask_human(),),
    )

    result = await runtime.run(agent, "Help me choose a plan.")
    assert "interrupted" == result.status
    request = result.interruption
    assert request is not None
    assert result.checkpoint_id is not None
    assert "choice" == request.kind
    option_id = show_choice(request.prompt, request.options)

    result = await runtime.resume(
        agent,
        checkpoint_id=result.checkpoint_id,
        response=HumanResponse(request_id=request.id, action="select", value=option_id),
    )

    assert "completed" == result.status
    assert 'Done: {"selected": "pro", "label": "Pro"}' == result.output


# --- Approval ----------------------------------------------------------------------------


async def test_approval_interrupts_before_the_handler_runs() -> None:
    handler = Refund()
    model = ScriptedModel([call("refund", id="call_r", order_id="123")])
    result = await interrupt(runtime(), support_agent(model, handler))

    assert [] == handler.calls
    assert result.interruption is not None
    assert "approval" == result.interruption.kind
    assert () == result.interruption.options
    assert ToolCall("call_r", "refund", {"order_id": "123"}) == result.interruption.tool_call
    assert ["user", "assistant"] == roles(result.transcript)


async def test_approve_runs_the_real_handler_and_records_its_result() -> None:
    handler = Refund()
    model = ScriptedModel([call("refund", id="call_r", order_id="123"), "Refunded."])
    rt = runtime()
    agent = support_agent(model, handler)
    first = await interrupt(rt, agent)

    result = await resume(rt, agent, first, respond(first, "approve"))

    assert [{"order_id": "123"}] == handler.calls
    assert "call_r" == handler.contexts[0].tool_call_id
    assert first.run_id == handler.contexts[0].run_id == result.run_id
    assert [ToolResult("call_r", "Refunded order 123.")] == tool_results(result.transcript)
    assert ["user", "assistant", "tool", "assistant"] == roles(result.transcript)
    assert "Refunded." == result.output


async def test_approve_with_edited_arguments_runs_them_and_shows_the_edit() -> None:
    handler = Refund()
    model = ScriptedModel([call("refund", id="call_r", order_id="123"), "Refunded."])
    rt = runtime()
    agent = support_agent(model, handler)
    first = await interrupt(rt, agent)

    response = respond(first, "approve", edited_arguments={"order_id": "456"})
    result = await resume(rt, agent, first, response)

    assert [{"order_id": "456"}] == handler.calls
    expected = ToolResult(
        "call_r",
        'A human edited the arguments to {"order_id": "456"} before the call ran. '
        "Result: Refunded order 456.",
    )
    assert [expected] == tool_results(result.transcript)
    # The model's call stays as the model made it; the result says what really ran.
    assert (ToolCall("call_r", "refund", {"order_id": "123"}),) == result.transcript[1].tool_calls
    assert expected == model.requests[1].messages[-1].tool_result


@pytest.mark.parametrize(
    "edited",
    [{"order_id": 456}, {}, {"order_id": "456", "extra": True}],
    ids=["wrong-type", "missing", "extra"],
)
async def test_edited_arguments_that_fail_the_schema_are_refused_and_resumable(
    edited: dict[str, Any],
) -> None:
    handler = Refund()
    model = ScriptedModel([call("refund", id="call_r", order_id="123"), "Refunded."])
    rt = runtime()
    agent = support_agent(model, handler)
    first = await interrupt(rt, agent)

    with pytest.raises(
        runlet.HumanResponseError, match="edited_arguments do not fit tool 'refund'"
    ):
        await resume(rt, agent, first, respond(first, "approve", edited_arguments=edited))
    assert [] == handler.calls
    assert [] == model.requests[1:]

    result = await resume(rt, agent, first, respond(first, "approve"))
    assert "completed" == result.status
    assert [{"order_id": "123"}] == handler.calls


async def test_reject_appends_the_fixed_rejection_result_every_time() -> None:
    handler = Refund()
    model = ScriptedModel(
        [
            call("refund", id="call_1", order_id="1"),
            call("refund", id="call_2", order_id="2"),
            "Ok.",
        ]
    )
    rt = runtime()
    agent = support_agent(model, handler)
    first = await interrupt(rt, agent)
    second = await resume(rt, agent, first, respond(first, "reject"))
    assert "interrupted" == second.status

    result = await resume(rt, agent, second, respond(second, "reject"))

    assert [] == handler.calls
    assert [
        ToolResult("call_1", REJECTION_MESSAGE, is_error=True),
        ToolResult("call_2", REJECTION_MESSAGE, is_error=True),
    ] == tool_results(result.transcript)
    assert "A human rejected this tool call, so it was not run." == REJECTION_MESSAGE


async def test_gated_call_with_invalid_arguments_gets_an_error_and_no_human() -> None:
    handler = Refund()
    model = ScriptedModel([call("refund", id="call_r", order_id=123), "Sorry."])
    result = await runtime().run(support_agent(model, handler), "Refund order 123.")

    assert "completed" == result.status
    assert [] == handler.calls
    [error] = tool_results(result.transcript)
    assert error.is_error
    assert error.content.startswith("Invalid arguments for tool 'refund': ")


# --- ask_human() -------------------------------------------------------------------------


def planner(model: runlet.Model) -> Agent:
    return Agent("planner", "Ask when unsure.", model, (ask_human(),))


async def test_choice_select_goes_into_the_original_call_result() -> None:
    model = ScriptedModel(
        [
            call("ask_human", id="call_ask", kind="choice", prompt="Which plan?", options=PLANS),
            "Ok.",
        ]
    )
    rt = runtime()
    agent = planner(model)
    first = await interrupt(rt, agent, "Help me choose.")
    assert first.interruption is not None
    assert "choice" == first.interruption.kind
    assert "Which plan?" == first.interruption.prompt
    assert (
        runlet.HumanOption("basic", "Basic", None),
        runlet.HumanOption("pro", "Pro", "For teams"),
    ) == first.interruption.options

    result = await resume(rt, agent, first, respond(first, "select", value="basic"))

    expected = ToolResult("call_ask", json.dumps({"selected": "basic", "label": "Basic"}))
    assert [expected] == tool_results(result.transcript)
    assert {"selected": "basic", "label": "Basic"} == json.loads(expected.content)
    assert ["user", "assistant", "tool", "assistant"] == roles(result.transcript)
    assert ["user", "assistant", "tool"] == roles(model.requests[1].messages)


async def test_input_submit_carries_the_text_into_the_original_call_result() -> None:
    model = ScriptedModel([call("ask_human", id="call_ask", kind="input", prompt="Name?"), "Hi."])
    rt = runtime()
    agent = planner(model)
    first = await interrupt(rt, agent, "Greet me.")
    assert first.interruption is not None
    assert ("input", "Name?", ()) == (
        first.interruption.kind,
        first.interruption.prompt,
        first.interruption.options,
    )

    result = await resume(rt, agent, first, respond(first, "submit", value='Zoë "Z" Ng'))

    expected = ToolResult("call_ask", json.dumps({"answer": 'Zoë "Z" Ng'}, ensure_ascii=False))
    assert [expected] == tool_results(result.transcript)
    assert {"answer": 'Zoë "Z" Ng'} == json.loads(tool_results(result.transcript)[0].content)
    user_messages = [m for m in model.requests[1].messages if m.role == "user"]
    assert [Message.user("Greet me.")] == user_messages
    assert [Message.user("Greet me.")] == [m for m in result.transcript if m.role == "user"]


@pytest.mark.parametrize(
    "arguments",
    [
        {"kind": "choice", "prompt": "Which?"},
        {"kind": "choice", "prompt": "Which?", "options": []},
        {"kind": "choice", "prompt": "Which?", "options": [PLANS[0], PLANS[0]]},
        {"kind": "vote", "prompt": "Which?"},
        {"kind": "input"},
        {"kind": "input", "prompt": ""},
        {"kind": "input", "prompt": "Name?", "options": PLANS},
        {"kind": "choice", "prompt": "Which?", "options": [{"id": "a"}]},
    ],
    ids=[
        "no-options",
        "empty-options",
        "duplicate-ids",
        "unknown-kind",
        "missing-prompt",
        "empty-prompt",
        "input-with-options",
        "option-without-label",
    ],
)
async def test_invalid_ask_human_arguments_go_back_to_the_model(arguments: dict[str, Any]) -> None:
    store = InMemoryCheckpointStore()
    model = ScriptedModel([call("ask_human", arguments, id="call_ask"), "I will guess."])

    result = await Runtime(checkpoint_store=store).run(planner(model), "Help.")

    assert "completed" == result.status
    assert "I will guess." == result.output
    assert 0 == len(store)
    [error] = tool_results(result.transcript)
    assert "call_ask" == error.tool_call_id
    assert error.is_error
    assert error.content.startswith("Invalid arguments for tool 'ask_human': ")
    assert error == model.requests[1].messages[-1].tool_result


async def test_a_tool_of_ones_own_named_ask_human_is_an_ordinary_tool() -> None:
    async def page(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return f"Paged {arguments['who']}."

    schema = {"type": "object", "required": ["who"], "properties": {"who": {"type": "string"}}}
    tool = ToolSpec("ask_human", "Page a person.", schema, page, requires_approval=True)
    model = ScriptedModel([call("ask_human", id="c", who="ann"), "Ok."])
    rt = runtime()
    agent = Agent("pager", "Page when stuck.", model, (tool,))
    first = await interrupt(rt, agent, "Help.")
    assert first.interruption is not None
    assert "approval" == first.interruption.kind

    result = await resume(rt, agent, first, respond(first, "approve"))

    assert [ToolResult("c", "Paged ann.")] == tool_results(result.transcript)


async def test_duplicate_option_ids_are_named_in_the_error() -> None:
    options = [{"id": "a", "label": "A"}, {"id": "a", "label": "Also A"}]
    model = ScriptedModel(
        [call("ask_human", id="c", kind="choice", prompt="?", options=options), "Ok."]
    )
    result = await runtime().run(planner(model), "Help.")
    [error] = tool_results(result.transcript)
    assert "option ids must be unique, got ['a', 'a']" in error.content


async def test_select_must_name_an_offered_option() -> None:
    model = ScriptedModel(
        [call("ask_human", id="c", kind="choice", prompt="Which plan?", options=PLANS), "Ok."]
    )
    rt = runtime()
    agent = planner(model)
    first = await interrupt(rt, agent, "Help.")

    with pytest.raises(runlet.HumanResponseError, match="'gold' is not one of the offered"):
        await resume(rt, agent, first, respond(first, "select", value="gold"))
    with pytest.raises(runlet.HumanResponseError, match="'Basic' is not one of the offered"):
        await resume(rt, agent, first, respond(first, "select", value="Basic"))

    result = await resume(rt, agent, first, respond(first, "select", value="pro"))
    assert "completed" == result.status


# --- Several calls in one assistant message ----------------------------------------------


async def test_free_calls_run_concurrently_then_each_human_call_interrupts_in_order() -> None:
    lookups: dict[str, anyio.Event] = {"a": anyio.Event(), "b": anyio.Event()}
    looked_up: list[str] = []

    async def lookup(arguments: Mapping[str, Any], context: ToolContext) -> str:
        mine, other = arguments["order_id"], "b" if arguments["order_id"] == "a" else "a"
        lookups[mine].set()
        # Each lookup waits for the other: this finishes only if both run at once.
        with anyio.fail_after(5):
            await lookups[other].wait()
        looked_up.append(mine)
        return f"order {mine}"

    lookup_tool = ToolSpec("lookup", "Look up.", ORDER_SCHEMA, lookup)
    handler = Refund()
    calls = [
        call("refund", id="c1", order_id="r1"),
        call("lookup", id="c2", order_id="a"),
        call("ask_human", id="c3", kind="input", prompt="Why?"),
        call("lookup", id="c4", order_id="b"),
        call("refund", id="c5", order_id="r2"),
    ]
    model = ScriptedModel([calls, "All done."])
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    agent = support_agent(model, handler, lookup_tool, ask_human())

    first = await interrupt(rt, agent)
    assert ["a", "b"] == sorted(looked_up)
    assert [] == handler.calls
    assert first.interruption is not None
    assert "c1" == first.interruption.tool_call.id

    second = await resume(rt, agent, first, respond(first, "approve"))
    assert second.interruption is not None
    assert ("c3", "input") == (second.interruption.tool_call.id, second.interruption.kind)
    assert [{"order_id": "r1"}] == handler.calls

    third = await resume(rt, agent, second, respond(second, "submit", value="Broken."))
    assert third.interruption is not None
    assert "c5" == third.interruption.tool_call.id
    assert 1 == len(model.requests)

    result = await resume(rt, agent, third, respond(third, "reject"))

    interruptions = [r.interruption for r in (first, second, third)]
    assert 3 == len({r.checkpoint_id for r in (first, second, third)})
    assert 3 == len({i.id for i in interruptions if i is not None})
    assert [{"order_id": "r1"}] == handler.calls
    assert 2 == len(model.requests)
    expected = [
        ToolResult("c1", "Refunded order r1."),
        ToolResult("c2", "order a"),
        ToolResult("c3", '{"answer": "Broken."}'),
        ToolResult("c4", "order b"),
        ToolResult("c5", REJECTION_MESSAGE, is_error=True),
    ]
    assert expected == tool_results(model.requests[1].messages)
    assert ["user", "assistant", *["tool"] * 5] == roles(model.requests[1].messages)
    assert expected == tool_results(result.transcript)
    assert "All done." == result.output
    assert 0 == len(store)


async def test_checkpoint_of_a_later_call_keeps_the_earlier_results() -> None:
    handler = Refund()
    calls = [call("refund", id="c1", order_id="1"), call("refund", id="c2", order_id="2")]
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    agent = support_agent(ScriptedModel([calls, "Ok."]), handler)
    first = await interrupt(rt, agent)
    second = await resume(rt, agent, first, respond(first, "approve"))
    assert second.checkpoint_id is not None

    checkpoint = await store.load(second.checkpoint_id)

    assert (ToolResult("c1", "Refunded order 1."),) == checkpoint.results
    assert (ToolCall("c2", "refund", {"order_id": "2"}),) == checkpoint.pending_tool_calls
    assert first.checkpoint_id not in store
    assert first.run_id == checkpoint.run_id


async def test_usage_and_turns_add_up_across_resumes() -> None:
    usage = runlet.Usage(input_tokens=10, output_tokens=2, requests=1)
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Ok."], usage=usage)
    rt = runtime()
    agent = support_agent(model, Refund())
    first = await interrupt(rt, agent)
    assert usage == first.usage

    result = await resume(rt, agent, first, respond(first, "approve"))

    assert runlet.Usage(input_tokens=20, output_tokens=4, requests=2) == result.usage


async def test_max_turns_count_across_resumes() -> None:
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Ok."])
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore(), max_turns=1)
    agent = support_agent(model, Refund())
    first = await interrupt(rt, agent)

    with pytest.raises(runlet.MaxTurnsExceededError):
        await resume(rt, agent, first, respond(first, "approve"))


async def test_stream_interruption_then_resume_returns_a_plain_result() -> None:
    handler = Refund()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Ok."])
    rt = runtime()
    agent = support_agent(model, handler)
    events: list[runlet.StreamEvent] = []
    async with rt.stream(agent, "Refund order 1.") as stream:
        events.extend([event async for event in stream])
    interrupted = [e for e in events if isinstance(e, runlet.Interrupted)]
    assert 1 == len(interrupted)
    assert isinstance(events[-1], runlet.RunFinished)
    streamed = stream.result
    assert interrupted[0].checkpoint_id == streamed.checkpoint_id
    assert interrupted[0].request == streamed.interruption

    result = await resume(rt, agent, streamed, respond(streamed, "approve"))

    assert ("completed", "Ok.") == (result.status, result.output)
    assert [{"order_id": "1"}] == handler.calls


# --- HumanResponse refusals --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action": "accept"}, "action 'accept' is unknown"),
        # What json.loads gives for a bad request body: refused, not a TypeError.
        ({"action": ["approve"]}, r"action \['approve'\] is unknown"),
        ({"action": {"approve": True}}, r"action \{'approve': True\} is unknown"),
        ({"action": "approve", "edited_arguments": ["x"]}, "must be a mapping"),
        ({"action": "approve", "edited_arguments": "x=1"}, "must be a mapping"),
        ({"action": "select"}, "needs value= a string"),
        ({"action": "select", "value": 3}, "needs value= a string"),
        ({"action": "submit"}, "needs value= a string"),
        ({"action": "approve", "value": "yes"}, "takes no value"),
        ({"action": "reject", "edited_arguments": {"a": 1}}, "only go with action='approve'"),
    ],
    ids=[
        "unknown-action",
        "list-action",
        "dict-action",
        "edited-list",
        "edited-str",
        "select-no-value",
        "select-int",
        "submit-no-value",
        "approve-value",
        "reject-edited",
    ],
)
def test_human_response_refuses_nonsense(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(runlet.HumanResponseError, match=message) as info:
        HumanResponse("req_1", **kwargs)
    assert isinstance(info.value, runlet.RunletError)


def test_human_response_accepts_sensible_answers() -> None:
    assert "approve" == HumanResponse("r", "approve", edited_arguments={"a": 1}).action
    assert "" == HumanResponse("r", "submit", value="").value
    assert HumanResponse("r", "reject").edited_arguments is None


@pytest.mark.parametrize(
    "fields",
    [
        {"action": "approve"},
        {"action": "approve", "edited_arguments": {"order_id": "2"}, "responded_by": "ann"},
        {"action": "reject", "value": "duplicate", "metadata": {"ticket": 7}},
    ],
    ids=["approve", "approve-edited", "reject"],
)
async def test_a_decision_gives_back_the_response_it_recorded(fields: dict[str, Any]) -> None:
    rt, agent, _, _, first = await approval_setup()
    assert first.interruption is not None
    response = HumanResponse(first.interruption.id, **fields)

    [decision] = (await resume(rt, agent, first, response)).decisions

    assert response == decision.as_response()
    assert decision.answers_like(response)
    assert not decision.answers_like(attrs.evolve(response, request_id="req_other"))
    assert attrs.evolve(decision, action="expire").as_response() is None


# --- Nothing lost ------------------------------------------------------------------------


async def approval_setup() -> tuple[Runtime, Agent, Refund, ScriptedModel, runlet.RunResult]:
    handler = Refund()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Ok."])
    rt = runtime()
    agent = support_agent(model, handler)
    first = await interrupt(rt, agent)
    return rt, agent, handler, model, first


async def assert_still_resumable(
    rt: Runtime, agent: Agent, first: runlet.RunResult, handler: Refund
) -> None:
    assert rt.checkpoint_store is not None
    assert first.checkpoint_id is not None
    checkpoint = await rt.checkpoint_store.load(first.checkpoint_id)
    assert first.interruption == checkpoint.request
    result = await resume(rt, agent, first, respond(first, "approve"))
    assert ("completed", "Ok.") == (result.status, result.output)
    assert {"order_id": "1"} == handler.calls[-1]


async def test_wrong_request_id_is_refused_and_the_checkpoint_kept() -> None:
    rt, agent, handler, _, first = await approval_setup()
    assert first.interruption is not None

    with pytest.raises(runlet.HumanResponseError, match="is waiting on request") as info:
        await resume(rt, agent, first, HumanResponse("req_other", "approve"))
    assert first.interruption.id in str(info.value)
    assert [] == handler.calls
    await assert_still_resumable(rt, agent, first, handler)


@pytest.mark.parametrize(
    ("action", "value"), [("select", "x"), ("submit", "text")], ids=["select", "submit"]
)
async def test_action_that_does_not_fit_an_approval_is_refused(action: str, value: str) -> None:
    rt, agent, handler, _, first = await approval_setup()

    with pytest.raises(runlet.HumanResponseError, match="does not answer a 'approval' request"):
        await resume(rt, agent, first, respond(first, action, value=value))
    assert [] == handler.calls
    await assert_still_resumable(rt, agent, first, handler)


@pytest.mark.parametrize(
    ("arguments", "response"),
    [
        ({"kind": "choice", "prompt": "?", "options": PLANS}, {"action": "approve"}),
        ({"kind": "choice", "prompt": "?", "options": PLANS}, {"action": "submit", "value": "pro"}),
        ({"kind": "input", "prompt": "?"}, {"action": "reject"}),
        ({"kind": "input", "prompt": "?"}, {"action": "select", "value": "x"}),
    ],
    ids=["choice-approve", "choice-submit", "input-reject", "input-select"],
)
async def test_action_that_does_not_fit_an_ask_human_kind_is_refused(
    arguments: dict[str, Any], response: dict[str, Any]
) -> None:
    model = ScriptedModel([call("ask_human", arguments, id="c"), "Ok."])
    rt = runtime()
    agent = planner(model)
    first = await interrupt(rt, agent, "Help.")

    with pytest.raises(runlet.HumanResponseError, match="does not answer a"):
        await resume(rt, agent, first, respond(first, **response))

    good = ("select", "pro") if arguments["kind"] == "choice" else ("submit", "x")
    result = await resume(rt, agent, first, respond(first, good[0], value=good[1]))
    assert "completed" == result.status


async def test_resume_refuses_something_that_is_not_a_human_response() -> None:
    rt, agent, handler, _, first = await approval_setup()
    assert first.checkpoint_id is not None

    with pytest.raises(runlet.HumanResponseError, match="needs a HumanResponse, got str"):
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response="approve")  # type: ignore[call-overload]
    await assert_still_resumable(rt, agent, first, handler)


async def test_resume_accepts_an_applications_own_kind_of_human_response() -> None:
    @attrs.frozen
    class Answer(HumanResponse):
        ticket_url: str = attrs.field(default="", kw_only=True)

    rt, agent, handler, _, first = await approval_setup()
    assert first.interruption is not None

    result = await resume(rt, agent, first, Answer(first.interruption.id, "approve"))

    assert ("completed", [{"order_id": "1"}]) == (result.status, handler.calls)


async def test_edited_arguments_that_are_not_json_are_refused() -> None:
    rt, agent, handler, _, first = await approval_setup()

    with pytest.raises(runlet.HumanResponseError, match="edited_arguments do not fit"):
        await resume(
            rt, agent, first, respond(first, "approve", edited_arguments={"order_id": {1}})
        )
    await assert_still_resumable(rt, agent, first, handler)


async def test_unknown_checkpoint_id_is_a_clear_error() -> None:
    rt, agent, handler, _, first = await approval_setup()

    with pytest.raises(runlet.CheckpointNotFoundError, match="No checkpoint 'cp_missing'") as info:
        await rt.resume(agent, checkpoint_id="cp_missing", response=respond(first, "approve"))
    assert "cp_missing" == info.value.checkpoint_id
    assert isinstance(info.value, runlet.ResumeError)
    await assert_still_resumable(rt, agent, first, handler)


async def test_agent_lacking_a_pending_calls_tool_is_a_clear_error() -> None:
    handler = Refund()
    calls = [
        call("refund", id="c1", order_id="1"),
        call("ask_human", id="c2", kind="input", prompt="?"),
    ]
    model = ScriptedModel([calls, "Ok."])
    rt = runtime()
    agent = support_agent(model, handler, ask_human())
    first = await interrupt(rt, agent)

    without_refund = Agent("support", "Ask before refunds.", model, (ask_human(),))
    with pytest.raises(runlet.MissingToolError, match="no such tool") as info:
        await resume(rt, without_refund, first, respond(first, "approve"))
    assert ("refund", first.checkpoint_id) == (info.value.tool_name, info.value.checkpoint_id)

    # The tool of a later pending call is needed too, and checked before anything runs.
    without_ask = support_agent(model, handler)
    with pytest.raises(runlet.MissingToolError) as info:
        await resume(rt, without_ask, first, respond(first, "approve"))
    assert "ask_human" == info.value.tool_name
    assert [] == handler.calls

    second = await resume(rt, agent, first, respond(first, "approve"))
    result = await resume(rt, agent, second, respond(second, "submit", value="because"))
    assert "completed" == result.status


async def test_agent_with_another_name_is_refused() -> None:
    rt, agent, handler, model, first = await approval_setup()
    other = Agent("billing", "Other.", model, agent.tools)

    with pytest.raises(runlet.MissingToolError, match="belongs to agent 'support'") as info:
        await resume(rt, other, first, respond(first, "approve"))
    assert info.value.tool_name is None
    await assert_still_resumable(rt, agent, first, handler)


async def test_resume_with_something_that_is_not_an_agent_is_refused() -> None:
    rt, agent, handler, _, first = await approval_setup()
    assert first.checkpoint_id is not None

    not_an_agent: Any = object()

    with pytest.raises(runlet.ConfigurationError, match="Expected an Agent"):
        await rt.resume(
            not_an_agent, checkpoint_id=first.checkpoint_id, response=respond(first, "approve")
        )
    await assert_still_resumable(rt, agent, first, handler)


async def test_model_error_after_resume_keeps_the_checkpoint() -> None:
    def fail(request: ModelRequest) -> str:
        raise ValueError("provider is down")

    handler = Refund()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), fail, "Ok."])
    rt = runtime()
    agent = support_agent(model, handler)
    first = await interrupt(rt, agent)

    with pytest.raises(runlet.ModelError, match="ValueError: provider is down") as info:
        await resume(rt, agent, first, respond(first, "approve"))
    assert isinstance(info.value.__cause__, ValueError)

    await assert_still_resumable(rt, agent, first, handler)
    # Exactly once: the retry found the recorded result and did not run the call again.
    assert [{"order_id": "1"}] == handler.calls
    [request] = model.requests[2:]
    assert "Refunded order 1." == request.messages[-1].content


async def test_cancelled_resume_propagates_and_keeps_the_checkpoint() -> None:
    rt, agent, handler, _, first = await approval_setup()
    handler.started, handler.release = anyio.Event(), anyio.Event()
    scope = anyio.CancelScope()
    seen: list[str] = []

    async def attempt() -> None:
        with scope:
            try:
                await resume(rt, agent, first, respond(first, "approve"))
            except anyio.get_cancelled_exc_class():
                seen.append("cancelled")
                raise
            seen.append("returned")

    async with anyio.create_task_group() as group:
        group.start_soon(attempt)
        await handler.started.wait()
        scope.cancel()

    assert scope.cancelled_caught
    assert ["cancelled"] == seen
    handler.started = handler.release = None
    # The handler was cut off, so nobody knows whether the refund happened: the retry
    # asks a person again instead of running it a second time on its own.
    again = await resume(rt, agent, first, respond(first, "approve"))
    assert again.interruption is not None
    assert again.interruption.outcome_unknown
    assert again.interruption.prompt.startswith(runlet.OUTCOME_UNKNOWN_PROMPT)
    assert 1 == len(handler.calls)
    assert again.checkpoint_id is not None
    done = await rt.resume(
        agent,
        checkpoint_id=again.checkpoint_id,
        response=HumanResponse(again.interruption.id, "approve"),
    )
    assert ("completed", "Ok.") == (done.status, done.output)
    assert 2 == len(handler.calls)


async def test_no_store_is_a_clear_error_before_any_handler_runs() -> None:
    looked_up: list[str] = []

    async def lookup(arguments: Mapping[str, Any], context: ToolContext) -> str:
        looked_up.append(arguments["order_id"])
        return "found"

    handler = Refund()
    calls = [call("lookup", id="c1", order_id="1"), call("refund", id="c2", order_id="1")]
    agent = support_agent(
        ScriptedModel([calls]), handler, ToolSpec("lookup", "Look up.", ORDER_SCHEMA, lookup)
    )

    with pytest.raises(runlet.CheckpointStoreRequiredError, match="no checkpoint store") as info:
        await Runtime().run(agent, "Refund order 1.")
    assert isinstance(info.value, runlet.ConfigurationError)
    assert [] == looked_up
    assert [] == handler.calls


@pytest.mark.parametrize(
    "arguments",
    [{"kind": "input", "prompt": "?"}, {"kind": "choice", "prompt": "?", "options": PLANS}],
    ids=["input", "choice"],
)
async def test_ask_human_without_a_store_is_a_clear_error(arguments: dict[str, Any]) -> None:
    model = ScriptedModel([call("ask_human", arguments, id="c")])
    with pytest.raises(runlet.CheckpointStoreRequiredError, match="'ask_human' needs a person"):
        await Runtime().run(planner(model), "Help.")


async def test_resume_without_a_store_is_a_clear_error() -> None:
    _, agent, _, _, first = await approval_setup()

    with pytest.raises(runlet.CheckpointStoreRequiredError, match="has none"):
        await resume(Runtime(), agent, first, respond(first, "approve"))


async def test_the_ask_human_handler_is_never_meant_to_run() -> None:
    context = ToolContext("run_1", "call_1", "planner", {}, "ask_human")
    with pytest.raises(runlet.RunletError, match="answered by the runtime"):
        await ask_human().handler({"kind": "input", "prompt": "?"}, context)


@pytest.mark.parametrize("request_id", ["", None, 5])
def test_human_response_needs_the_id_of_a_request(request_id: Any) -> None:
    with pytest.raises(runlet.HumanResponseError, match="request_id must be the id"):
        HumanResponse(request_id, "approve")


# -- the typed shortcuts of HumanResponse ---------------------------------------------------


def test_each_shortcut_builds_the_response_of_its_action() -> None:
    edited = {"order_id": "124"}
    meta = {"ticket": 7}
    assert HumanResponse.approve("r", edited, responded_by="ops", metadata=meta) == (
        HumanResponse("r", "approve", None, edited, responded_by="ops", metadata=meta)
    )
    assert HumanResponse.approve("r") == HumanResponse("r", "approve")
    assert HumanResponse.reject("r", "No.", responded_by="ops") == HumanResponse(
        "r", "reject", "No.", responded_by="ops"
    )
    assert HumanResponse.reject("r") == HumanResponse("r", "reject")
    assert HumanResponse.select("r", "pro", metadata=meta) == HumanResponse(
        "r", "select", "pro", metadata=meta
    )
    assert HumanResponse.submit("r", "Hi") == HumanResponse("r", "submit", "Hi")
    with pytest.raises(runlet.HumanResponseError, match="needs value= a string"):
        HumanResponse.submit("r", None)  # type: ignore[arg-type]


async def test_resumes_with_the_shortcuts() -> None:
    handler = Refund()
    model = ScriptedModel(
        [
            call("refund", id="call_r", order_id="123"),
            call("ask_human", id="call_c", kind="choice", prompt="Plan?", options=PLANS),
            call("ask_human", id="call_i", kind="input", prompt="Name?"),
            call("refund", id="call_x", order_id="9"),
            "Done.",
        ]
    )
    rt = runtime()
    agent = Agent("support", "Help.", model, (refund_tool(handler), ask_human()))
    result = await interrupt(rt, agent)
    for build in (
        lambda rid: HumanResponse.approve(rid, {"order_id": "124"}),
        lambda rid: HumanResponse.select(rid, "pro"),
        lambda rid: HumanResponse.submit(rid, "Zoë"),
        lambda rid: HumanResponse.reject(rid, "Not this one."),
    ):
        assert result.interruption is not None
        result = await resume(rt, agent, result, build(result.interruption.id))
    assert "Done." == result.output
    assert [{"order_id": "124"}] == handler.calls
    assert [
        ("approve", None),
        ("select", "pro"),
        ("submit", "Zoë"),
        ("reject", "Not this one."),
    ] == [(d.action, d.value) for d in result.decisions]


@pytest.mark.parametrize(
    "build",
    [
        lambda **kw: (HumanResponse.approve("r", **kw), HumanResponse("r", "approve", **kw)),
        lambda **kw: (HumanResponse.reject("r", **kw), HumanResponse("r", "reject", **kw)),
        lambda **kw: (
            HumanResponse.select("r", "pro", **kw),
            HumanResponse("r", "select", "pro", **kw),
        ),
        lambda **kw: (
            HumanResponse.submit("r", "Hi", **kw),
            HumanResponse("r", "submit", "Hi", **kw),
        ),
    ],
    ids=["approve", "reject", "select", "submit"],
)
def test_each_shortcut_keeps_who_answered_and_the_metadata(build: Any) -> None:
    shortcut, direct = build(responded_by="ops", metadata={"ticket": 7})
    assert shortcut == direct
    assert (shortcut.responded_by, shortcut.metadata) == ("ops", {"ticket": 7})
