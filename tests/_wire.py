"""The documented wire formats, as the test server checks them and answers with them.

The checkers return a list of problems with a request (empty when it is well-formed).
The builders make answers shaped like the ones the APIs document.
"""

from __future__ import annotations

import json
from typing import Any

from _http_server import Seen, sse

# -- OpenAI Chat Completions ----------------------------------------------------------------

OPENAI_BODY_KEYS = {
    "model",
    "messages",
    "tools",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "reasoning_effort",
    "logit_bias",
    "service_tier",
    "user",
}


def check_openai(seen: Seen) -> list[str]:
    """Problems with a Chat Completions request."""
    problems: list[str] = []
    if seen.method != "POST" or seen.path != "/v1/chat/completions":
        problems.append(f"unexpected {seen.method} {seen.path}")
    if seen.headers.get("content-type") != "application/json":
        problems.append("content-type is not application/json")
    auth = seen.headers.get("authorization")
    if auth is not None and not auth.startswith("Bearer "):
        problems.append("authorization is not a Bearer token")
    body = seen.body
    if not isinstance(body, dict):
        return [*problems, "body is not a JSON object"]
    problems += [f"unknown body key {key!r}" for key in body if key not in OPENAI_BODY_KEYS]
    if not isinstance(body.get("model"), str):
        problems.append("model is missing")
    if "stream" in body and not isinstance(body["stream"], bool):
        problems.append("stream is not a bool")
    if "stream_options" in body and body.get("stream") is not True:
        problems.append("stream_options without stream")
    for tool in body.get("tools", []):
        function = tool.get("function", {})
        if tool.get("type") != "function" or not isinstance(function.get("name"), str):
            problems.append(f"bad tool {tool!r}")
        if not isinstance(function.get("parameters"), dict):
            problems.append(f"tool parameters not an object: {tool!r}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages is not a non-empty list"]
    open_calls: set[str] = set()
    for message in messages:
        problems += _check_openai_message(message, open_calls)
    return problems


def _check_openai_message(message: Any, open_calls: set[str]) -> list[str]:
    role = message.get("role")
    if role in ("system", "user"):
        ok = isinstance(message.get("content"), str) and set(message) == {"role", "content"}
        return [] if ok else [f"bad {role} message {message!r}"]
    if role == "assistant":
        # DeepSeek's reasoning_content goes back with the turns that made tool calls.
        allowed = {"role", "content", "tool_calls"}
        if message.get("tool_calls"):
            allowed.add("reasoning_content")
        problems = [
            f"assistant message key {key!r} is not part of a Chat Completions request"
            for key in message
            if key not in allowed
        ]
        if "reasoning_content" in message and not isinstance(message["reasoning_content"], str):
            problems.append("reasoning_content is not a string")
        if not isinstance(message.get("content"), (str, type(None))):
            problems.append("assistant content is not a string or null")
        for call in message.get("tool_calls", []):
            function = call.get("function", {})
            if call.get("type") != "function" or not isinstance(call.get("id"), str):
                problems.append(f"bad tool call {call!r}")
                continue
            # Gemini's thought signature goes back on the call it came with.
            extra = call.get("extra_content", {"google": {"thought_signature": "-"}})
            if set(call) - {"id", "type", "function", "extra_content"} or not (
                isinstance(extra, dict)
                and set(extra) == {"google"}
                and isinstance(extra["google"], dict)
                and set(extra["google"]) == {"thought_signature"}
                and isinstance(extra["google"]["thought_signature"], str)
            ):
                problems.append(f"tool call with keys it should not have: {call!r}")
            try:
                arguments = json.loads(function.get("arguments"))
            except (TypeError, ValueError):
                arguments = None
            if not isinstance(arguments, dict):
                problems.append(f"tool call arguments are not a JSON object string: {call!r}")
            open_calls.add(call["id"])
        return problems
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id not in open_calls:
            return [f"tool message answers unknown call {call_id!r}"]
        open_calls.discard(call_id)
        return [] if isinstance(message.get("content"), str) else ["tool content is not text"]
    return [f"unknown role {role!r}"]


def openai_completion(
    text: str | None = None,
    calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] | None = (11, 7),
    *,
    cached: int | None = None,
    reasoning: str | None = None,
    reasoning_field: str = "reasoning_content",
) -> dict[str, Any]:
    """A Chat Completions answer; *calls* are ``(id, name, arguments JSON text)``.

    *cached* adds ``usage.prompt_tokens_details.cached_tokens``; *reasoning* puts
    reasoning text in *reasoning_field* (DeepSeek's ``reasoning_content``, or vLLM's
    ``reasoning``)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message[reasoning_field] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    answer: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
    }
    if usage is not None:
        answer["usage"] = _openai_usage(*usage, cached=cached)
    return answer


def _openai_usage(prompt: int, completion: int, *, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
    return usage


def openai_chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    """One ``chat.completion.chunk`` event."""
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "test-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def openai_usage_chunk(prompt: int, completion: int, cached: int | None = None) -> str:
    """The last chunk of a stream asked for ``include_usage``: no choices, just usage."""
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "test-model",
            "choices": [],
            "usage": _openai_usage(prompt, completion, cached=cached),
        }
    )


OPENAI_DONE = sse("[DONE]")


def openai_stream(
    text: str = "",
    calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    piece: int = 3,
    usage: tuple[int, int] = (11, 7),
    *,
    reasoning: str = "",
    reasoning_field: str = "reasoning_content",
) -> tuple[str, ...]:
    """A whole stream: the reasoning, the text and each call's arguments cut into
    *piece*-char chunks."""
    events = [openai_chunk({"role": "assistant", "content": ""})]
    events += [
        openai_chunk({reasoning_field: reasoning[i : i + piece], "content": None})
        for i in range(0, len(reasoning), piece)
    ]
    events += [openai_chunk({"content": text[i : i + piece]}) for i in range(0, len(text), piece)]
    for index, (call_id, name, arguments) in enumerate(calls):
        events.append(
            openai_chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            openai_chunk(
                {
                    "tool_calls": [
                        {"index": index, "function": {"arguments": arguments[i : i + piece]}}
                    ]
                }
            )
            for i in range(0, len(arguments), piece)
        ]
    events.append(openai_chunk({}, "tool_calls" if calls else "stop"))
    events += [openai_usage_chunk(*usage), OPENAI_DONE]
    return tuple(events)


# -- Anthropic Messages -------------------------------------------------------------------

ANTHROPIC_BODY_KEYS = {
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "tool_choice",
    "service_tier",
    "metadata",
    "thinking",
}

_CACHE_TTLS = {"5m", "1h"}


def _check_cache_control(where: str, value: Any) -> list[str]:
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        return [f"{where}: cache_control is not {{'type': 'ephemeral'}}: {value!r}"]
    if set(value) - {"type", "ttl"} or value.get("ttl", "5m") not in _CACHE_TTLS:
        return [f"{where}: bad cache_control {value!r}"]
    return []


def _check_system(system: Any) -> list[str]:
    if isinstance(system, str):
        return []
    if not isinstance(system, list) or not system:
        return ["system is neither a string nor a list of text blocks"]
    problems = []
    for block in system:
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            problems.append(f"bad system block {block!r}")
        if set(block) - {"type", "text", "cache_control"}:
            problems.append(f"unknown keys in system block {block!r}")
        if "cache_control" in block:
            problems += _check_cache_control("system", block["cache_control"])
    return problems


def _check_thinking_option(thinking: Any) -> list[str]:
    if thinking == {"type": "disabled"}:
        return []
    if (
        not isinstance(thinking, dict)
        or thinking.get("type") != "enabled"
        or not isinstance(thinking.get("budget_tokens"), int)
        or thinking["budget_tokens"] < 1024
    ):
        return [f"bad thinking option {thinking!r}"]
    return []


def check_anthropic(seen: Seen) -> list[str]:
    """Problems with a Messages request."""
    problems: list[str] = []
    if seen.method != "POST" or seen.path != "/v1/messages":
        problems.append(f"unexpected {seen.method} {seen.path}")
    if seen.headers.get("content-type") != "application/json":
        problems.append("content-type is not application/json")
    if not seen.headers.get("anthropic-version"):
        problems.append("anthropic-version header is missing")
    if "authorization" in seen.headers:
        problems.append("Anthropic takes x-api-key, not authorization")
    body = seen.body
    if not isinstance(body, dict):
        return [*problems, "body is not a JSON object"]
    problems += [f"unknown body key {key!r}" for key in body if key not in ANTHROPIC_BODY_KEYS]
    if not isinstance(body.get("model"), str):
        problems.append("model is missing")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        problems.append("max_tokens is missing or not a positive int")
    if "system" in body:
        problems += _check_system(body["system"])
    thinking = isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled"
    if "thinking" in body:
        problems += _check_thinking_option(body["thinking"])
    for tool in body.get("tools", []):
        if set(tool) - {"cache_control"} != {"name", "description", "input_schema"}:
            problems.append(f"bad tool {tool!r}")
        if "cache_control" in tool:
            problems += _check_cache_control(f"tool {tool.get('name')!r}", tool["cache_control"])
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages is not a non-empty list"]
    if messages[0].get("role") != "user":
        problems.append("the first message is not a user message")
    previous_calls: set[str] = set()
    for number, message in enumerate(messages):
        role = message.get("role")
        if number and messages[number - 1].get("role") == role:
            problems.append(f"message {number} repeats role {role!r}")
        blocks = message.get("content")
        if not isinstance(blocks, list) or not blocks:
            problems.append(f"message {number} has no content blocks")
            continue
        problems += _check_blocks(role, blocks, previous_calls)
        previous_calls = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    breakpoints = json.dumps(body).count('"cache_control"')
    if breakpoints > 4:
        problems.append(f"{breakpoints} cache_control breakpoints; the API allows 4")
    if thinking:
        problems += _check_thinking_turn(messages)
    return problems


def _check_thinking_turn(messages: list[Any]) -> list[str]:
    """With thinking on, the assistant turn whose tool calls the request answers must
    start with its thinking block, as the API returned it."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return []
    last = messages[-1].get("content") or []
    if not any(block.get("type") == "tool_result" for block in last):
        return []
    first = (messages[-2].get("content") or [{}])[0]
    if first.get("type") not in _THINKING:
        return [
            "thinking is enabled, but the assistant turn with the tool calls does not "
            f"start with a thinking block: {first!r}"
        ]
    return []


_THINKING = {"thinking", "redacted_thinking"}


def _check_blocks(role: str, blocks: list[Any], previous_calls: set[str]) -> list[str]:
    problems = []
    answered = set()
    seen_other = False
    seen_answer = False
    seen_call = False
    for block in blocks:
        kind = block.get("type")
        if "cache_control" in block:
            if kind in _THINKING:
                problems.append("thinking blocks cannot carry cache_control")
            problems += _check_cache_control(f"{kind} block", block["cache_control"])
        if kind in _THINKING and role == "assistant":
            # Interleaved thinking (between tool calls) follows a tool_use block; thinking
            # after the turn's text with no tool call between is out of place.
            if seen_answer and not seen_call:
                problems.append("thinking blocks must come before the text of their turn")
            if kind == "thinking" and not (
                isinstance(block.get("thinking"), str)
                and isinstance(block.get("signature"), str)
                and block["signature"]
                and set(block) == {"type", "thinking", "signature"}
            ):
                problems.append(f"bad thinking block {block!r}")
            if kind == "redacted_thinking" and not (
                isinstance(block.get("data"), str) and set(block) == {"type", "data"}
            ):
                problems.append(f"bad redacted_thinking block {block!r}")
            continue
        seen_answer = True
        if kind == "text":
            if not isinstance(block.get("text"), str) or not block["text"].strip():
                # The API's words: text content blocks must contain non-whitespace text.
                problems.append("empty text block")
            seen_other = True
        elif kind == "tool_use" and role == "assistant":
            seen_call = True
            if not isinstance(block.get("id"), str) or not isinstance(block.get("input"), dict):
                problems.append(f"bad tool_use {block!r}")
        elif kind == "tool_result" and role == "user":
            if seen_other:
                problems.append("tool_result blocks must come first in a user message")
            if block.get("tool_use_id") not in previous_calls:
                problems.append(f"tool_result for unknown tool_use {block.get('tool_use_id')!r}")
            if not isinstance(block.get("content"), str):
                problems.append("tool_result content is not a string")
            if "is_error" in block and not isinstance(block["is_error"], bool):
                problems.append("is_error is not a bool")
            answered.add(block.get("tool_use_id"))
        else:
            problems.append(f"block {kind!r} not allowed in a {role} message")
    if role == "user" and previous_calls and answered != previous_calls:
        problems.append(f"tool_use ids {sorted(previous_calls - answered)} were not answered")
    return problems


def anthropic_usage(usage: tuple[int, int], cache: tuple[int, int] | None = None) -> dict[str, Any]:
    """A ``usage`` object; *cache* is ``(read, written)`` prompt-cache tokens."""
    counts: dict[str, Any] = {"input_tokens": usage[0], "output_tokens": usage[1]}
    if cache is not None:
        counts["cache_read_input_tokens"] = cache[0]
        counts["cache_creation_input_tokens"] = cache[1]
    return counts


def thinking_block(text: str, signature: str) -> dict[str, Any]:
    """A ``thinking`` content block."""
    return {"type": "thinking", "thinking": text, "signature": signature}


def redacted_block(data: str) -> dict[str, Any]:
    """A ``redacted_thinking`` content block."""
    return {"type": "redacted_thinking", "data": data}


def anthropic_message(
    text: str | None = None,
    calls: list[tuple[str, str, Any]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (21, 9),
    *,
    thinking: list[dict[str, Any]] = (),  # type: ignore[assignment]
    cache: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A Messages answer; *calls* are ``(id, name, input)``; *thinking* blocks come
    first; *cache* is ``(read, written)`` prompt-cache tokens."""
    content: list[dict[str, Any]] = list(thinking)
    if text is not None:
        content.append({"type": "text", "text": text})
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": anthropic_usage(usage, cache),
    }


def anthropic_event(data: dict[str, Any]) -> str:
    """One typed event: the ``event:`` name repeats the data's ``type``."""
    return sse(data, data["type"])


def anthropic_stream(
    text: str = "",
    calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    piece: int = 3,
    usage: tuple[int, int] = (21, 9),
    *,
    thinking: list[dict[str, Any]] = (),  # type: ignore[assignment]
    cache: tuple[int, int] | None = None,
) -> tuple[str, ...]:
    """A whole stream; *calls* are ``(id, name, input JSON text)``, cut into pieces.

    *thinking* blocks come first: a ``thinking`` block as ``thinking_delta`` pieces and
    one ``signature_delta``, a ``redacted_thinking`` block whole in its start event."""
    events = [
        anthropic_event(
            {
                "type": "message_start",
                "message": {
                    **anthropic_message(usage=(usage[0], 1), cache=cache),
                    "content": [],
                    "stop_reason": None,
                },
            }
        ),
        anthropic_event({"type": "ping"}),
    ]
    index = 0
    for block in thinking:
        events += _thinking_events(index, block, piece)
        index += 1
    if text:
        events.append(
            anthropic_event(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
        )
        events += [
            anthropic_event(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": text[i : i + piece]},
                }
            )
            for i in range(0, len(text), piece)
        ]
        events.append(anthropic_event({"type": "content_block_stop", "index": index}))
        index += 1
    for offset, (call_id, name, arguments) in enumerate(calls):
        block = index + offset
        events.append(
            anthropic_event(
                {
                    "type": "content_block_start",
                    "index": block,
                    "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
                }
            )
        )
        events += [
            anthropic_event(
                {
                    "type": "content_block_delta",
                    "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": arguments[i : i + piece]},
                }
            )
            for i in range(0, len(arguments), piece)
        ]
        events.append(anthropic_event({"type": "content_block_stop", "index": block}))
    events += [
        anthropic_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if calls else "end_turn"},
                "usage": {"output_tokens": usage[1]},
            }
        ),
        anthropic_event({"type": "message_stop"}),
    ]
    return tuple(events)


def _thinking_events(index: int, block: dict[str, Any], piece: int) -> list[str]:
    if block["type"] == "redacted_thinking":
        start = anthropic_event(
            {"type": "content_block_start", "index": index, "content_block": block}
        )
        return [start, anthropic_event({"type": "content_block_stop", "index": index})]
    text = block["thinking"]
    events = [
        anthropic_event(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            }
        )
    ]
    events += [
        anthropic_event(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "thinking_delta", "thinking": text[i : i + piece]},
            }
        )
        for i in range(0, len(text), piece)
    ]
    events += [
        anthropic_event(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "signature_delta", "signature": block["signature"]},
            }
        ),
        anthropic_event({"type": "content_block_stop", "index": index}),
    ]
    return events
