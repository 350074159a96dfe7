"""benchmarks/run.py: every section is registered and importable with run(quick, out_dir), and a
quick run writes a BENCHMARKS.md with the command, the machine and each section's table."""

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_every_section_has_run():
    import run as harness

    for name, module in harness.SECTIONS:
        assert harness.available(module), f"section {name}: benchmarks/{module}.py is missing"
        fn = importlib.import_module(module).run
        assert list(inspect.signature(fn).parameters)[:2] == ["quick", "out_dir"], name


@pytest.mark.slow
def test_quick_run_writes_benchmarks_md(tmp_path):
    subset = "proven,certificate"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--quick", "--out", str(tmp_path), "--only", subset],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text.startswith("# Benchmarks") and "CPU cores" in text and "--quick" in text
    for heading in ("## Proven top-k", "## Certificate soundness"):
        assert heading in text
    assert "| top-10 | prove (window 32) |" in text and "| True | True |" in text


def test_quick_without_out_never_writes_into_the_repository(tmp_path, monkeypatch, capsys):
    """Issue 36 item 5: ``--quick`` without ``--out`` replaced the committed BENCHMARKS.md and
    plots with smoke-run figures; it now writes to a new temporary folder and says where."""
    import tempfile

    import run as harness

    repo, bench = tmp_path / "repo", tmp_path / "repo" / "benchmarks"
    bench.mkdir(parents=True)
    (repo / "BENCHMARKS.md").write_text("# Benchmarks\n\ncommitted\n")
    monkeypatch.setattr(harness, "ROOT", str(repo))  # a stand-in repository: nothing real at stake
    monkeypatch.setattr(harness, "HERE", str(bench))
    monkeypatch.setattr(harness, "available", lambda module: True)
    monkeypatch.setattr(harness, "run_section", lambda module, quick, fig_dir, timeout: f"## {module}\n\nsmoke\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temporary folder goes here too
    assert harness.main(["--quick", "--only", "certificate"]) == 0
    assert (repo / "BENCHMARKS.md").read_text() == "# Benchmarks\n\ncommitted\n"
    assert not (bench / "figures").exists()
    err = capsys.readouterr().err
    written = err.split("--quick without --out: writing to ")[1].split()[0]
    assert Path(written).parent == tmp_path
    assert "## bench_certificate" in (Path(written) / "BENCHMARKS.md").read_text()
