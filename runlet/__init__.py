"""Runlet: a small, exact, typed runtime for AI agents, on asyncio or trio.

It drives the model → tool call → tool result loop, stops a run for a person (approve or
reject a tool call, pick an option, type an answer), saves a checkpoint, and resumes the
same run later, in the same process or another one.
"""

from ._agent import Agent as Agent
from ._checkpoint import CHECKPOINT_VERSION as CHECKPOINT_VERSION
from ._checkpoint import Checkpoint as Checkpoint
from ._checkpoint import structure as structure
from ._checkpoint import structure_checkpoint as structure_checkpoint
from ._checkpoint import unstructure as unstructure
from ._checkpoint import unstructure_checkpoint as unstructure_checkpoint
from ._errors import CheckpointCancelledError as CheckpointCancelledError
from ._errors import CheckpointClaimedError as CheckpointClaimedError
from ._errors import CheckpointNotFoundError as CheckpointNotFoundError
from ._errors import CheckpointResolvedError as CheckpointResolvedError
from ._errors import CheckpointSerializationError as CheckpointSerializationError
from ._errors import CheckpointStoreRequiredError as CheckpointStoreRequiredError
from ._errors import ConfigurationError as ConfigurationError
from ._errors import HumanRequestExpiredError as HumanRequestExpiredError
from ._errors import HumanResponseConflictError as HumanResponseConflictError
from ._errors import HumanResponseError as HumanResponseError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import MaxTurnsExceededError as MaxTurnsExceededError
from ._errors import MissingToolError as MissingToolError
from ._errors import ModelAPIError as ModelAPIError
from ._errors import ModelConnectionError as ModelConnectionError
from ._errors import ModelError as ModelError
from ._errors import ModelResponseError as ModelResponseError
from ._errors import ResultNotRecordedError as ResultNotRecordedError
from ._errors import ResumeError as ResumeError
from ._errors import RunletError as RunletError
from ._errors import StoreSchemaError as StoreSchemaError
from ._events import Interrupted as Interrupted
from ._events import MessageCompleted as MessageCompleted
from ._events import RunFinished as RunFinished
from ._events import StreamEvent as StreamEvent
from ._events import ToolCallFinished as ToolCallFinished
from ._events import ToolCallStarted as ToolCallStarted
from ._human import EXPIRY_MESSAGE as EXPIRY_MESSAGE
from ._human import OUTCOME_UNKNOWN_PROMPT as OUTCOME_UNKNOWN_PROMPT
from ._human import REJECTION_MESSAGE as REJECTION_MESSAGE
from ._human import Decision as Decision
from ._human import DecisionAction as DecisionAction
from ._human import HumanAction as HumanAction
from ._human import HumanOption as HumanOption
from ._human import HumanRequest as HumanRequest
from ._human import HumanRequestKind as HumanRequestKind
from ._human import HumanResponse as HumanResponse
from ._human import ask_human as ask_human
from ._json import EVENT_TYPES as EVENT_TYPES
from ._json import structure_event as structure_event
from ._json import unstructure_event as unstructure_event
from ._messages import Message as Message
from ._messages import ReasoningPart as ReasoningPart
from ._messages import Role as Role
from ._messages import ToolCall as ToolCall
from ._messages import ToolResult as ToolResult
from ._messages import Usage as Usage
from ._model import Model as Model
from ._model import ModelRequest as ModelRequest
from ._model import ModelResponse as ModelResponse
from ._model import ModelStreamItem as ModelStreamItem
from ._model import ReasoningDelta as ReasoningDelta
from ._model import StreamingModel as StreamingModel
from ._model import TextDelta as TextDelta
from ._model import ToolCallDelta as ToolCallDelta
from ._result import RunResult as RunResult
from ._result import RunStatus as RunStatus
from ._runtime import STREAM_BUFFER_SIZE as STREAM_BUFFER_SIZE
from ._runtime import RunStream as RunStream
from ._runtime import Runtime as Runtime
from ._store import CallRecord as CallRecord
from ._store import CheckpointStatus as CheckpointStatus
from ._store import CheckpointStore as CheckpointStore
from ._store import Claim as Claim
from ._store import DurableCheckpointStore as DurableCheckpointStore
from ._store import InMemoryCheckpointStore as InMemoryCheckpointStore
from ._store import PendingRequest as PendingRequest
from ._store import Resolution as Resolution
from ._store import StoredCheckpoint as StoredCheckpoint
from ._tools import ApprovalPolicy as ApprovalPolicy
from ._tools import Handler as Handler
from ._tools import ToolContext as ToolContext
from ._tools import ToolDefinition as ToolDefinition
from ._tools import ToolSpec as ToolSpec
from ._util import fixup_module_metadata

__version__ = "0.1.0"

__all__ = [
    "CHECKPOINT_VERSION",
    "EVENT_TYPES",
    "EXPIRY_MESSAGE",
    "OUTCOME_UNKNOWN_PROMPT",
    "REJECTION_MESSAGE",
    "STREAM_BUFFER_SIZE",
    "Agent",
    "ApprovalPolicy",
    "CallRecord",
    "Checkpoint",
    "CheckpointCancelledError",
    "CheckpointClaimedError",
    "CheckpointNotFoundError",
    "CheckpointResolvedError",
    "CheckpointSerializationError",
    "CheckpointStatus",
    "CheckpointStore",
    "CheckpointStoreRequiredError",
    "Claim",
    "ConfigurationError",
    "Decision",
    "DecisionAction",
    "DurableCheckpointStore",
    "Handler",
    "HumanAction",
    "HumanOption",
    "HumanRequest",
    "HumanRequestExpiredError",
    "HumanRequestKind",
    "HumanResponse",
    "HumanResponseConflictError",
    "HumanResponseError",
    "InMemoryCheckpointStore",
    "Interrupted",
    "LeaseLostError",
    "MaxTurnsExceededError",
    "Message",
    "MessageCompleted",
    "MissingToolError",
    "Model",
    "ModelAPIError",
    "ModelConnectionError",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelResponseError",
    "ModelStreamItem",
    "PendingRequest",
    "ReasoningDelta",
    "ReasoningPart",
    "Resolution",
    "ResultNotRecordedError",
    "ResumeError",
    "Role",
    "RunFinished",
    "RunResult",
    "RunStatus",
    "RunStream",
    "RunletError",
    "Runtime",
    "StoreSchemaError",
    "StoredCheckpoint",
    "StreamEvent",
    "StreamingModel",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolContext",
    "ToolDefinition",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "ask_human",
    "structure",
    "structure_checkpoint",
    "structure_event",
    "unstructure",
    "unstructure_checkpoint",
    "unstructure_event",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
