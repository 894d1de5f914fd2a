"""The OpenAI Agents SDK's side of the peer comparison.

The scripted model is a subclass of the SDK's ``Model`` interface whose ``get_response``
returns canned Responses-API items (function calls, then an output message), the way the
SDK's own docs suggest plugging in a model that is not OpenAI's; no client is created.
Tools are ``@function_tool`` async functions with a strict JSON schema built from the
signature. The approval-gated tool is ``needs_approval=True``: the run stops with
``result.interruptions``, ``result.to_state().to_string()`` gives the JSON, and
``RunState.from_string`` + ``state.approve(...)`` + ``Runner.run(agent, state)`` resume it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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

# The SDK stops a run after 10 model turns by default; W1 needs 11.
MAX_TURNS = 50


def _kind(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def build() -> Workloads:
    import json

    import anyio
    from agents import (
        Agent,
        Model,
        ModelResponse,
        Runner,
        RunResult,
        RunState,
        ToolCallOutputItem,
        Usage,
        function_tool,
        set_tracing_disabled,
    )
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    class ScriptedModel(Model):
        """Turn *i* calls ``plan[i]`` *calls* times; then the final message."""

        def __init__(self, plan: list[str], calls: int = 1) -> None:
            self.plan = plan
            self.calls = calls

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            outputs = (
                0
                if isinstance(input, str)
                else sum(_kind(item) == "function_call_output" for item in input)
            )
            turn = outputs // self.calls
            if turn < len(self.plan):
                name = self.plan[turn]
                output: list[Any] = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id=f"fc_{turn}_{k}",
                        call_id=f"call_{turn}_{k}",
                        name=name,
                        arguments=json.dumps({"a": turn, "b": k + 1}),
                        status="completed",
                    )
                    for k in range(self.calls)
                ]
            else:
                output = [
                    ResponseOutputMessage(
                        type="message",
                        id=f"msg_{turn}",
                        role="assistant",
                        status="completed",
                        content=[
                            ResponseOutputText(type="output_text", text=FINAL, annotations=[])
                        ],
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark never streams")

    def agent(plan: list[str], sleep: float = 0.0, calls: int = 1) -> Agent[Any]:
        @function_tool
        async def add(a: int | float, b: int | float) -> int | float:
            """Add two numbers."""
            if sleep:
                await anyio.sleep(sleep)
            return a + b

        @function_tool(needs_approval=True)
        async def approve_add(a: int | float, b: int | float) -> int | float:
            """Add, once a person allows it."""
            return a + b

        return Agent(
            name="adder",
            instructions=INSTRUCTIONS,
            model=ScriptedModel(plan, calls),
            tools=[add, approve_add],
        )

    def tool_results(result: RunResult) -> list[str]:
        return [
            str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
        ]

    w1_agent = agent(W1_PLAN)
    w2_agent = agent(["add"], W2_SLEEP, W2_CALLS)
    w3_agent = agent(W3_PLAN)
    w4_agent = agent(W4_PLAN, W4_SLEEP)

    async def w1_run() -> tuple[str, list[str]]:
        result = await Runner.run(w1_agent, PROMPT, max_turns=MAX_TURNS)
        return str(result.final_output), tool_results(result)

    async def w2_run() -> tuple[str, list[str]]:
        result = await Runner.run(w2_agent, PROMPT, max_turns=MAX_TURNS)
        return str(result.final_output), tool_results(result)

    async def w3_trip() -> tuple[str, list[str], str]:
        interrupted = await Runner.run(w3_agent, PROMPT, max_turns=MAX_TURNS)
        assert [item.name for item in interrupted.interruptions] == ["approve_add"]
        text = interrupted.to_state().to_string()
        state = await RunState.from_string(w3_agent, text)
        for item in state.get_interruptions():
            state.approve(item)
        result = await Runner.run(w3_agent, state, max_turns=MAX_TURNS)
        return str(result.final_output), tool_results(result), text

    async def w4_run() -> str:
        return str((await Runner.run(w4_agent, PROMPT, max_turns=MAX_TURNS)).final_output)

    return Workloads(
        framework="OpenAI Agents SDK",
        packages=["openai-agents", "openai", "pydantic"],
        w1_run=w1_run,
        w2_run=w2_run,
        w3_trip=w3_trip,
        w4_run=w4_run,
        notes=[
            "Scripted model: a Model subclass whose get_response returns "
            "ResponseFunctionToolCall / ResponseOutputMessage items; tracing disabled "
            "(set_tracing_disabled and OPENAI_AGENTS_DISABLE_TRACING=1).",
            "W3: @function_tool(needs_approval=True); result.to_state().to_string() -> "
            "RunState.from_string() -> state.approve() -> Runner.run(agent, state).",
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main(build))
