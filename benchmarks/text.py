"""A REAL-TEXT word-level workload: clauses of CPython's own documentation, a word-level
transformer target trained on them, and two drafts: an n-gram fitted on the same text and a
smaller transformer distilled from the target.

The text ships with every Python (no download), read in this order:

1. ``pydoc_data.topics.topics`` (the language reference's topics that ``help()`` shows), its
   entries in key order;
2. the docstrings (``ast.get_docstring``: module, class and function) of every top-level module
   named in ``sys.stdlib_module_names`` whose source is a ``.py`` file
   (``importlib.util.find_spec(name).origin``), names sorted; the sources are parsed, nothing
   is imported.

How it is cut: each text is split into paragraphs at blank lines; a paragraph is kept only if it
reads as prose (no ``>>>``, ``::=`` or ``...``, not a heading underline, at least 90% letters and
spaces: code and grammar blocks go); its lines are joined and split into sentences after
``. ! ? ; :``; a sentence is cut at its commas into pieces, packed greedily into clauses of at
most ``MAX_WORDS`` words (a piece longer than that is dropped). Tokens are the lowercase words
(``[a-z]+`` with an inner apostrophe, or a run of digits); clauses of fewer than 2 words are
dropped. Every 10th clause (index 0, 10, 20, ...) is held out; the vocabulary is every word seen
at least ``MIN_COUNT`` times in the other clauses (commonest first), then ``<unk>`` (every other
word) and ``<eos>``, which ends every clause. On Python 3.11.7: 14,419 clauses (146,042 words),
3,210 tokens.

The text is the running Python's own, so it differs between Python versions (and builds missing
some modules): the cached model files' names carry a digest of the clauses
(``text-<digest>_target.npz``), so another Python trains its own.

The models are made as ``workload.py`` says (fixed seeds, cached, regenerated when missing).

    python3 benchmarks/text.py --out DIR        # train (or load) and print held-out NLLs
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import re
import sys
import warnings
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import workload  # noqa: E402
from workload import Setup  # noqa: E402

MAX_WORDS = 19  # a clause's words; with <eos>, sentences of up to MAX_LEN tokens
MAX_LEN = MAX_WORDS + 1
MIN_COUNT = 3  # a word's training occurrences to be in the vocabulary
HELDOUT_EVERY = 10
UNK, EOS = "<unk>", "<eos>"
PROMPTS = ("the", "if the", "return the", "this function")
"""The benchmark's prompts: the commonest first word and first pairs of clauses in the text;
their continuations range over the whole documentation."""

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+")
_UNDERLINE = re.compile(r"[*=\-^~]+")


def documents() -> list[str]:
    """The source texts, in order: pydoc's topics (key order), then the standard library's
    docstrings (see the module docstring)."""
    from pydoc_data.topics import topics

    docs = [topics[key] for key in sorted(topics)]
    for name in sorted(sys.stdlib_module_names):
        spec = importlib.util.find_spec(name)
        if spec is None or not (spec.origin or "").endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old sources: their docstrings still parse
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(doc)
    return docs


def _is_prose(lines: list[str]) -> bool:
    text = " ".join(line.strip() for line in lines)
    if ">>>" in text or "::=" in text or "..." in text or _UNDERLINE.fullmatch(lines[-1].strip()):
        return False
    return sum(ch.isalpha() or ch == " " for ch in text) >= 0.9 * len(text)


def clauses_of(text: str) -> list[tuple[str, ...]]:
    """The clauses of one text, as word tuples (see the module docstring for the cut)."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [line for line in para.split("\n") if line.strip()]
        if not lines or not _is_prose(lines):
            continue
        for sentence in re.split(r"(?<=[.!?;:])\s+", " ".join(line.strip() for line in lines)):
            clause: list[str] = []
            for piece in sentence.split(","):
                words = _WORD.findall(piece.lower())
                if len(clause) + len(words) <= MAX_WORDS:
                    clause += words
                    continue
                out.append(tuple(clause))
                clause = words if len(words) <= MAX_WORDS else []
            out.append(tuple(clause))
    return [c for c in out if len(c) >= 2]


@functools.lru_cache(maxsize=1)
def clauses() -> tuple:
    """Every clause of the text, in order (word tuples)."""
    return tuple(c for doc in documents() for c in clauses_of(doc))


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple:
    """The words: training words seen at least ``MIN_COUNT`` times (commonest first, ties in
    alphabetical order), then ``<unk>``, then ``<eos>`` (the last token)."""
    counts = Counter(w for i, c in enumerate(clauses()) if i % HELDOUT_EVERY for w in c)
    common = sorted((w for w, n in counts.items() if n >= MIN_COUNT), key=lambda w: (-counts[w], w))
    return tuple(common) + (UNK, EOS)


@functools.lru_cache(maxsize=1)
def _ids() -> dict:
    return {w: i for i, w in enumerate(vocabulary())}


def encode(text: str, *, eos: bool = False) -> tuple[int, ...]:
    """Token ids of space-separated lowercase ``text`` (a word outside the vocabulary is ``<unk>``)."""
    ids = _ids()
    return tuple(ids.get(w, ids[UNK]) for w in text.split()) + ((ids[EOS],) if eos else ())


def decode(ids) -> str:
    words = vocabulary()
    return " ".join(words[int(i)] for i in ids)


@functools.lru_cache(maxsize=2)
def split(heldout: bool) -> tuple:
    """The training (``heldout=False``) or held-out clauses, token tuples ending in ``<eos>``."""
    return tuple(encode(" ".join(c), eos=True) for i, c in enumerate(clauses()) if (i % HELDOUT_EVERY == 0) == heldout)


@functools.lru_cache(maxsize=1)
def digest() -> str:
    """12 hex digits of SHA-256 over the clauses: the cache files' name (the text is Python's own)."""
    return hashlib.sha256("\n".join(" ".join(c) for c in clauses()).encode()).hexdigest()[:12]


def setups() -> dict:
    """``{"full": FULL, "quick": QUICK}`` for the running Python's text."""
    name = f"text-{digest()}"
    return {
        "full": Setup(name, "full", corpus_size=None, d_model=128, n_layers=2, n_heads=4, steps=2500,
                      batch_size=64, lr=3e-3, dropout=0.1, draft_order=3, student_d_model=64, student_layers=1,
                      student_heads=2, distill_steps=1000, distill_lr=1e-2),
        "quick": Setup(name, "quick", corpus_size=1000, d_model=32, n_layers=1, n_heads=2, steps=60, batch_size=32,
                       lr=1e-2, draft_order=3, student_d_model=16, student_layers=1, student_heads=2,
                       distill_steps=30, distill_lr=1e-2),
    }


def data(setup: Setup) -> workload.Data:
    """What ``setup``'s models are made from: the vocabulary and the first ``corpus_size`` training
    clauses (all of them for None)."""
    words = vocabulary()
    return workload.Data(words=words, eos=len(words) - 1, max_len=MAX_LEN, train=split(False)[:setup.corpus_size])


def load_or_train(setup: Setup, folder: str | None, *, progress: bool = False):
    """:func:`workload.load_or_train` on this workload: ``(target, student, seconds)``."""
    return workload.load_or_train(setup, data(setup), folder, progress=progress)


def fit_draft(setup: Setup):
    """The n-gram draft: interpolated Kneser-Ney over words, fitted on the same training clauses."""
    return workload.fit_draft(setup, data(setup))


def heldout_nll(models: dict) -> dict:
    """Mean per-token NLL (nats, ``<eos>`` included) of each model on the held-out clauses."""
    return workload.nll_per_token(models, split(True))


def main(argv=None) -> int:
    return workload.main(argv, __doc__.splitlines()[0], setups(), data, heldout_nll)


if __name__ == "__main__":
    sys.exit(main())
