"""Test matrix, linters, type checks, docs and benchmarks: ``nox -l`` lists them."""

from __future__ import annotations

import os
import re
import runpy
import shutil
from pathlib import Path

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
BACKENDS = ["asyncio", "trio"]

nox.options.sessions = [
    "tests",
    "tests_lowest",
    "coverage",
    "lint",
    "types",
    "docs",
    "bench_smoke",
]
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


@nox.session(python=["3.10", "3.13"])
def tests_lowest(session: nox.Session) -> None:
    """Run the test suite on both event loops with every runtime dependency (and the http
    and trio extras) at the lowest version pyproject.toml allows."""
    read = runpy.run_path(".ci/lowest_constraints.py")["read"]
    constraints = Path(session.create_tmp()) / "lowest-constraints.txt"
    constraints.write_text("\n".join(read(Path("pyproject.toml"))) + "\n")
    session.log("Constraints:\n" + constraints.read_text())
    session.install("-c", str(constraints), "-e", ".[tests]")
    session.run("python", "-m", "pytest", *session.posargs)


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
    """mypy --strict on runlet/ and on the user code in tests/typecheck (settings in
    pyproject.toml)."""
    # pytest: runlet.testing ships the store conformance suite, which builds pytest tests.
    session.install("-e", ".[http,trio,postgres]", "mypy>=1.11", "pytest>=8.2")
    # Checked as the session's Python (pyproject.toml's python_version is the floor that
    # an editor's mypy uses), so version-dependent code is checked both ways.
    session.run("mypy", "--python-version", str(session.python), "runlet", "tests/typecheck")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs; any warning or broken reference fails, and so does an API
    reference that shows internals (see ``api_page_problems``)."""
    if shutil.which("dot") is None:  # the diagrams are drawn by Graphviz at build time
        session.error("Graphviz's `dot` is missing: apt-get install graphviz (or brew install)")
    session.install("-e", ".[docs,postgres]")
    session.run(
        "sphinx-build", "-W", "-n", "--keep-going", "-b", "html", "docs", "docs/_build/html"
    )
    problems = api_page_problems(Path("docs/_build/html/api.html").read_text(encoding="utf-8"))
    if problems:
        session.error("The API reference is wrong: " + "; ".join(problems))


def api_page_problems(html: str) -> list[str]:
    """What the built API page shows that users must not see: private members, and
    ``@asynccontextmanager`` methods with their generator's return type."""
    text = re.sub(r"<[^>]+>", "", html)
    problems = [
        f"{name} is private" for name in re.findall(r'id="(runlet\.[\w.]*\._[a-z]\w*)"', html)
    ]
    if "AsyncIterator[AsyncIterator[" in text:
        problems.append("a stream() shows AsyncIterator[AsyncIterator[...]], not a context manager")
    return problems


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
