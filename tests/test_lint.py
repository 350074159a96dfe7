"""The linter is part of the test command: ``ruff check`` (pyproject.toml's ``[tool.ruff]``: at
least pyflakes' errors, such as an undefined name) over every Python file of the repository.

Ruff comes with the ``dev`` extra, so a missing ruff fails here instead of skipping: a skip would
let an undefined name reach main again (issue 36 item 5)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKED = ["jaxrescore", "benchmarks", "notebooks", "scripts", "tests", "docs"]


def ruff(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_ruff_is_installed():
    proc = ruff("--version")
    assert proc.returncode == 0, (
        f"ruff is missing ({proc.stderr.strip()}); install the dev extra: python3 -m pip install -e \".[dev]\""
    )


def test_the_tree_is_clean():
    proc = ruff("check", "--no-cache", *CHECKED)
    assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"


def test_the_config_catches_an_undefined_name(tmp_path):
    """The project's config selects pyflakes' errors: an undefined name (the NameError of issue
    36 item 5) fails the check."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("def run():\n    return load_target()\n")
    proc = ruff("check", "--no-cache", "bad.py", cwd=tmp_path)
    assert proc.returncode == 1 and "F821" in proc.stdout, proc.stdout + proc.stderr
