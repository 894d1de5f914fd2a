"""What users download: the wheel and the sdist carry the license and the typing marker
(both built in-process with hatchling, the project's build backend, as ``pip wheel`` or
``python -m build`` would build them), and the dependency bounds are the tested ones."""

from __future__ import annotations

import importlib.metadata
import runpy
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder
from packaging.requirements import Requirement

import runlet

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    [path] = WheelBuilder(str(ROOT)).build(directory=str(out))
    return zipfile.ZipFile(path)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> tarfile.TarFile:
    out = tmp_path_factory.mktemp("sdist")
    [path] = SdistBuilder(str(ROOT)).build(directory=str(out))
    return tarfile.open(path)


def test_the_repository_has_the_mit_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 The Runlet developers" in text


def test_the_wheel_carries_the_license_and_says_mit(wheel: zipfile.ZipFile) -> None:
    [license_file] = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert (ROOT / "LICENSE").read_bytes() == wheel.read(license_file)
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    headers = wheel.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers


def test_the_wheel_holds_the_package_and_its_typing_marker_only(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert "runlet/py.typed" in names
    assert "runlet/testing/__init__.py" in names
    tops = {name.split("/", 1)[0] for name in names}
    assert {"runlet", f"runlet-{runlet.__version__}.dist-info"} == tops


def test_the_sdist_carries_the_license(sdist: tarfile.TarFile) -> None:
    names = sdist.getnames()
    [top] = {name.split("/", 1)[0] for name in names}
    needed_files = [
        "LICENSE",
        "pyproject.toml",
        "README.md",
        "runlet/py.typed",
        "noxfile.py",
        ".ci/lowest_constraints.py",  # the tests and tests_lowest read it
    ]
    for needed in needed_files:
        assert f"{top}/{needed}" in names, needed
    member = sdist.extractfile(f"{top}/LICENSE")
    assert member is not None
    assert (ROOT / "LICENSE").read_bytes() == member.read()


# --- Declared dependency bounds ------------------------------------------------------------

LOWEST = runpy.run_path(str(ROOT / ".ci" / "lowest_constraints.py"))


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def test_lowest_constraints_pin_every_runtime_dependency_to_its_lower_bound() -> None:
    assert [
        "anyio==4.8",
        "attrs==24.1",
        "cattrs==24.1",
        "jsonschema-rs==0.29",
        "httpx==0.27",
        "trio==0.26.2",
        "psycopg==3.2.2",  # the first with binary wheels for every Python supported
        "psycopg-pool==3.2",
        "opentelemetry-api==1.27",
    ] == LOWEST["read"](ROOT / "pyproject.toml")


def test_lowest_constraints_keep_markers_and_skip_the_project_itself() -> None:
    data = {
        "project": {
            "name": "runlet",
            "dependencies": ["a>=1.2,<2", "b~=3.1; python_version < '3.11'"],
            "optional-dependencies": {"http": ["runlet[trio]", "c==4"], "trio": []},
        }
    }
    assert ["a==1.2", 'b==3.1; python_version < "3.11"', "c==4"] == LOWEST["lowest_constraints"](
        data
    )


@pytest.mark.parametrize("requirement", ["a", "a<2", "a>=1,>=2"])
def test_a_dependency_needs_exactly_one_lower_bound(requirement: str) -> None:
    data = {
        "project": {
            "name": "runlet",
            "dependencies": [requirement],
            "optional-dependencies": {"http": [], "trio": []},
        }
    }
    with pytest.raises(ValueError, match="exactly one lower bound"):
        LOWEST["lowest_constraints"](data)


def test_the_installed_dependencies_fit_the_declared_bounds() -> None:
    # The tests run against what is installed, so a bound it falls outside of (an upper
    # bound of jsonschema-rs that is older than the tested release, say) is untested.
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    for text in [*project["dependencies"], *extras["http"], *extras["trio"]]:
        requirement = Requirement(text)
        installed = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (text, installed)


def test_jsonschema_rs_has_an_upper_bound() -> None:
    [text] = [d for d in pyproject()["project"]["dependencies"] if d.startswith("jsonschema-rs")]
    assert any(spec.operator == "<" for spec in Requirement(text).specifier)


def test_unused_backports_are_not_dependencies() -> None:
    names = {Requirement(d).name for d in pyproject()["project"]["dependencies"]}
    assert not names & {"typing-extensions", "exceptiongroup"}


def test_the_docs_extra_installs_what_the_docs_build_imports() -> None:
    docs = {
        Requirement(d).name: Requirement(d)
        for d in pyproject()["project"]["optional-dependencies"]["docs"]
    }
    assert {"sphinx", "myst-parser", "furo"} <= set(docs)
    # Sphinx 8.2.3 and older leave the type-alias links of the API reference broken.
    assert not docs["sphinx"].specifier.contains("8.2.3")
    # The API reference documents runlet.providers, which imports httpx.
    assert "runlet[http]" in pyproject()["project"]["optional-dependencies"]["docs"]


def test_ci_runs_the_lowest_versions_session() -> None:
    noxfile = (ROOT / "noxfile.py").read_text()
    sessions = noxfile.split("nox.options.sessions = [", 1)[1].split("]", 1)[0]
    assert '"tests_lowest"' in sessions
    assert "def tests_lowest(" in noxfile


def test_coverage_settings_name_only_files_that_exist() -> None:
    run = pyproject()["tool"]["coverage"]["run"]
    for pattern in run.get("omit", []):
        assert list(ROOT.glob(pattern)), f"coverage omits {pattern}, which does not exist"
