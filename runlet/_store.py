"""Where checkpoints live between an interruption and its resume."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._checkpoint import Checkpoint
from ._errors import CheckpointClaimedError, CheckpointNotFoundError

__all__ = ["CheckpointStore", "ClaimingCheckpointStore", "InMemoryCheckpointStore"]


@runtime_checkable
class CheckpointStore(Protocol):
    """Saves, loads and deletes checkpoints.

    Implement it over your own database for checkpoints that survive restarts: store
    :func:`~runlet.unstructure_checkpoint` data and rebuild with
    :func:`~runlet.structure_checkpoint`. To make concurrent resumes of one checkpoint
    safe, implement :class:`ClaimingCheckpointStore` as well.
    """

    async def save(self, checkpoint: Checkpoint) -> None:
        """Store *checkpoint* under ``checkpoint.id``."""
        ...

    async def load(self, checkpoint_id: str) -> Checkpoint:
        """Return the checkpoint with this id.

        Raises:
            CheckpointNotFoundError: There is none.
        """
        ...

    async def delete(self, checkpoint_id: str) -> None:
        """Remove the checkpoint with this id; do nothing if there is none."""
        ...


@runtime_checkable
class ClaimingCheckpointStore(CheckpointStore, Protocol):
    """A store that lets one resume at a time hold a checkpoint.

    :meth:`~runlet.Runtime.resume` claims the checkpoint before it does anything, deletes
    it when the resume finishes, and releases the claim when the resume fails, so a
    second, concurrent resume of the same checkpoint is refused instead of running the
    approved tool again. A durable implementation needs an atomic claim (a conditional
    update, a row lock, or a lease with an expiry so a crashed process does not hold the
    checkpoint forever).
    """

    async def claim(self, checkpoint_id: str) -> Checkpoint:
        """Atomically mark the checkpoint as being resumed and return it.

        Raises:
            CheckpointNotFoundError: There is no such checkpoint.
            CheckpointClaimedError: It is already claimed.
        """
        ...

    async def release(self, checkpoint_id: str) -> None:
        """Undo :meth:`claim`, so the checkpoint can be resumed again."""
        ...


class InMemoryCheckpointStore:
    """A :class:`ClaimingCheckpointStore` that keeps checkpoints in a dict.

    Checkpoints last only as long as the process: use it for tests, demos and
    single-process apps. Claims are atomic because they involve no ``await`` between
    the check and the update.
    """

    def __init__(self) -> None:
        self._checkpoints: dict[str, Checkpoint] = {}
        self._claimed: set[str] = set()

    def __len__(self) -> int:
        return len(self._checkpoints)

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self._checkpoints

    async def save(self, checkpoint: Checkpoint) -> None:
        """Store *checkpoint*, replacing any with the same id."""
        self._checkpoints[checkpoint.id] = checkpoint

    async def load(self, checkpoint_id: str) -> Checkpoint:
        """Return the checkpoint, whether or not it is claimed.

        Raises:
            CheckpointNotFoundError: There is none with this id.
        """
        try:
            return self._checkpoints[checkpoint_id]
        except KeyError:
            raise _not_found(checkpoint_id) from None

    async def delete(self, checkpoint_id: str) -> None:
        """Remove the checkpoint (and its claim)."""
        self._checkpoints.pop(checkpoint_id, None)
        self._claimed.discard(checkpoint_id)

    async def claim(self, checkpoint_id: str) -> Checkpoint:
        """Mark the checkpoint as being resumed and return it.

        Raises:
            CheckpointNotFoundError: There is none with this id.
            CheckpointClaimedError: Another resume holds it.
        """
        checkpoint = await self.load(checkpoint_id)
        if checkpoint_id in self._claimed:
            raise CheckpointClaimedError(
                f"Checkpoint {checkpoint_id!r} is being resumed by another caller right now. "
                "Wait for that resume: it either finishes the checkpoint or, if it fails, "
                "leaves it resumable.",
                checkpoint_id=checkpoint_id,
            )
        self._claimed.add(checkpoint_id)
        return checkpoint

    async def release(self, checkpoint_id: str) -> None:
        """Undo :meth:`claim`."""
        self._claimed.discard(checkpoint_id)


def _not_found(checkpoint_id: str) -> CheckpointNotFoundError:
    return CheckpointNotFoundError(
        f"No checkpoint {checkpoint_id!r}: it was never saved in this store, was deleted, "
        "or a resume already finished with it (a resumed checkpoint is retired). Use the "
        "checkpoint_id of the latest interruption.",
        checkpoint_id=checkpoint_id,
    )
