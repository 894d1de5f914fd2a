"""A throwaway PostgreSQL server for the tests, and a fresh schema per store.

The server comes from the PostgreSQL installed on the machine (``initdb`` and ``pg_ctl``,
found through ``pg_config --bindir`` or ``/usr/lib/postgresql/*/bin``): a temporary data
directory, a free port on 127.0.0.1, stopped at the end of the session. As root, it runs
as the ``postgres`` user. Set ``RUNLET_TEST_POSTGRES`` to a conninfo to use a server you
run yourself (a CI service, say) instead.

Without server binaries the PostgreSQL tests skip, saying how to install them; when the
``CI`` environment variable is set they fail instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

ENV = "RUNLET_TEST_POSTGRES"
MISSING = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found, so the PostgreSQL store "
    "tests cannot start a server. Install them (`apt-get install postgresql`, or "
    "`brew install postgresql`), or set RUNLET_TEST_POSTGRES to a conninfo of a server."
)


def unavailable(message: str) -> None:
    """Skip, or fail when running in CI, where every test must run."""
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set, so this fails instead of skipping)")
    pytest.skip(message)


def bindir() -> Path | None:
    """Where initdb and pg_ctl are, or None."""
    candidates: list[str] = []
    if shutil.which("pg_config"):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=False
        )
        candidates.append(found.stdout.strip())
    candidates.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def server(bin_path: Path) -> Iterator[str]:
    """Run a fresh server; yield its conninfo."""
    as_postgres: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="runlet-pg-"))
    if os.geteuid() == 0:  # initdb refuses to run as root
        as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    data, log, port = root / "data", root / "log", free_port()
    try:
        initdb = [bin_path / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8"]
        subprocess.run(
            [*as_postgres, *initdb, "--no-sync"],
            check=True,
            capture_output=True,
        )
        options = f"-h 127.0.0.1 -p {port} -k {root} -F -c max_connections=300"
        started = subprocess.run(
            [
                *as_postgres,
                bin_path / "pg_ctl",
                "-D",
                data,
                "-l",
                log,
                "-o",
                options,
                "-w",
                "start",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{log.read_text()}")
        try:
            yield f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        finally:
            subprocess.run(
                [*as_postgres, bin_path / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
                check=False,
                capture_output=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The conninfo of a PostgreSQL server for the whole session."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable('psycopg is not installed: pip install -e ".[tests]"')
    given = os.environ.get(ENV)
    if given:
        yield given
        return
    found = bindir()
    if found is None:
        unavailable(MISSING)
    assert found is not None
    with server(found) as conninfo:
        yield conninfo


def fresh_schema(conninfo: str) -> str:
    """Create an empty schema; return a conninfo whose search_path is that schema."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")  # type: ignore[arg-type]  # a test-made name
    return make_conninfo(conninfo, options=f"-csearch_path={name}")


@asynccontextmanager
async def postgres_store(conninfo: str, lease: float | None) -> AsyncIterator[object]:
    """A PostgresCheckpointStore on a fresh, empty schema."""
    import anyio.to_thread

    from runlet.stores.postgres import PostgresCheckpointStore

    schema = await anyio.to_thread.run_sync(fresh_schema, conninfo)
    async with PostgresCheckpointStore(schema, lease=lease, max_size=4) as store:
        yield store
