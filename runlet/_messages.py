"""The conversation: messages, tool calls, tool results and token usage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from ._errors import ConfigurationError

__all__ = ["Message", "Role", "ToolCall", "ToolResult", "Usage"]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = frozenset({"system", "user", "assistant", "tool"})


@attrs.frozen
class ToolCall:
    """A model's request to call one tool.

    Attributes:
        id: The id the model gave the call; the matching :class:`ToolResult` repeats it.
        name: The tool's name.
        arguments: The parsed JSON arguments. Treat them as read-only.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ToolResult:
    """The outcome of one tool call, sent back to the model.

    Attributes:
        tool_call_id: The :attr:`ToolCall.id` this answers.
        content: The text the model reads.
        is_error: Whether the call failed (unknown tool, bad arguments, the handler
            raised or timed out, or a human rejected it).
    """

    tool_call_id: str
    content: str
    is_error: bool = False


def _check_role(_: object, __: attrs.Attribute[str], value: str) -> None:
    if value not in _ROLES:
        raise ConfigurationError(
            f"Message role must be one of 'system', 'user', 'assistant' or 'tool', not {value!r}."
        )


def _as_tuple(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    return calls if type(calls) is tuple else tuple(calls)


@attrs.frozen
class Message:
    """One message of a transcript.

    Build messages with the constructors :meth:`system`, :meth:`user`,
    :meth:`assistant` and :meth:`tool` rather than by hand.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        content: The text.
        tool_calls: For an assistant message, the tools it asks to call, in order.
        tool_result: For a tool message, the result it carries.

    Raises:
        ConfigurationError: *role* is not one of the four roles.
    """

    role: Role = attrs.field(validator=_check_role)
    content: str
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_as_tuple)
    tool_result: ToolResult | None = None

    @classmethod
    def system(cls, text: str) -> Message:
        """A system message."""
        return cls("system", text)

    @classmethod
    def user(cls, text: str) -> Message:
        """A user message."""
        return cls("user", text)

    @classmethod
    def assistant(cls, text: str = "", tool_calls: Sequence[ToolCall] = ()) -> Message:
        """An assistant message, optionally asking for tool calls."""
        return cls("assistant", text, tool_calls)

    @classmethod
    def tool(cls, result: ToolResult) -> Message:
        """A tool message carrying *result*; its content is the result's content."""
        return cls("tool", result.content, (), result)


@attrs.frozen
class Usage:
    """Tokens and requests a run has used. Usages add up with ``+``.

    Attributes:
        input_tokens: Tokens sent to the model.
        output_tokens: Tokens the model produced.
        requests: Model requests made.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
        )
