"""Values crossing process and framework boundaries (outside review C): what a handler, a
model adapter or an application hands to ``pickle`` (process pools, ``anyio.to_process``,
task queues), ``copy.deepcopy``, ``json.dumps``, ``hash`` and the JSON converter."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Mapping
from typing import Any

import pytest

import runlet
from runlet import (
    Agent,
    HumanResponse,
    HumanResponseConflictError,
    InMemoryCheckpointStore,
    Message,
    ModelRequest,
    ModelResponse,
    RunResult,
    Runtime,
    ToolContext,
    ToolSpec,
    ask_human,
    structure,
    unstructure,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"amount": {}}}


async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
    """A module-level handler, so that a ToolSpec holding it can be pickled by reference."""
    return "paid"


class PlainModel:
    """A module-level model that pickles."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(Message.assistant("Done."))


def _copies(value: Any) -> list[Any]:
    return [
        pickle.loads(pickle.dumps(value, protocol=2)),
        pickle.loads(pickle.dumps(value, protocol=5)),
        copy.deepcopy(value),
    ]


async def test_a_handlers_context_pickles_deep_copies_and_dumps_as_json() -> None:
    # A handler hands its context (the idempotency key, the run's metadata) to a process
    # pool, a task queue or a JSON API; ToolContext.metadata is a mappingproxy today, which
    # none of pickle, deepcopy and json.dumps accept.
    seen: list[ToolContext] = []

    async def remember(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(context)
        return "ok"

    tool = ToolSpec("remember", "Remember.", {"type": "object"}, remember)
    agent = Agent("a", "Go.", ScriptedModel([call("remember"), "Done."]), (tool,))
    await Runtime().run(agent, "Go.", metadata={"tenant": "acme", "user": {"id": 7}})
    [context] = seen
    for again in _copies(context):
        assert again == context
        assert again.idempotency_key == context.idempotency_key
    assert json.loads(json.dumps(context.metadata)) == {"tenant": "acme", "user": {"id": 7}}
    with pytest.raises(TypeError):  # still read-only, as documented
        context.metadata["tenant"] = "other"  # type: ignore[index]


async def test_a_model_request_with_options_pickles_and_deep_copies() -> None:
    # A custom adapter that sends the request to a worker process, or a test that keeps
    # deep copies of ScriptedModel.requests.
    model = ScriptedModel(["Done."])
    await Runtime().run(Agent("a", "Go.", model), "Go.", options={"temperature": 0.2})
    [request] = model.requests
    for again in _copies(request):
        assert again == request
    assert json.loads(json.dumps(request.options)) == {"temperature": 0.2}


def test_a_tool_spec_and_an_agent_pickle_and_deep_copy() -> None:
    # Module-level handler and model: nothing unpicklable but the compiled schema
    # validator, which is Runlet's own cache and can be rebuilt from input_schema.
    tool = ToolSpec("pay", "Pay.", _SCHEMA, pay, requires_approval=True)
    agent = Agent("a", "Pay.", PlainModel(), (tool, ask_human()))
    for again in _copies(agent):
        assert (again.name, again.tools) == (agent.name, agent.tools)
        copied = again.tool("pay")
        assert copied is not None
        assert copied._check_arguments({"amount": 1}) is None
        assert copied._check_arguments([]) is not None  # the schema still applies


async def _approved(runtime: Runtime, response: Any) -> str:
    tool = ToolSpec("pay", "Pay.", _SCHEMA, pay, requires_approval=True)
    agent = Agent("a", "Pay.", ScriptedModel([call("pay", amount=5), "Done."]), (tool,))
    first = await runtime.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    assert first.interruption is not None
    request_id = first.interruption.id
    await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=response(request_id))
    return first.checkpoint_id


@pytest.mark.parametrize(
    ("accepted", "repeated"),
    [({"amount": 1}, {"amount": True}), ({"amount": 0}, {"amount": False})],
    ids=["1-then-True", "0-then-False"],
)
@pytest.mark.parametrize("field", ["edited_arguments", "metadata"])
async def test_a_repeat_whose_values_differ_in_json_type_is_a_conflict(
    accepted: dict[str, Any], repeated: dict[str, Any], field: str
) -> None:
    # "A different response raises HumanResponseConflictError"; Runlet itself holds that
    # True is not 1 for what a person approves (same_json), but Decision.answers_like
    # compares with ==, so the repeat returns the stored result instead.
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())

    def response(values: dict[str, Any]) -> Any:
        if field == "edited_arguments":
            return lambda request_id: HumanResponse.approve(request_id, values)
        return lambda request_id: HumanResponse.approve(request_id, metadata=values)

    checkpoint_id = await _approved(runtime, response(accepted))
    tool = ToolSpec("pay", "Pay.", _SCHEMA, pay, requires_approval=True)
    agent = Agent("a", "Pay.", ScriptedModel([]), (tool,))
    stored = await runtime.checkpoint_store.get(checkpoint_id)  # type: ignore[union-attr]
    request_id = stored.checkpoint.request.id
    with pytest.raises(HumanResponseConflictError):
        await runtime.resume(
            agent, checkpoint_id=checkpoint_id, response=response(repeated)(request_id)
        )


async def test_frozen_data_is_hashable_and_equal_values_hash_alike() -> None:
    # Frozen attrs classes get a __hash__ (isinstance(x, Hashable) is True); mappings
    # (arguments, metadata, options, schemas) are left out of it, so hash() works for
    # every value a run, a store or a handler hands out, and stays consistent with ==.
    seen: list[ToolContext] = []

    async def paying(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(context)
        return "paid"

    tool = ToolSpec("pay", "Pay.", _SCHEMA, paying, requires_approval=True)
    model = ScriptedModel([call("pay", amount=5), "Done."])
    agent = Agent("a", "Pay.", model, (tool,))
    store = InMemoryCheckpointStore()
    runtime = Runtime(checkpoint_store=store)
    result = await runtime.run(agent, "Pay.", options={"t": 1}, metadata={"user": "u"})
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    checkpoint = await store.load(result.checkpoint_id)
    [pending] = await store.list_pending()
    response = HumanResponse.approve(
        result.interruption.id, {"amount": 6}, responded_by="ann", metadata={"ip": "x"}
    )
    done = await runtime.resume(agent, checkpoint_id=result.checkpoint_id, response=response)
    stored = await store.get(result.checkpoint_id)
    assert stored.resolution is not None
    values = [
        result.interruption.tool_call,
        result.interruption,
        result.transcript[-1],
        result,
        checkpoint,
        pending,
        response,
        done.decisions[0],
        done,
        stored.records[0],
        stored.resolution,
        stored,
        model.requests[0],
        seen[0],
        tool.definition,
        tool,
    ]
    for value in values:
        again = copy.deepcopy(value)
        assert again == value, type(value).__name__
        assert hash(again) == hash(value), type(value).__name__
        assert value in {again}, type(value).__name__


def test_the_built_in_ask_human_schema_is_not_shared_between_tools() -> None:
    # A custom adapter that prepares schemas for a strict-mode API in place (adding
    # "additionalProperties": false) changes the module-level schema every later
    # ask_human() and every other agent gets.
    schema = ask_human().definition.input_schema
    added = False
    try:
        schema["additionalProperties"] = False  # type: ignore[index]
        added = True
    except TypeError:  # read-only: also a fix
        pass
    try:
        assert "additionalProperties" not in ask_human().input_schema
    finally:
        if added:
            del schema["additionalProperties"]  # type: ignore[attr-defined]


async def test_a_run_result_with_array_arguments_survives_a_json_round_trip() -> None:
    # structure() turns unstructure()'s data "back, equal to the original" even after a
    # JSON round trip; a model's tuple argument comes back as a list, so the RunResult
    # (and a repeated resume's stored RunResult, from a JSON store) is not equal.
    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = Agent("a", "Pay.", ScriptedModel([call("pay", items=(1, 2))]), (tool,))
    result = await Runtime(checkpoint_store=InMemoryCheckpointStore()).run(agent, "Pay.")
    assert structure(json.loads(json.dumps(unstructure(result))), RunResult) == result


# What held (guards): every error pickles with protocols 2 and 5 too, not only the default.


@pytest.mark.parametrize("protocol", [2, 5])
def test_errors_pickle_with_every_protocol(protocol: int) -> None:
    errors = [
        runlet.HumanResponseConflictError(
            "c", checkpoint_id="cp", request_id="r", next_checkpoint_id="n"
        ),
        runlet.ResultNotRecordedError(
            "r", checkpoint_id="cp", tool_call_id="c1", result=runlet.ToolResult("c1", "ok")
        ),
        runlet.ModelAPIError("api", status_code=500, body="b", api_request_id="id"),
    ]
    for error in errors:
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note("seen in worker 3")
        again = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert (type(again), str(again), vars(again)) == (type(error), str(error), vars(error))
