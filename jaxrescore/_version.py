"""The package's version, found without importing anything heavy (the command line's
``--version`` uses it too)."""

from __future__ import annotations

import pathlib
import tomllib
from importlib import metadata


def package_version() -> str:
    """The installed distribution's version (its metadata); running from a source tree that was
    never installed, the version in the tree's ``pyproject.toml``; else ``"0+unknown"``."""
    try:
        return metadata.version("jaxrescore")
    except metadata.PackageNotFoundError:
        pass
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        with pyproject.open("rb") as f:
            project = tomllib.load(f)["project"]
        if project.get("name") == "jaxrescore":
            return str(project["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    return "0+unknown"
