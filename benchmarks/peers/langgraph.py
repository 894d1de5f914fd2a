"""LangGraph's side of the peer comparison.

The graph is the tool-calling agent LangGraph's docs build by hand: a ``StateGraph`` over
``MessagesState`` with an ``agent`` node that calls the chat model, a prebuilt
``ToolNode`` and ``tools_condition`` between them. The scripted model is a small
``BaseChatModel`` subclass (LangChain's docs recommend a fake or custom chat model for
tests; the bundled ``GenericFakeChatModel`` cannot bind tools). Tools are ``@tool`` async
functions. The approval-gated tool calls ``interrupt()``; the run resumes with
``Command(resume=...)`` on the same thread. Checkpoints live in an ``InMemorySaver``.

Moving a paused run to another process: LangGraph's checkpointers store what their
serializer (``JsonPlusSerializer``, msgpack) writes, so the checkpoint, its metadata and
its pending writes (the interrupt) are serialized with the saver's own serializer, carried
in a JSON document as base64, and put back into the saver before resuming.
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

# LangGraph stops a run after 25 super-steps by default; W1 takes 21.
RECURSION_LIMIT = 100


def build() -> Workloads:
    import base64
    import json
    import uuid

    import anyio
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command, interrupt

    class ScriptedChatModel(BaseChatModel):
        """Turn *i* calls ``plan[i]`` *calls* times; then the final answer."""

        plan: list[str]
        calls: int = 1

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self  # the script already knows which tools exist

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: Any = None,
            run_manager: Any = None,
            **kwargs: Any,
        ) -> ChatResult:
            turn = sum(isinstance(m, ToolMessage) for m in messages) // self.calls
            if turn < len(self.plan):
                message = AIMessage(
                    content="",
                    tool_calls=[
                        {
                            "name": self.plan[turn],
                            "args": {"a": turn, "b": k + 1},
                            "id": f"call_{turn}_{k}",
                            "type": "tool_call",
                        }
                        for k in range(self.calls)
                    ],
                )
            else:
                message = AIMessage(content=FINAL)
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _agenerate(
            self,
            messages: list[BaseMessage],
            stop: Any = None,
            run_manager: Any = None,
            **kwargs: Any,
        ) -> ChatResult:
            return self._generate(messages, stop, **kwargs)

    def graph(plan: list[str], sleep: float = 0.0, calls: int = 1, checkpointer: Any = None) -> Any:
        @tool
        async def add(a: int | float, b: int | float) -> int | float:
            """Add two numbers."""
            if sleep:
                await anyio.sleep(sleep)
            return a + b

        @tool
        async def approve_add(a: int | float, b: int | float) -> int | float | str:
            """Add, once a person allows it."""
            decision = interrupt({"tool": "approve_add", "args": {"a": a, "b": b}})
            if decision != "approve":
                return "A person rejected this call."
            return a + b

        tools = [add, approve_add]
        model = ScriptedChatModel(plan=plan, calls=calls).bind_tools(tools)

        async def agent(state: MessagesState) -> dict[str, Any]:
            reply = await model.ainvoke([SystemMessage(INSTRUCTIONS), *state["messages"]])
            return {"messages": [reply]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", ToolNode(tools))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        return builder.compile(checkpointer=checkpointer)

    def outcome(state: dict[str, Any]) -> tuple[str, list[str]]:
        messages = state["messages"]
        return str(messages[-1].content), [
            str(m.content) for m in messages if isinstance(m, ToolMessage)
        ]

    config: dict[str, Any] = {"recursion_limit": RECURSION_LIMIT}
    w1_graph = graph(W1_PLAN)
    w2_graph = graph(["add"], W2_SLEEP, W2_CALLS)
    saver = InMemorySaver()
    w3_graph = graph(W3_PLAN, checkpointer=saver)
    w4_graph = graph(W4_PLAN, W4_SLEEP)

    def pack(value: Any) -> list[str]:
        kind, data = saver.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode()]

    def unpack(packed: list[str]) -> Any:
        return saver.serde.loads_typed((packed[0], base64.b64decode(packed[1])))

    async def w1_run() -> tuple[str, list[str]]:
        return outcome(await w1_graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config))

    async def w2_run() -> tuple[str, list[str]]:
        return outcome(await w2_graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config))

    async def w3_trip() -> tuple[str, list[str], str]:
        thread = {"thread_id": uuid.uuid4().hex, "checkpoint_ns": ""}
        run_config = {**config, "configurable": thread}
        paused = await w3_graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, run_config)
        assert [i.value["tool"] for i in paused["__interrupt__"]] == ["approve_add"]
        saved = await saver.aget_tuple(run_config)
        assert saved is not None
        text = json.dumps(
            {
                "checkpoint": pack(saved.checkpoint),
                "metadata": pack(saved.metadata),
                "writes": [
                    [task, channel, pack(value)]
                    for task, channel, value in saved.pending_writes or ()
                ],
            }
        )
        saver.delete_thread(thread["thread_id"])
        # Another process: put the checkpoint back into its saver and resume the thread.
        document = json.loads(text)
        checkpoint = unpack(document["checkpoint"])
        await saver.aput(
            {"configurable": thread},
            checkpoint,
            unpack(document["metadata"]),
            checkpoint["channel_versions"],
        )
        at = {"configurable": {**thread, "checkpoint_id": checkpoint["id"]}}
        for task, channel, value in document["writes"]:
            await saver.aput_writes(at, [(channel, unpack(value))], task)
        result = await w3_graph.ainvoke(Command(resume="approve"), run_config)
        saver.delete_thread(thread["thread_id"])
        return (*outcome(result), text)

    async def w4_run() -> str:
        state = await w4_graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config)
        return str(state["messages"][-1].content)

    return Workloads(
        framework="LangGraph",
        packages=["langgraph", "langgraph-checkpoint", "langgraph-prebuilt", "langchain-core"],
        w1_run=w1_run,
        w2_run=w2_run,
        w3_trip=w3_trip,
        w4_run=w4_run,
        notes=[
            "Graph: StateGraph(MessagesState) with an agent node, ToolNode and "
            "tools_condition; scripted model: a BaseChatModel subclass; @tool functions.",
            "W3: interrupt() inside the tool, InMemorySaver, Command(resume='approve'). The "
            "checkpoint, metadata and pending writes go through the saver's serializer "
            "(msgpack) and travel in JSON as base64, which adds about a third to the size.",
            "On resume LangGraph runs the tools node again from the start (the interrupt "
            "replays), as its docs describe.",
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main(build))
