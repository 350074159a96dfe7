"""Reading a text corpus into sequences of a model's support, with a weight per line.

A line is ``TEXT`` or ``TEXT<TAB>COUNT`` (the count weights the line, e.g. a frequency; the shipped
``names.tsv.gz`` uncompressed is such a file). ``TEXT`` is read with the model's vocabulary when it
carries one (characters for a character vocabulary, else whitespace-separated token strings), else
as whitespace- or comma-separated token ids. Blank lines are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxrescore._checks import check_float
from jaxrescore.models.vocabulary import check_vocabulary, encode_text


def read_corpus(path: str | os.PathLike, model: Any) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Sequences of ``model``'s support from the text file ``path``, one per line, and their
    weights ``float64[N]``.

    A terminating model's ``eos`` is appended to each line (token ids may already end with it);
    a fixed-length model (``eos`` None) needs every line to have exactly ``max_len`` tokens.

    Args:
      path: the corpus file (see the module docstring for its lines).
      model: any model of :mod:`jaxrescore.models`: its ``vocab_size``, ``eos``, ``max_len`` and
        ``vocabulary`` (None: lines are token ids) define what a line may hold.

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: naming ``path`` (and the line) for an unreadable file, a bad line or count, a
        token outside the model's support, or a corpus without any positive count.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {str(path)!r}")
    vocab = check_vocabulary(getattr(model, "vocabulary", None), model.vocab_size)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"path {str(path)!r} cannot be read as a corpus: {err}") from None
    seqs, weights = [], []
    for number, line in enumerate(text.splitlines(), 1):
        body, _, count = line.rstrip("\r\n").partition("\t")
        if body.strip():
            where = f"path {path}:{number}"
            weights.append(_line_weight(count, where))
            seqs.append(_line_tokens(body, model, vocab, where))
    if not seqs or sum(weights) <= 0:
        raise ValueError(f"path {str(path)!r} holds no sequence with a positive count")
    return seqs, np.asarray(weights, np.float64)


def _line_weight(count: str, where: str) -> float:
    """The weight a line's COUNT column gives it (1 without one)."""
    if not count:
        return 1.0
    try:
        return check_float(float(count), "count", minimum=0.0)
    except ValueError:
        raise ValueError(f"{where}: count {count!r} must be a finite number >= 0") from None


def _line_tokens(body: str, model: Any, vocab: tuple[str, ...] | None, where: str) -> tuple[int, ...]:
    """A line's text as a sequence of ``model``'s support, eos appended."""
    eos = model.eos
    try:
        if vocab is not None:
            seq = encode_text(body, vocab, eos)
        else:
            ids = tuple(int(t) for t in body.replace(",", " ").split())
            seq = ids + (() if eos is None or (ids and ids[-1] == eos) else (eos,))
    except ValueError as err:
        hint = "" if vocab is not None else " (the model has no vocabulary: lines are token ids)"
        raise ValueError(f"{where}: {err}{hint}") from None
    bad = [t for t in seq if not 0 <= t < model.vocab_size]
    if bad:
        raise ValueError(f"{where}: token ids {bad[:3]} outside [0, {model.vocab_size})")
    if eos is not None and eos in seq[:-1]:
        raise ValueError(f"{where}: eos={eos} inside the line")
    if (eos is None and len(seq) != model.max_len) or len(seq) > model.max_len:
        need = f"exactly {model.max_len}" if eos is None else f"at most {model.max_len} (eos included)"
        raise ValueError(f"{where}: {len(seq)} tokens; the model needs {need}")
    return seq
