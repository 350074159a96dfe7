"""The notebooks: paired with their scripts, installable the way their first cell says, stored with
their outputs, and executed headlessly here (install cell skipped) with every plot rendered."""

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
jupytext = pytest.importorskip("jupytext")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

# notebook -> (plots it draws, lines its outputs must contain)
EXPECTED = {
    "quickstart": (4, ["proven: True", "same answer: True", "certified: True", "equals a fresh top_k: True"]),
    "own_model": (2, ["proven: True", "same answer: True"]),
}


def code_cells(nb):
    return [(c.source.strip(), c.metadata.get("tags", [])) for c in nb.cells if c.cell_type == "code"]


def read(name):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def text_of(outs):
    return "".join(o.get("text", "") for o in outs)


def images(outs):
    return [o for o in outs if "image/png" in o.get("data", {})]


def test_every_notebook_is_tested():
    assert {p.stem for p in NOTEBOOKS.glob("*.ipynb")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_is_paired_with_its_script(name):
    assert code_cells(read(name)) == code_cells(jupytext.read(NOTEBOOKS / f"{name}.py"))


def install_cell(name):
    first = read(name).cells[0]
    assert first.cell_type == "code" and "skip-execution" in first.metadata.get("tags", [])
    return first.source


def test_install_cell_installs_from_one_documented_source():
    cells = {name: install_cell(name) for name in EXPECTED}
    assert len(set(cells.values())) == 1, "the notebooks' install cells differ"
    cell = cells["quickstart"]
    assert re.search(r'^JAXRESCORE_SOURCE = "[^"]+"$', cell, re.M)
    assert re.search(r"^%pip install \{JAXRESCORE_SOURCE\}$", cell, re.M)
    assert "pip install jaxrescore\n" not in cell + "\n", "jaxrescore is not on PyPI"
    readme = (ROOT / "README.md").read_text()
    assert "JAXRESCORE_SOURCE" in readme
    assert re.search(r"git archive --format=tar.gz --prefix=jaxrescore/ -o jaxrescore.tar.gz HEAD", readme)


def test_the_documented_source_archive_holds_an_installable_package(tmp_path):
    """The archive command of the install cell, run on this checkout: pip needs the pyproject,
    the package and its data at the top of the archive's single folder."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    command = re.search(r"git archive [^\n]*HEAD", install_cell("quickstart")).group(0).split()
    archive = tmp_path / "jaxrescore.tar.gz"
    command[command.index("-o") + 1] = str(archive)
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for member in ("pyproject.toml", "LICENSE", "jaxrescore/__init__.py", "jaxrescore/py.typed",
                   "jaxrescore/data/names.tsv.gz", "jaxrescore/data/names_target.npz"):
        assert f"jaxrescore/{member}" in names, member


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stored_notebook_carries_its_executed_outputs(name):
    """What a reader sees in a preview (GitHub, Colab) before running anything."""
    plots, lines = EXPECTED[name]
    nb = read(name)
    outs = outputs(nb)
    assert not [o for o in outs if o.output_type == "error"]
    assert len(images(outs)) >= plots
    assert all(line in text_of(outs) for line in lines)
    assert "TqdmWarning" not in text_of(outs) and "IProgress" not in text_of(outs)
    code = [c for c in nb.cells if c.cell_type == "code"][1:]
    assert all(c.execution_count for c in code), "stored cells not executed (run the README's command)"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_executes_and_plots_render(name, tmp_path, monkeypatch):
    import jax

    # The kernel is a fresh process: hand it this session's compilation cache.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(jax.config.jax_compilation_cache_dir))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = read(name)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    assert nb.cells[0].outputs == [], "the install cell must be skipped"
    plots, lines = EXPECTED[name]
    outs = outputs(nb)
    assert not [o for o in outs if o.output_type == "error"]
    assert len(images(outs)) >= plots
    text = text_of(outs)
    missing = [line for line in lines if line not in text]
    assert not missing, f"{name}: outputs lack {missing}"
    assert "Warning" not in text, text
