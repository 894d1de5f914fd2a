"""Every error Runlet raises on purpose.

All of them derive from :class:`RunletError`, so ``except runlet.RunletError`` catches
whatever Runlet itself refused or could not do. Cancellation is never turned into one of
these: it always propagates as the event loop's own cancellation exception.

The tree::

    RunletError
    ├── ConfigurationError            a ToolSpec, Agent, Runtime or Message is built wrongly
    │   ├── CheckpointStoreRequiredError   a run must interrupt, but there is no store
    │   └── StoreSchemaError          a store's database has tables of an unknown schema
    ├── ModelError                    the model adapter failed
    │   ├── ModelResponseError        it answered with something unusable
    │   ├── ModelAPIError             the API answered with an error status
    │   └── ModelConnectionError      the API could not be reached
    ├── MaxTurnsExceededError         the run asked the model too many times
    ├── HumanResponseError            a HumanResponse does not fit the open request
    │   ├── HumanResponseConflictError    the request was already answered differently
    │   └── HumanRequestExpiredError      the request expired before the answer came
    ├── ResumeError                   a checkpoint cannot be resumed as asked
    │   ├── CheckpointNotFoundError   no such checkpoint (never saved, or deleted)
    │   │   └── CheckpointCancelledError  the checkpoint was cancelled
    │   ├── CheckpointClaimedError    another resume holds the checkpoint right now
    │   ├── CheckpointResolvedError   the checkpoint was already resolved
    │   ├── LeaseLostError            this resume's claim ran out and another took over
    │   ├── MissingToolError          the agent given to resume lacks a pending call's tool
    │   └── ResultNotRecordedError    an approved call ran, but the store failed to record it
    └── CheckpointSerializationError  checkpoint data cannot be turned into JSON or back

A web handler can map them to HTTP statuses by class alone: ``CheckpointCancelledError``
and ``CheckpointNotFoundError`` (404 / 410), ``HumanResponseConflictError`` and
``CheckpointResolvedError`` (409), ``CheckpointClaimedError`` (409, retry later),
``HumanRequestExpiredError`` (410), any other ``HumanResponseError`` (422).

Errors raised during a resume never consume the checkpoint: it stays loadable and
resumable, so the application can correct the problem and try again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._human import Decision
    from ._messages import ToolResult
    from ._store import Resolution

__all__ = [
    "CheckpointCancelledError",
    "CheckpointClaimedError",
    "CheckpointNotFoundError",
    "CheckpointResolvedError",
    "CheckpointSerializationError",
    "CheckpointStoreRequiredError",
    "ConfigurationError",
    "HumanRequestExpiredError",
    "HumanResponseConflictError",
    "HumanResponseError",
    "LeaseLostError",
    "MaxTurnsExceededError",
    "MissingToolError",
    "ModelAPIError",
    "ModelConnectionError",
    "ModelError",
    "ModelResponseError",
    "ResultNotRecordedError",
    "ResumeError",
    "RunletError",
    "StoreSchemaError",
]


class RunletError(Exception):
    """The root of every error Runlet raises on purpose.

    The message always says what went wrong and what to do about it. Every one pickles
    and copies with its attributes, so it crosses process boundaries (a process pool, a
    task queue) as itself.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduce calls __init__(*args) again, which fails for the errors
        # whose attributes are keyword-only: rebuild without __init__ instead.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[RunletError], args: tuple[Any, ...], state: dict[str, Any]) -> RunletError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigurationError(RunletError):
    """Raised when a :class:`~runlet.ToolSpec`, :class:`~runlet.Agent`,
    :class:`~runlet.Runtime`, :class:`~runlet.Message` or
    :class:`~runlet.testing.ScriptedModel` is built with values that cannot work, such as
    an invalid JSON Schema, two tools with the same name, a model without an async
    ``complete`` method, or an unknown message role. It is raised at construction, before
    anything runs."""


class CheckpointStoreRequiredError(ConfigurationError):
    """Raised when a run must stop for a human but its :class:`~runlet.Runtime` has no
    checkpoint store. It is raised before any tool of that turn runs.

    Give the runtime a store: ``Runtime(checkpoint_store=InMemoryCheckpointStore())``.
    """


class StoreSchemaError(ConfigurationError):
    """Raised when a durable store (:mod:`runlet.stores`) opens a database whose Runlet
    tables were written by a schema version this Runlet does not know, typically by a
    newer release. Nothing is changed in the database.

    Attributes:
        found: The schema version recorded in the database.
        expected: The version this Runlet reads and writes.
    """

    def __init__(self, message: str, *, found: object, expected: int) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected


class ModelError(RunletError):
    """Raised when the model adapter fails: its ``complete()`` raised, or the answer
    could not be used. The original exception, if any, is the ``__cause__``."""


class ModelResponseError(ModelError):
    """Raised when the model answered with something Runlet cannot use: not a
    :class:`~runlet.ModelResponse`, not an assistant message, JSON that does not parse,
    or tool arguments that are not a JSON object."""


class ModelAPIError(ModelError):
    """Raised when a model API answers with an error status that retrying will not fix
    (or that still failed after the last retry).

    Attributes:
        status_code: The HTTP status code.
        body: The API's own error message, as the API worded it.
        api_request_id: The id the API gave the failed request (Anthropic's
            ``request-id`` header, OpenAI's ``x-request-id``), for the vendor's support,
            also for an error reported inside a successful answer or its stream;
            ``None`` when it sent none. (Not a
            :class:`~runlet.HumanRequest` id, which other errors call ``request_id``.)
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        body: str | None = None,
        api_request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body
        self.api_request_id = api_request_id


class ModelConnectionError(ModelError):
    """Raised when a model API could not be reached (connection refused, reset or timed
    out) after the last retry."""


class MaxTurnsExceededError(RunletError):
    """Raised when a run asks the model more times than the runtime's ``max_turns``.

    This stops runaway loops. Raise the limit with ``Runtime(max_turns=...)`` if the agent
    legitimately needs more turns.

    Attributes:
        max_turns: The limit that was reached.
    """

    def __init__(self, message: str, *, max_turns: int) -> None:
        super().__init__(message)
        self.max_turns = max_turns


class HumanResponseError(RunletError):
    """Raised when a :class:`~runlet.HumanResponse` makes no sense on its own (at
    construction) or does not fit the open :class:`~runlet.HumanRequest` (at resume): a
    wrong ``request_id``, an action that does not fit the request's kind, an option id
    that was not offered, or edited arguments that fail the tool's schema.

    The checkpoint is left untouched; resume again with a corrected response.
    """


class HumanResponseConflictError(HumanResponseError):
    """Raised when a request was already answered (the first accepted answer is final) and
    the response given now differs from that answer. Repeating the *same* response to the
    same checkpoint is not an error: :meth:`~runlet.Runtime.resume` then returns the stored
    result. A response to a request that an earlier checkpoint of the run already decided
    (a form sent again whole to the run's latest checkpoint) raises it too.

    Attributes:
        checkpoint_id: The checkpoint the resume was given.
        request_id: The request id the refused response names (``None`` if it names
            none).
        next_checkpoint_id: Set only when the checkpoint was resolved with answers to
            other requests and the request went on to a later checkpoint: the one where
            it is open now (however many resumes came in between), or where this same
            response was accepted since. Resume it with this same response (to answer
            it, or to get the stored result again). ``None`` otherwise: the request was
            answered differently (the first accepted answer is final), or the run was
            cancelled.
        decision: The recorded :class:`~runlet.Decision` the response conflicts with
            (the first accepted answer: its ``action``, ``responded_by``, ``decided_at``
            and ``checkpoint_id``), so an interface can show who decided and when.
            ``None`` when no answer to the request is on record (a wrong request id, or a
            request the run left open or cancelled).
    """

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str,
        request_id: str | None = None,
        next_checkpoint_id: str | None = None,
        decision: Decision | None = None,
    ) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.request_id = request_id
        self.next_checkpoint_id = next_checkpoint_id
        self.decision = decision


class HumanRequestExpiredError(HumanResponseError):
    """Raised when a response arrives after the request expired: after its
    ``expires_at``, or after :meth:`~runlet.Runtime.expire` gave up on it (whether or not
    it had a deadline).

    Past the deadline and before any ``expire()``, the checkpoint is kept: record the
    expiry with :meth:`~runlet.Runtime.expire` (the model then learns nobody answered) or
    retire it with :meth:`~runlet.Runtime.cancel`. After ``expire()``, the run has
    already gone on without the answer.

    Attributes:
        checkpoint_id: The checkpoint the resume was given.
        request_id: The expired request.
    """

    def __init__(self, message: str, *, checkpoint_id: str, request_id: str) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.request_id = request_id


class ResumeError(RunletError):
    """Raised when a checkpoint cannot be resumed as asked. The checkpoint, if it exists,
    is left loadable and resumable.

    A store of your own raises these with a message alone, or with the id too:
    ``CheckpointNotFoundError(f"No checkpoint {checkpoint_id!r}.", checkpoint_id=...)``.

    Attributes:
        checkpoint_id: The checkpoint the resume was given. When a store raised the error
            without one, :class:`~runlet.Runtime` fills it in as the error passes through
            ``resume()``, ``stream_resume()``, ``expire()`` or ``cancel()``; it is
            ``None`` only outside those.
    """

    def __init__(self, message: str, *, checkpoint_id: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id


class CheckpointNotFoundError(ResumeError):
    """Raised by a :class:`~runlet.CheckpointStore` (and so by
    :meth:`~runlet.Runtime.resume`) when no checkpoint has the given id: it was never
    saved, it was deleted, or a resume already finished with it and retired it."""


class CheckpointCancelledError(CheckpointNotFoundError):
    """Raised when the checkpoint was retired with :meth:`~runlet.Runtime.cancel`. It is a
    :class:`CheckpointNotFoundError`, so code that only knows "gone" keeps working."""


class CheckpointResolvedError(ResumeError):
    """Raised by a durable store when a checkpoint was already resolved, and by
    :meth:`~runlet.Runtime.cancel` and :meth:`~runlet.Runtime.expire` for such a checkpoint.
    (:meth:`~runlet.Runtime.resume` instead returns the stored result for an equal
    response, or raises :class:`HumanResponseConflictError`.)

    Attributes:
        resolution: The stored :class:`~runlet.Resolution`, when the store supplied it.
    """

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str | None = None,
        resolution: Resolution | None = None,
    ) -> None:
        super().__init__(message, checkpoint_id=checkpoint_id)
        self.resolution = resolution


class LeaseLostError(ResumeError):
    """Raised by a durable store when a write carries a claim token that no longer holds
    the checkpoint: the lease ran out and another resume took the checkpoint over. The
    late writer's work is refused, so it can never overwrite the new owner's records."""


class CheckpointClaimedError(ResumeError):
    """Raised when another resume of the same checkpoint is under way (its claim's lease
    has not run out). Only one resume of a checkpoint may run at a time, so a tool waiting
    for approval runs at most once. Retry later: the other resume either resolves the
    checkpoint (then an equal response returns its result) or leaves it resumable."""


class MissingToolError(ResumeError):
    """Raised at resume when the supplied agent has no tool for a pending call, or is not
    the agent that was interrupted. Checkpoints never hold handlers, so the resuming
    process must supply an agent with the same tools.

    Attributes:
        tool_name: The tool the agent lacks (``None`` when the agent's name differs).
    """

    def __init__(
        self, message: str, *, checkpoint_id: str | None = None, tool_name: str | None = None
    ) -> None:
        super().__init__(message, checkpoint_id=checkpoint_id)
        self.tool_name = tool_name


class ResultNotRecordedError(ResumeError):
    """Raised by a resume when an approved call's handler finished but the store failed to
    record its result (a full disk, a database locked for longer than its timeout, a
    statement timeout): the store's own error is the ``__cause__``. The call stays
    recorded as started, so the next attempt cannot tell whether it took effect: it asks
    a person again (``outcome_unknown``), or runs it again with the same idempotency key
    if the tool is ``idempotent``. Log :attr:`result`: it is what the handler returned
    (a payment's reference, say), which helps that person decide.

    Attributes:
        tool_call_id: The call whose result was not recorded.
        result: The :class:`~runlet.ToolResult` the handler produced.
    """

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str | None = None,
        tool_call_id: str,
        result: ToolResult,
    ) -> None:
        super().__init__(message, checkpoint_id=checkpoint_id)
        self.tool_call_id = tool_call_id
        self.result = result


class CheckpointSerializationError(RunletError):
    """Raised when a checkpoint cannot be turned into JSON-compatible data (a value in
    ``metadata``, ``options`` or tool arguments is not JSON), or when data cannot be turned
    back into a checkpoint (malformed, or written by an unknown schema version).

    Attributes:
        path: Where in the checkpoint the problem is, e.g. ``metadata['when']``, or
            ``None`` when it concerns the whole document.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
