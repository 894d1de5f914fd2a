"""What users download: the wheel and the sdist carry the license and the typing marker.

Both are built in-process with hatchling, the project's build backend, as ``pip wheel``
or ``python -m build`` would build them.
"""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest
from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder

import runlet

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
    for needed in ("LICENSE", "pyproject.toml", "README.md", "runlet/py.typed", "noxfile.py"):
        assert f"{top}/{needed}" in names, needed
    member = sdist.extractfile(f"{top}/LICENSE")
    assert member is not None
    assert (ROOT / "LICENSE").read_bytes() == member.read()
