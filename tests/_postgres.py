"""A throwaway PostgreSQL server for the tests (see tests/_pgserver.py), and a fresh
schema per store. Set ``RUNLET_TEST_POSTGRES`` to a conninfo to use a server you
run yourself (a CI service, say) instead.

Without server binaries the PostgreSQL tests skip, saying how to install them; when the
``CI`` environment variable is set they fail instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from _pgserver import bindir, server

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
