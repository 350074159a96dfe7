"""The README's example runs as written and certifies what it says it does; every python block of
the README runs on its own."""

import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_proves_and_certifies():
    code = re.search(r"## Example\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    out = io.StringIO()
    namespace = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)
    result, certified = namespace["result"], namespace["certified"]
    assert len(result.items) == 5 and result.proven is True
    assert certified.certified is True and certified.items == result.items
    lines = out.getvalue().splitlines()
    assert lines[5].startswith("True ") and lines[-1].startswith("True ")


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


@pytest.mark.parametrize("i", range(len(python_blocks())))
def test_every_python_block_of_the_readme_runs_as_written(i, monkeypatch, tmp_path):
    """Each block on its own, in a fresh namespace: a reader copies one block, not the page."""
    code = python_blocks()[i]
    if 'from_pretrained("./' in code:  # the checkpoint folders a reader keeps: tiny random
        pytest.importorskip("safetensors")  # GPT-2s in the exact Hugging Face layout stand in
        from test_models_pretrained import write_gpt2_pair

        write_gpt2_pair(tmp_path)
        monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, f"README.md python block {i}", "exec"), {})


def test_ci_runs_the_readmes_test_command_which_runs_everything():
    """.ci/run is the README's command and leaves no test out; the fast subset is documented."""
    ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = README.read_text()
    assert ci == 'python3 -m pip install -e ".[dev]" && python3 -m pytest -n 2'
    assert f"```bash\n{ci}\n```" in readme
    assert 'python3 -m pytest -n 2 -m "not slow"' in readme
