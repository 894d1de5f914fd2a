"""A store with the exact signatures of :class:`~runlet.DurableCheckpointStore`, for tests
that check nothing in Runlet leans on a keyword or a default the protocol does not give."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runlet import (
    CallRecord,
    Checkpoint,
    Claim,
    Decision,
    InMemoryCheckpointStore,
    PendingRequest,
    Resolution,
    StoredCheckpoint,
)


class ExactStore:
    """Every protocol method with the protocol's own signature, no more lenient: position
    only, no defaults beyond the protocol's. The work is the in-memory store's."""

    def __init__(self, inner: InMemoryCheckpointStore) -> None:
        self.inner = inner

    @property
    def lease(self) -> float | None:
        return self.inner.lease

    async def save(self, checkpoint: Checkpoint, /) -> None:
        await self.inner.save(checkpoint)

    async def load(self, checkpoint_id: str, /) -> Checkpoint:
        return await self.inner.load(checkpoint_id)

    async def delete(self, checkpoint_id: str, /) -> None:
        await self.inner.delete(checkpoint_id)

    async def get(self, checkpoint_id: str, /) -> StoredCheckpoint:
        return await self.inner.get(checkpoint_id)

    async def claim(self, checkpoint_id: str, /) -> Claim:
        return await self.inner.claim(checkpoint_id)

    async def renew(self, checkpoint_id: str, token: str, /) -> None:
        await self.inner.renew(checkpoint_id, token)

    async def record(
        self, checkpoint_id: str, token: str, records: Sequence[CallRecord], /
    ) -> None:
        await self.inner.record(checkpoint_id, token, records)

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None,
        /,
    ) -> None:
        await self.inner.resolve(checkpoint_id, token, resolution, next_checkpoint)

    async def release(self, checkpoint_id: str, token: str, /) -> None:
        await self.inner.release(checkpoint_id, token)

    async def cancel(self, checkpoint_id: str, /) -> None:
        await self.inner.cancel(checkpoint_id)

    async def list_pending(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        agent_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Sequence[PendingRequest]:
        return await self.inner.list_pending(
            limit=limit, after=after, agent_name=agent_name, metadata=metadata
        )

    async def decisions(self, run_id: str, /) -> Sequence[Decision]:
        return await self.inner.decisions(run_id)
