"""The README's example runs as written and certifies what it says it does."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_certifies():
    code = re.search(r"## Example\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    out = io.StringIO()
    namespace = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)
    result = namespace["result"]
    assert len(result.items) == 5 and result.certified is True
    assert out.getvalue().splitlines()[-1].startswith("True ")
