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


def public_functions():
    """Every public function and method (own or inherited from a jaxrescore class) of the names the
    package exports."""
    import importlib
    import inspect

    seen = set()
    for module in ("jaxrescore", "jaxrescore.models", "jaxrescore.rescore", "jaxrescore.index",
                   "jaxrescore.data"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj):
                for cls in obj.__mro__:
                    if not cls.__module__.startswith("jaxrescore"):
                        continue
                    for attr, value in vars(cls).items():
                        fn = getattr(value, "__func__", value)
                        if not (inspect.isfunction(fn) and fn.__module__.startswith("jaxrescore")):
                            continue  # e.g. the __init__ typing.Protocol puts on the protocol
                        if not attr.startswith("_") or attr == "__init__":
                            if fn not in seen:
                                seen.add(fn)
                                yield f"{cls.__name__}.{attr}", fn
            elif inspect.isfunction(obj) and obj not in seen:
                seen.add(obj)
                yield name, obj


def test_public_functions_are_fully_annotated():
    import inspect
    import typing

    missing = []
    for name, fn in public_functions():
        sig = inspect.signature(fn)
        bare = [p for p, v in sig.parameters.items() if p not in ("self", "cls") and v.annotation is v.empty]
        if bare or (sig.return_annotation is sig.empty and fn.__name__ != "__init__"):
            missing.append(f"{name}{' params ' + str(bare) if bare else ''}")
        else:
            typing.get_type_hints(fn)  # every annotation resolves at runtime
    assert not missing, "public functions without complete type hints:\n" + "\n".join(missing)


def _requirement_names(requirements) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_bench_extra_carries_every_package_the_benchmarks_import():
    """`pip install -e ".[bench]" && python3 benchmarks/run.py --quick` needs nothing else (issue 23:
    matplotlib was missing, so the seek_memory section failed)."""
    import ast

    bench = ROOT / "benchmarks"
    local = {p.stem for p in bench.glob("*.py")} | {"jaxrescore"}
    modules = set()
    # run by an interpreter of the user's that has torch (bench_pretrained.py skips it without one)
    external = {"reference_transformers.py"}
    for script in (p for p in bench.glob("*.py") if p.name not in external):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = modules - local - set(sys.stdlib_module_names)
    project = PYPROJECT["project"]
    declared = _requirement_names(project["dependencies"] + project["optional-dependencies"]["bench"])
    dists = metadata.packages_distributions()
    missing = sorted(
        m for m in third_party
        if not {d.lower().replace("_", "-") for d in dists.get(m, [m])} & declared
    )
    assert {"mixle", "matplotlib"} <= third_party
    assert not missing, f"benchmarks import {missing}, which the bench extra does not declare"
