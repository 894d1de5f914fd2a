"""Pydantic AI's side of the peer comparison.

The scripted model is a ``FunctionModel``, the test double Pydantic AI's testing docs
recommend when a test needs to decide what the model says: a function receives the
conversation and returns a ``ModelResponse``. Tools are plain async functions registered
with ``@agent.tool_plain``; their arguments are validated by the schema Pydantic AI builds
from the signature. The approval-gated tool is ``requires_approval=True``: the run ends
with ``DeferredToolRequests`` as its output, the message history goes to JSON, and a new
run continues it with ``DeferredToolResults(approvals=...)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.common import (
    FINAL,
    INSTRUCTIONS,
    PROMPT,
    W1_PLAN,
    W2_CALLS,
    W2_SLEEP,
    W3_PLAN,
    W4_PLAN,
    W4_SLEEP,
    Workloads,
    main,
)


def build() -> Workloads:
    import anyio
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def scripted(plan: list[str], calls: int = 1) -> FunctionModel:
        async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            turn = sum(isinstance(m, ModelResponse) for m in messages)
            if turn < len(plan):
                return ModelResponse(
                    parts=[
                        ToolCallPart(plan[turn], {"a": turn, "b": k + 1}, f"call_{turn}_{k}")
                        for k in range(calls)
                    ]
                )
            return ModelResponse(parts=[TextPart(FINAL)])

        return FunctionModel(respond)

    def agent(plan: list[str], sleep: float = 0.0, calls: int = 1) -> Agent[None, object]:
        new: Agent[None, object] = Agent(
            scripted(plan, calls),
            instructions=INSTRUCTIONS,
            output_type=[str, DeferredToolRequests],
        )

        @new.tool_plain
        async def add(a: int | float, b: int | float) -> int | float:
            """Add two numbers."""
            if sleep:
                await anyio.sleep(sleep)
            return a + b

        @new.tool_plain(requires_approval=True)
        async def approve_add(a: int | float, b: int | float) -> int | float:
            """Add, once a person allows it."""
            return a + b

        return new

    def tool_results(messages: list[ModelMessage]) -> list[str]:
        return [
            part.model_response_str()
            for message in messages
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]

    w1_agent = agent(W1_PLAN)
    w2_agent = agent(["add"], W2_SLEEP, W2_CALLS)
    w3_agent = agent(W3_PLAN)
    w4_agent = agent(W4_PLAN, W4_SLEEP)

    async def w1_run() -> tuple[str, list[str]]:
        result = await w1_agent.run(PROMPT)
        return str(result.output), tool_results(result.all_messages())

    async def w2_run() -> tuple[str, list[str]]:
        result = await w2_agent.run(PROMPT)
        return str(result.output), tool_results(result.all_messages())

    async def w3_trip() -> tuple[str, list[str], str]:
        interrupted = await w3_agent.run(PROMPT)
        requests = interrupted.output
        assert isinstance(requests, DeferredToolRequests)
        assert [call.tool_name for call in requests.approvals] == ["approve_add"]
        # The state to keep is the message history (Pydantic AI's documented way to
        # continue a run later); the pending call is its last ModelResponse.
        text = interrupted.all_messages_json().decode()
        history = ModelMessagesTypeAdapter.validate_json(text)
        last = history[-1]
        assert isinstance(last, ModelResponse)
        approvals: dict[str, bool] = {call.tool_call_id: True for call in last.tool_calls}
        result = await w3_agent.run(
            message_history=history,
            deferred_tool_results=DeferredToolResults(approvals=approvals),
        )
        return str(result.output), tool_results(result.new_messages()), text

    async def w4_run() -> str:
        return str((await w4_agent.run(PROMPT)).output)

    return Workloads(
        framework="Pydantic AI",
        packages=["pydantic-ai-slim", "pydantic", "pydantic-core"],
        w1_run=w1_run,
        w2_run=w2_run,
        w3_trip=w3_trip,
        w4_run=w4_run,
        notes=[
            "Scripted model: FunctionModel with an async function building a ModelResponse "
            "per turn; tools registered with @agent.tool_plain, arguments validated by "
            "Pydantic from the signature (a: int | float, b: int | float).",
            "W3: requires_approval=True; the run ends with DeferredToolRequests; "
            "all_messages_json() -> ModelMessagesTypeAdapter.validate_json(), then a new "
            "run with DeferredToolResults(approvals={id: True}). The checkpoint is the "
            "message history; there is no store object to empty.",
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main(build))
