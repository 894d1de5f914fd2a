"""The SQLite store when the operating system fails under it: a full disk at each step of
a resume and when a run interrupts, a database file that is read-only, deleted or
replaced while the store is open, and WAL files that vanish.

The full-disk and read-only tests mount a small tmpfs, so they need root (CI runs as root)
and skip without it."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _store_semantics import execute

import runlet
from runlet import (
    Agent,
    ConfigurationError,
    HumanResponse,
    ModelRequest,
    ResultNotRecordedError,
    RunResult,
    Runtime,
    ToolContext,
    ToolSpec,
)
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tiny() -> Iterator[Path]:
    """A 512 KiB tmpfs for the module, unmounted at its end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    root = Path(tempfile.mkdtemp(prefix="runlet-tiny-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        root.rmdir()
        if os.environ.get("CI"):  # CI runs as root and must run these, not skip them
            pytest.fail(f"CI runs as root but cannot mount a tmpfs: {mounted.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        if subprocess.run(["umount", str(root)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], check=False)  # pragma: no cover
        root.rmdir()


class Disk:
    """The tmpfs, with the store's file on it: filled up with another file, and freed
    by deleting that file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = root / "store.db"
        self.filler = root / "filler"

    def fill(self) -> None:
        try:
            with self.filler.open("ab", buffering=0) as filler:
                while True:
                    filler.write(bytes(4096))
        except OSError as exc:  # the disk is full now
            if exc.errno != errno.ENOSPC:  # pragma: no cover
                raise

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def immutable(self, on: bool) -> None:
        subprocess.run(["chattr", "+i" if on else "-i", str(self.db)], check=True)

    def clear(self) -> None:
        for path in self.root.iterdir():
            path.unlink()


@pytest.fixture
def disk(tiny: Path) -> Iterator[Disk]:
    disk = Disk(tiny)
    disk.clear()
    try:
        yield disk
    finally:
        if disk.db.exists() and shutil.which("chattr"):
            disk.immutable(False)
        disk.clear()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class FaultAt(SQLiteCheckpointStore):
    """A SQLite store that calls *fault* once, when the resume reaches *point*:
    ``"claimed"`` (after the claim, before the decisions are recorded), ``"resolve"``
    (before the outcome is stored), or ``"handler"`` (inside the approved handler, so
    the write that fails is the result's record)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.point: str | None = None
        self.fault: Any = None

    def reach(self, point: str) -> None:
        if self.point == point:
            self.point = None
            self.fault()

    async def claim(self, checkpoint_id: str) -> runlet.Claim:
        claim = await super().claim(checkpoint_id)
        self.reach("claimed")
        return claim

    async def resolve(self, *args: Any, **kwargs: Any) -> None:
        self.reach("resolve")
        await super().resolve(*args, **kwargs)


class Payments:
    """An approved tool that counts its side effects."""

    def __init__(self, store: FaultAt | None = None, idempotent: bool = False) -> None:
        self.store = store
        self.keys: list[str] = []
        self.spec = ToolSpec(
            "pay",
            "Pay an invoice.",
            {"type": "object", "properties": {"invoice": {"type": "string"}}},
            self.pay,
            requires_approval=True,
            idempotent=idempotent,
        )

    async def pay(self, arguments: Any, context: ToolContext) -> str:
        self.keys.append(context.idempotency_key)
        if self.store is not None:
            self.store.reach("handler")
        return f"Paid {arguments['invoice']}."

    def agent(self) -> Agent:
        return Agent("billing", "Pay when approved.", ScriptedModel(_answer), (self.spec,))


def _answer(request: ModelRequest) -> Any:
    """Ask to pay; once the payment's result is in, say so (however often asked)."""
    if request.messages[-1].role == "tool":
        return "Paid."
    return call("pay", id="c1", invoice="A-1")


def approve(result: RunResult) -> HumanResponse:
    assert result.interruption is not None
    return HumanResponse(result.interruption.id, "approve")


async def expire_claims(store: SQLiteCheckpointStore) -> None:
    """A resume whose store call failed could not give its claim back (that write failed
    too): let its lease run out."""
    await execute(
        store,
        "UPDATE runlet_checkpoints SET lease_until = lease_until - 3600 WHERE status = 'claimed'",
    )


# -- a full disk -------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["claim", "claimed", "resolve"])
async def test_a_full_disk_during_a_resume_loses_nothing(disk: Disk, point: str) -> None:
    before = open_fds()
    async with FaultAt(disk.db) as store:
        payments = Payments(store)
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        if point == "claim":
            disk.fill()
        else:
            store.point, store.fault = point, disk.fill
        with pytest.raises(sqlite3.OperationalError, match="disk is full"):
            await runtime.resume(
                payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
            )
        assert len(payments.keys) == (1 if point == "resolve" else 0)

        disk.free()  # the same store goes on, without reopening
        await expire_claims(store)
        done = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert ("completed", "Paid.") == (done.status, done.output)
        again = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert again == done
        assert 1 == len(payments.keys)
    assert before == open_fds()


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
async def test_a_full_disk_at_the_result_record_is_result_not_recorded(
    disk: Disk, idempotent: bool
) -> None:
    before = open_fds()
    async with FaultAt(disk.db) as store:
        payments = Payments(store, idempotent=idempotent)
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        store.point, store.fault = "handler", disk.fill
        with pytest.raises(ResultNotRecordedError) as info:
            await runtime.resume(
                payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
            )
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert "disk is full" in str(info.value)
        assert runlet.ToolResult("c1", "Paid A-1.") == info.value.result

        disk.free()
        await expire_claims(store)
        again = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        if idempotent:  # run again, with the same key
            assert "completed" == again.status
            assert [payments.keys[0]] * 2 == payments.keys
        else:  # a person is asked again, and nothing ran twice
            assert "interrupted" == again.status
            assert again.interruption is not None
            assert again.interruption.outcome_unknown
            assert 1 == len(payments.keys)
            rejected = await runtime.resume(
                payments.agent(),
                checkpoint_id=again.checkpoint_id,
                response=HumanResponse(again.interruption.id, "reject"),
            )
            assert "completed" == rejected.status
            assert 1 == len(payments.keys)
    assert before == open_fds()


async def test_a_full_disk_when_a_run_interrupts_reports_no_checkpoint(disk: Disk) -> None:
    before = open_fds()
    async with SQLiteCheckpointStore(disk.db) as store:
        payments = Payments()
        runtime = Runtime(checkpoint_store=store)
        disk.fill()
        with pytest.raises(sqlite3.OperationalError, match="disk is full"):
            await runtime.run(payments.agent(), "Pay A-1.")
        disk.free()
        assert [] == list(await store.list_pending())
        first = await runtime.run(payments.agent(), "Pay A-1.")  # usable as it is
        done = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert "completed" == done.status
        assert 1 == len(payments.keys)
    assert before == open_fds()


# -- a read-only file --------------------------------------------------------------------


async def test_a_store_opened_on_a_read_only_file_writes_once_it_is_writable(
    disk: Disk,
) -> None:
    # SQLite opens a file it may not write read-only, and such a connection stays so.
    if shutil.which("chattr") is None:  # pragma: no cover
        pytest.skip("needs chattr")
    async with SQLiteCheckpointStore(disk.db):
        pass
    try:
        disk.immutable(True)
    except subprocess.CalledProcessError:  # pragma: no cover - an older kernel's tmpfs
        if os.environ.get("CI"):
            pytest.fail("CI's tmpfs cannot make a file immutable (chattr +i)")
        pytest.skip("this tmpfs cannot make a file immutable")
    async with SQLiteCheckpointStore(disk.db) as store:
        payments = Payments()
        runtime = Runtime(checkpoint_store=store)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await runtime.run(payments.agent(), "Pay A-1.")
        disk.immutable(False)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        done = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert "completed" == done.status
        assert 1 == len(payments.keys)


# -- a file deleted or replaced under the store ------------------------------------------


async def test_a_database_deleted_under_the_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SQLiteCheckpointStore(path) as store:
        payments = Payments()
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        path.unlink()
        # Not "interrupted" with a checkpoint written into the deleted file.
        with pytest.raises(ConfigurationError, match="was deleted") as info:
            await runtime.run(payments.agent(), "Pay A-2.")
        assert str(path) in str(info.value)
        with pytest.raises(ConfigurationError, match="was deleted"):
            await runtime.resume(
                payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
            )
        with pytest.raises(ConfigurationError, match="was deleted"):
            await store.list_pending()
        assert [] == payments.keys
    assert not path.exists()  # no new, empty database in its place


async def test_a_database_deleted_while_the_approved_tool_runs(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with FaultAt(path) as store:
        payments = Payments(store)
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        store.point, store.fault = "handler", path.unlink
        with pytest.raises(ResultNotRecordedError) as info:
            await runtime.resume(
                payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
            )
        assert isinstance(info.value.__cause__, ConfigurationError)
        assert 1 == len(payments.keys)


async def test_a_database_replaced_under_the_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    copy = tmp_path / "copy.db"
    async with SQLiteCheckpointStore(path) as store:
        payments = Payments()
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        backup = sqlite3.connect(path)
        try:
            backup.execute("VACUUM INTO ?", (str(copy),))
        finally:
            backup.close()
        os.replace(copy, path)  # restored from a backup while the store is open
        with pytest.raises(ConfigurationError, match="was replaced"):
            await runtime.resume(
                payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
            )
        assert [] == payments.keys
    async with SQLiteCheckpointStore(path) as store:  # reopened: the restored file
        runtime = Runtime(checkpoint_store=store)
        done = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert "completed" == done.status
        assert 1 == len(payments.keys)


async def test_wal_files_deleted_under_the_store_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SQLiteCheckpointStore(path) as store:
        payments = Payments()
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        for suffix in ("-wal", "-shm"):
            os.unlink(f"{path}{suffix}")
        done = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert "completed" == done.status
    async with SQLiteCheckpointStore(path) as store:
        assert "resolved" == (await store.get(first.checkpoint_id)).status
        runtime = Runtime(checkpoint_store=store)
        again = await runtime.resume(
            payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
        )
        assert again == done
        assert 1 == len(payments.keys)


async def test_a_relative_path_keeps_its_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The path is taken as it was when the store opened: a later os.chdir() (a daemon's)
    # neither looks like a deleted file nor sends a new connection to another file.
    monkeypatch.chdir(tmp_path)
    async with SQLiteCheckpointStore("store.db") as store:
        payments = Payments()
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(payments.agent(), "Pay A-1.")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        held = store._take()  # the open connection: the resume must open another
        try:
            result = await runtime.resume(
                payments.agent(), checkpoint_id=first.checkpoint_id, response=approve(first)
            )
        finally:
            store._give(held)
        assert result.status == "completed"
        assert 1 == len(payments.keys)
        assert store.path == "store.db"
    assert not (elsewhere / "store.db").exists()


async def test_a_path_through_a_link_and_dot_dot_opens_the_file_sqlite_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "link/../store.db" is store.db beside what the link leads to, for the OS and for
    # SQLite; made absolute by tidying the text, it would be another file.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    async with SQLiteCheckpointStore("link/../store.db") as store:
        first = await Runtime(checkpoint_store=store).run(Payments().agent(), "Pay A-1.")
    assert (tmp_path / "real" / "store.db").exists()
    assert not (tmp_path / "store.db").exists()
    other = sqlite3.connect("link/../store.db")  # any other program given the path
    try:
        found = other.execute("SELECT id FROM runlet_checkpoints").fetchall()
    finally:
        other.close()
    assert found == [(first.checkpoint_id,)]
