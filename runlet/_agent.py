"""Agents: instructions, a model and tools."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence

import attrs

from ._errors import ConfigurationError
from ._model import Model
from ._tools import ToolDefinition, ToolSpec

__all__ = ["Agent"]


def _check_model(instance: Agent, _: attrs.Attribute[Model], model: Model) -> None:
    if not is_async_method(model, "complete"):
        raise ConfigurationError(
            f"Agent {instance.name!r}: model must be a model adapter, an object with "
            f"`async def complete(self, request)`; got {type(model).__name__}. Use an "
            "adapter from runlet.providers, runlet.testing.ScriptedModel, or your own."
        )


def is_async_method(obj: object, name: str) -> bool:
    """Whether *obj* has a method *name* that is a coroutine function (or a callable
    object whose ``__call__`` is one)."""
    method = getattr(obj, name, None)
    if not callable(method):
        return False
    if inspect.iscoroutinefunction(method):
        return True
    return inspect.iscoroutinefunction(getattr(method, "__call__", None))  # noqa: B004


def _tools_tuple(tools: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    if type(tools) is tuple:
        return tools
    given: object = tools  # typed, but a user's: checked as anything
    if isinstance(given, (ToolSpec, str)) or not isinstance(given, Iterable):
        raise ConfigurationError(
            f"Agent tools must be a list of ToolSpec objects, not {type(given).__name__}; "
            "write tools=[tool] for one tool, or leave it out for none."
        )
    return tuple(tools)


def _check_name(_: object, __: attrs.Attribute[str], name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"An agent's name must be a non-empty str, not {name!r}: checkpoints record "
            "it, and a resume must be given an agent with the same name."
        )
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"An agent's name must be text, but {name!r} holds a lone surrogate (half "
                "of a UTF-16 pair), which no database text column can store."
            ) from None


def _check_instructions(_: object, __: attrs.Attribute[str], instructions: object) -> None:
    if not isinstance(instructions, str):
        raise ConfigurationError(
            f"An agent's instructions must be a str (the system prompt; '' for none), "
            f"not {type(instructions).__name__}."
        )


@attrs.frozen
class Agent:
    """An agent: what the model is told, which model answers, and which tools it may call.

    Agents hold no run state, so one agent can serve any number of concurrent runs.

    Args:
        name: A name for the agent; checkpoints record it, and a resume must be given an
            agent with the same name.
        instructions: The system prompt sent with every model request.
        model: The model adapter (see :class:`~runlet.Model`).
        tools: The tools the model may call.

    Raises:
        ConfigurationError: *name* is not a non-empty str, *instructions* not a str,
            *model* has no async ``complete`` method, *tools* is not a list of
            ToolSpec objects, or two tools share a name.
    """

    name: str = attrs.field(validator=_check_name)
    instructions: str = attrs.field(validator=_check_instructions)
    model: Model = attrs.field(validator=_check_model)
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_tools_tuple)
    _by_name: dict[str, ToolSpec] = attrs.field(init=False, repr=False, eq=False)
    _definitions: tuple[ToolDefinition, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_name: dict[str, ToolSpec] = {}
        for tool in self.tools:
            if not isinstance(tool, ToolSpec):
                raise ConfigurationError(
                    f"Agent {self.name!r}: tools must be ToolSpec objects, "
                    f"got {type(tool).__name__}."
                )
            if tool.name in by_name:
                raise ConfigurationError(
                    f"Agent {self.name!r} has two tools named {tool.name!r}; "
                    "tool names must be unique."
                )
            by_name[tool.name] = tool
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_definitions", tuple(t.definition for t in self.tools))

    def tool(self, name: str) -> ToolSpec | None:
        """The tool called *name*, or ``None``."""
        return self._by_name.get(name)
