"""The commands' arguments: checked with the library's validators (:mod:`jaxrescore._checks`,
which raise ``ValueError`` naming the argument) and reported as :class:`DemoArgumentError`, which
the command line prints in one line with exit status 2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from jaxrescore._checks import check_bool, check_float, check_int
from jaxrescore.data.names import MAX_NAME_LEN, encode
from jaxrescore.demo.defaults import MAX_K
from jaxrescore.models import load_model
from jaxrescore.models.checkpoint import is_archive


class DemoArgumentError(ValueError):
    """A bad argument to a demo entry point (the CLI reports it in one line, exit status 2)."""


def worded(check: Callable, *args: Any, **kwargs: Any) -> Any:
    """``check(*args, **kwargs)``, its ValueError (which names the argument) re-raised as a
    DemoArgumentError."""
    try:
        return check(*args, **kwargs)
    except ValueError as err:
        raise DemoArgumentError(str(err)) from None


def check_query(k: Any, window: Any, gap: Any) -> tuple[int, int | None, float | None]:
    """``k`` (an integer from 1 to ``MAX_K``), ``window`` (None or an integer >= 0) and ``gap``
    (None or a finite number of nats >= 0) of a demo query."""
    return (
        worded(check_int, k, "k", minimum=1, maximum=MAX_K + 1),
        worded(check_int, window, "window", minimum=0, allow_none=True),
        worded(check_float, gap, "gap", minimum=0.0, allow_none=True, unit="nats"),
    )


def check_flag(value: Any, name: str) -> bool:
    """A True/False argument."""
    return worded(check_bool, value, name)


def check_prefix(prefix: Any) -> tuple[int, ...]:
    """The prompt tokens of the names demo's ``prefix`` (lowercase a-z, at most
    ``MAX_NAME_LEN - 1`` letters)."""
    if not isinstance(prefix, str):
        raise DemoArgumentError(f"prefix must be a str, got {type(prefix).__name__}")
    if prefix != prefix.strip() or not all("a" <= c <= "z" for c in prefix):
        raise DemoArgumentError(f"prefix must be lowercase letters a-z, got {prefix!r}")
    if len(prefix) >= MAX_NAME_LEN:
        raise DemoArgumentError(
            f"prefix must have at most {MAX_NAME_LEN - 1} letters (names have at most "
            f"{MAX_NAME_LEN}), got {len(prefix)}"
        )
    return encode(prefix, eos=False)


def load_model_file(path: str | os.PathLike):
    """The model saved at ``path`` (:func:`~jaxrescore.models.load_model`); a file that is not a
    model file is named as what it is (a text file, or not an archive) in the error, with a hint
    when it looks like a corpus."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {str(path)!r}")
    if not is_archive(path):
        raise DemoArgumentError(_not_a_model_file(path))
    return worded(load_model, path)


def _not_a_model_file(path: Path) -> str:
    """Why ``path`` (not a zip archive) is no model file, in words: numpy's advice for such a
    file would be to allow pickles, which a model file never needs."""
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
        kind = "a text file"
    except UnicodeDecodeError as err:
        kind = "a text file" if err.start > len(head) - 4 else "not an .npz archive"
    hint = " (to fit an n-gram draft on a text corpus: jaxrescore enumerate --draft-corpus FILE)" if kind == "a text file" else ""
    return (
        f"{str(path)!r} is not a jaxrescore model file: it is {kind}, and a model file is the .npz "
        f"archive jaxrescore.models.save_model writes{hint}"
    )
