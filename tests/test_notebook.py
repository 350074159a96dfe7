"""The quickstart notebook runs headlessly (its install cell skipped) and its plots render."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
jupytext = pytest.importorskip("jupytext")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def code_cells(nb):
    return [(c.source.strip(), c.metadata.get("tags", [])) for c in nb.cells if c.cell_type == "code"]


def test_notebook_is_paired_with_its_script():
    ipynb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    script = jupytext.read(NOTEBOOKS / "quickstart.py")
    assert code_cells(ipynb) == code_cells(script)
    first = ipynb.cells[0]
    assert first.cell_type == "code" and "skip-execution" in first.metadata["tags"]
    assert "pip install jaxrescore" in first.source


def test_notebook_executes_and_plots_render(tmp_path, monkeypatch):
    import jax

    # The kernel is a fresh process: hand it this session's compilation cache.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(jax.config.jax_compilation_cache_dir))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    assert nb.cells[0].outputs == [], "the install cell must be skipped"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3
    text = "".join(o.get("text", "") for o in outputs)
    assert "proven: True" in text and "certified: True" in text
