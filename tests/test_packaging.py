"""What a built package carries: its version, the typing marker, the data files, the license."""

import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import jaxrescore

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_comes_from_the_package_metadata():
    assert jaxrescore.__version__ == metadata.version("jaxrescore") == PYPROJECT["project"]["version"]


def test_version_falls_back_to_the_source_tree(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert jaxrescore._package_version() == PYPROJECT["project"]["version"]


def test_license_file_is_the_apache_license():
    assert PYPROJECT["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_build_carries_py_typed_and_the_data_files(tmp_path):
    """setuptools' build_py over the tracked files: what a wheel of this checkout contains."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to list the tracked files")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode().split("\0")
    src = tmp_path / "src"
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    assert (src / "jaxrescore" / "py.typed").exists(), "jaxrescore/py.typed is not committed"
    lib = tmp_path / "lib"
    subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "--build-lib", str(lib)],
        cwd=src, check=True, capture_output=True,
    )
    built = {p.relative_to(lib).as_posix() for p in lib.rglob("*") if p.is_file()}
    assert "jaxrescore/py.typed" in built
    shipped = {p.relative_to(src).as_posix() for p in (src / "jaxrescore" / "data").iterdir()}
    data = {n for n in shipped if not n.endswith(".py")}
    assert data and data <= built, f"data files missing from the build: {sorted(data - built)}"
