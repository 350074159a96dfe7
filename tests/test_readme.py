"""The README's example runs as written and certifies what it says it does."""

import contextlib
import io
import pathlib
import re

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
