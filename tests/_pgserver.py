"""Start a throwaway PostgreSQL server (no pytest here: the benchmarks use it too).

The server comes from the PostgreSQL installed on the machine (``initdb`` and ``pg_ctl``,
found through ``pg_config --bindir`` or ``/usr/lib/postgresql/*/bin``): a temporary data
directory, a free port on 127.0.0.1, fsync off, stopped (and deleted) on exit. As root,
it runs as the ``postgres`` user, since ``initdb`` refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
        # runuser lives in /usr/sbin, which a user's PATH may lack.
        runuser = shutil.which("runuser") or next(
            (path for path in ("/usr/sbin/runuser", "/sbin/runuser") if os.path.exists(path)),
            "runuser",
        )
        as_postgres = [runuser, "-u", "postgres", "--"]
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
