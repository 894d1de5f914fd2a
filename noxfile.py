"""Test matrix, linters, type checks, docs and benchmarks: ``nox -l`` lists them."""

from __future__ import annotations

import os
import shutil

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
    session.install("-e", ".[http,trio]", "mypy>=1.11")
    session.run("mypy", "runlet")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs; any warning or broken reference fails."""
    if shutil.which("dot") is None:  # the diagrams are drawn by Graphviz at build time
        session.error("Graphviz's `dot` is missing: apt-get install graphviz (or brew install)")
    session.install("-e", ".[docs,http]")
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


@nox.session(python="3.11")
def bench_peers(session: nox.Session) -> None:
    """Runlet side by side with Pydantic AI, the OpenAI Agents SDK and LangGraph; writes
    benchmarks/results/peers.json and redraws docs/_static/peers.svg. Not run by default:
    it installs the peers (the `peers` extra) and takes several minutes."""
    session.install("-e", ".[peers]")
    smoke = "--smoke" in session.posargs  # must not overwrite the committed results
    out = "benchmarks/results/peers-smoke.json" if smoke else "benchmarks/results/peers.json"
    session.run("python", "benchmarks/peers/run.py", "--json", out, *session.posargs)
    if not smoke:
        session.run("python", "benchmarks/chart.py", out)
