"""Test matrix, linters, type checks, docs and benchmarks: ``nox -l`` lists them."""

from __future__ import annotations

import os

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
BACKENDS = ["asyncio", "trio"]

nox.options.sessions = ["tests", "coverage", "lint", "types", "docs", "bench_smoke"]
nox.options.reuse_existing_virtualenvs = True
# On CI a missing interpreter is a failure, not a skip.
nox.options.error_on_missing_interpreters = bool(os.environ.get("CI"))


@nox.session(python=PYTHONS)
@nox.parametrize("backend", BACKENDS)
def tests(session: nox.Session, backend: str) -> None:
    """Run the test suite on one Python version and one event loop, with coverage."""
    session.install("-e", ".[tests]")
    session.run(
        "coverage",
        "run",
        "-m",
        "pytest",
        *session.posargs,
        env={
            "RUNLET_TEST_BACKEND": backend,
            "COVERAGE_FILE": f".coverage.{session.python}-{backend}",
        },
    )


@nox.session(python="3.11")
def coverage(session: nox.Session) -> None:
    """Combine coverage from every tests session (both backends) and enforce the floor."""
    session.install("coverage[toml]")
    session.run("coverage", "combine", "--keep", *session.posargs)
    session.run("coverage", "report", "--fail-under=97")


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=["3.10", "3.13"])
def types(session: nox.Session) -> None:
    """mypy --strict on runlet/ (settings in pyproject.toml)."""
    session.install("-e", ".[http,trio,postgres]", "mypy>=1.11")
    session.run("mypy", "runlet")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs; any warning or broken reference fails."""
    session.install("-e", ".[docs,http,postgres]")
    session.run(
        "sphinx-build", "-W", "-n", "--keep-going", "-b", "html", "docs", "docs/_build/html"
    )


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Run the benchmarks (Runlet against the hand-written floor) and write JSON."""
    session.install("-e", ".[bench]")
    session.run(
        "python", "benchmarks/run.py", "--json", "benchmarks/results/latest.json", *session.posargs
    )


@nox.session(python="3.11")
def bench_smoke(session: nox.Session) -> None:
    """The benchmarks with tiny counts, so they keep working; nothing is timed."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/run.py", "--smoke", *session.posargs)
