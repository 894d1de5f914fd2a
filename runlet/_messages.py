"""The conversation: messages, tool calls, tool results and token usage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from ._errors import ConfigurationError
from ._util import slot_builder

__all__ = ["Message", "ReasoningPart", "Role", "ToolCall", "ToolResult", "Usage"]

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
    arguments: Mapping[str, Any] = attrs.field(factory=dict, hash=False)


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


def _check_text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, str) or (value is None and attribute.name != "text"):
        return
    allowed = "a str" if attribute.name == "text" else "a str or None"
    raise ConfigurationError(
        f"ReasoningPart.{attribute.name} must be {allowed}, not {type(value).__name__}; "
        "adapters keep what the API sent as text."
    )


def _check_calls_before(_: object, __: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        raise ConfigurationError(
            f"ReasoningPart.calls_before must be an int of 0 or more (how many of the "
            f"message's tool calls came before the part), not {value!r}."
        )


@attrs.frozen
class ReasoningPart:
    """A piece of a model's reasoning (its "thinking") that came with an assistant
    message.

    Reasoning is kept on the message so it survives checkpoints and can go back to the
    API that produced it, some of which require that (Anthropic's extended thinking
    combined with tool use). It is never part of :attr:`Message.content` or a run's
    output.

    The rule for sending it back: an adapter sends back only the parts whose
    :attr:`provider` is its own, and of those only the ones its API accepts (none, for an
    API that takes no reasoning in requests); it drops every other part without
    complaint. So a transcript holding reasoning from one API works with any adapter.

    Attributes:
        text: The reasoning as readable text; empty for a redacted part.
        signature: An opaque token the API attached to the text to prove it unaltered
            (Anthropic's ``signature``; also Gemini's ``thought_signature`` on a tool call,
            as a part with no text placed before that call); send it back exactly as
            received.
        redacted_data: For reasoning the API only hands out encrypted (Anthropic's
            ``redacted_thinking``), the encrypted data, to be sent back as received.
        provider: Which API format the part came from: ``"anthropic"`` (a Messages API
            thinking block) or ``"openai"`` (a Chat Completions ``reasoning_content``
            field) for the adapters Runlet ships; adapters of your own pick a name of
            their own. ``None`` when unknown: no shipped adapter sends such a part back.
        calls_before: How many of the message's tool calls the model made before this
            part: ``0`` (the usual case) when it came ahead of all of them. A model that
            reasons between tool calls (Anthropic's interleaved thinking) gives later
            parts a higher count, and an adapter that sends reasoning back puts each part
            after that many calls, so the turn goes back in the order it came.

    Raises:
        ConfigurationError: A field is not text, or *calls_before* is not an int of 0 or
            more.
    """

    text: str = attrs.field(default="", validator=_check_text)
    signature: str | None = attrs.field(default=None, kw_only=True, validator=_check_text)
    redacted_data: str | None = attrs.field(default=None, kw_only=True, validator=_check_text)
    provider: str | None = attrs.field(default=None, kw_only=True, validator=_check_text)
    calls_before: int = attrs.field(default=0, kw_only=True, validator=_check_calls_before)

    @property
    def redacted(self) -> bool:
        """Whether the reasoning is only available encrypted (in :attr:`redacted_data`)."""
        return self.redacted_data is not None


def _check_role(_: object, __: attrs.Attribute[str], value: str) -> None:
    if value not in _ROLES:
        raise ConfigurationError(
            f"Message role must be one of 'system', 'user', 'assistant' or 'tool', not {value!r}."
        )


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
        reasoning: For an assistant message, the model's reasoning that came with it,
            in the order the model produced it (see :class:`ReasoningPart`). Empty for
            most models, and for every other role.

    Raises:
        ConfigurationError: *role* is not one of the four roles.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_result: ToolResult | None = None
    reasoning: tuple[ReasoningPart, ...] = attrs.field(default=(), kw_only=True)

    def __attrs_post_init__(self) -> None:
        # One check instead of a validator and two converters: every turn builds messages.
        if self.role not in _ROLES:
            _check_role(self, None, self.role)  # type: ignore[arg-type]
        if type(self.tool_calls) is not tuple:
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if type(self.reasoning) is not tuple:
            object.__setattr__(self, "reasoning", tuple(self.reasoning))

    @classmethod
    def system(cls, text: str) -> Message:
        """A system message."""
        return cls("system", text)

    @classmethod
    def user(cls, text: str) -> Message:
        """A user message."""
        return cls("user", text)

    @classmethod
    def assistant(
        cls,
        text: str = "",
        tool_calls: Sequence[ToolCall] = (),
        *,
        reasoning: Sequence[ReasoningPart] = (),
    ) -> Message:
        """An assistant message, optionally asking for tool calls, optionally with the
        model's reasoning."""
        return cls("assistant", text, tuple(tool_calls), reasoning=tuple(reasoning))

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
        cache_read_tokens: Of the input tokens, those read from the API's prompt cache
            (usually billed at a fraction of the price).
        cache_write_tokens: Of the input tokens, those written to the API's prompt cache
            (Anthropic bills them at a premium; OpenAI reports none).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    cache_read_tokens: int = attrs.field(default=0, kw_only=True)
    cache_write_tokens: int = attrs.field(default=0, kw_only=True)

    def __add__(self, other: Usage) -> Usage:
        if type(other) is not Usage and not isinstance(other, Usage):
            return NotImplemented
        if self is ZERO_USAGE and type(other) is Usage:  # a run's first request: nothing to add
            return other
        return _new_usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


# Sums of two usages' counts need none of __init__'s work.
_new_usage = slot_builder(Usage)

ZERO_USAGE = Usage()
"""The usage of a run that made no request yet (one shared object; usages are frozen)."""
