"""The names demo: a shipped character transformer (target), an n-gram fitted at start-up (draft).

Everything the ``jaxrescore demo`` / ``enumerate`` / ``train`` commands do lives here as plain
functions returning plain data; :mod:`jaxrescore.cli` only parses arguments and prints. The
searches themselves live in the library (``RescoredIndex.top_k(k, prove=True)``,
``until_certified=True``, :func:`~jaxrescore.baselines.best_first.best_first_top_k`).

The demo leads with the PROVEN top-k: the target's exact answer, with no assumption, found by the
speculative exact search. Next to it, what the same answer costs an exact best-first search over
the target (no draft), and the spec's gap-certified query. That certificate needs an assumed gap
``G``; it only has to hold where an answer can come from: if every sequence with target log-prob
``>= tau`` has ``target - draft <= G``, and the worst returned score ``w`` satisfies ``w >= tau``
and ``w >= bound + G``, no unpulled sequence can beat ``w``. The default ``G`` is the one-sided gap
observed on measured sequences above ``tau`` (:func:`~jaxrescore.rescore.gap.estimate_top_gap`)
plus a margin, and the demo reports whether ``w >= tau``. It is an estimate from a finite sample:
the output always says so.
"""

from __future__ import annotations

import contextlib
import os
import textwrap
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from jaxrescore.data.names import EOS, MAX_NAME_LEN, VOCAB_SIZE, encode, load_names

MAX_LEN = MAX_NAME_LEN + 1
"""Longest sequence of the demo models, EOS included."""
TARGET_FILE = "names_target.npz"
TRAIN_SEED = 0
TRAIN_STEPS = 7000
TRAIN_BATCH = 256
# Learning-rate phases (fraction of the steps, lr): a short constant-lr run per phase is a cheap
# step-decay schedule that train_lm's constant adamw supports as is.
TRAIN_PHASES = ((4 / 7, 3e-3), (2 / 7, 1e-3), (1 / 7, 3e-4))


def target_config():
    """The demo target's shape: 2 layers, d_model 64, 4 heads, 105k parameters."""
    from jaxrescore.models.transformer import TransformerConfig

    return TransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, max_len=MAX_LEN, eos=EOS
    )


def name_corpus() -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The shipped names as EOS-terminated token tuples and their birth counts ``float64[N]``."""
    names = load_names()
    return [encode(n) for n, _ in names], np.array([c for _, c in names], np.float64)


def shipped_target_path() -> Path:
    """Path of the shipped target weights inside the installed package."""
    return Path(str(resources.files("jaxrescore.data").joinpath(TARGET_FILE)))


def default_train_path() -> Path:
    """Where ``jaxrescore train`` writes by default: ``$XDG_DATA_HOME/jaxrescore/names_target.npz``
    (``~/.local/share/jaxrescore/names_target.npz`` without XDG_DATA_HOME), a user path, never
    inside the installed package."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "jaxrescore" / TARGET_FILE


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_train_output(out: str | os.PathLike | None, *, force: bool = False) -> Path:
    """The path :func:`train_demo_target` will write, checked BEFORE any training (minutes of it):
    not a folder, in a folder that exists (only the default path's folder is created: a typo in
    a path given explicitly should not leave a tree of new folders behind) and that is writable
    (probed with a temporary file, removed at once), and not the weights shipped inside the
    package unless ``force`` (overwriting them changes what ``jaxrescore demo`` runs for everyone
    using this installation). DemoArgumentError naming the path otherwise.

    Args:
      out: the file to write; None: :func:`default_train_path` (its folder created if missing).
      force: allow ``out`` to be the shipped weights file.
    """
    import tempfile

    if not isinstance(force, bool):
        raise DemoArgumentError(f"force must be True or False, got {force!r}")
    path = default_train_path() if out is None else Path(out).expanduser()
    if path.is_dir():
        raise DemoArgumentError(f"out {str(path)!r} is a folder; give a file path such as {str(path / TARGET_FILE)!r}")
    if _same_file(path, shipped_target_path()) and not force:
        raise DemoArgumentError(
            f"out {str(path)!r} is the target shipped inside the package; retraining would replace "
            "what `jaxrescore demo` runs for every user of this installation. Pass --force (force=True) "
            "to overwrite it, or write elsewhere"
        )
    folder = path.parent
    if out is not None and not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DemoArgumentError(
            f"cannot write {str(path)!r}: the folder {str(folder)!r} {what} (create it first; only "
            "the default path's folder is created)"
        )
    try:
        if out is None:
            folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".jaxrescore-probe-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise DemoArgumentError(f"cannot write {str(path)!r}: {err.strerror or err}") from None
    return path


def names_vocabulary() -> tuple[str, ...]:
    """The demo models' token strings: ``a``..``z`` then ``<eos>``."""
    from jaxrescore.data.names import ALPHABET

    return tuple(ALPHABET) + ("<eos>",)


def train_demo_target(
    out: str | os.PathLike | None = None,
    *,
    steps: int = TRAIN_STEPS,
    seed: int = TRAIN_SEED,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Train the demo target from scratch and save it (``save_model`` format, with the names
    vocabulary); returns the path. The path is checked first (:func:`check_train_output`).

    Batches sample names in proportion to birth count, so the model learns the distribution of
    first names of people born in the US 1880-2017. Deterministic for a given ``seed`` and
    ``steps`` on one platform.

    Args:
      out: where to write (default: :func:`default_train_path`, a user path outside the package).
      steps: optimisation steps in all (batch 256, adamw, step-decayed learning rate).
      seed: initialisation and batch-sampling seed.
      progress: show one tqdm bar over all the steps (every learning-rate phase), with the
        time left and the running loss.
      force: allow ``out`` to be the weights shipped inside the package (the source
        repository's ``scripts/train_demo.py`` regenerates them so).
    """
    from jaxrescore.models.checkpoint import save_model
    from jaxrescore.models.training import train_lm
    from jaxrescore.models.transformer import TransformerLM

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < len(TRAIN_PHASES):
        raise DemoArgumentError(f"steps must be an integer >= {len(TRAIN_PHASES)}, got {steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DemoArgumentError(f"seed must be an integer >= 0, got {seed!r}")
    path = check_train_output(out, force=force)
    seqs, counts = name_corpus()
    model = TransformerLM(target_config(), seed=seed)
    done = 0
    with _one_bar(steps, progress) as shown:
        for phase, (share, lr) in enumerate(TRAIN_PHASES):
            n = steps - done if phase == len(TRAIN_PHASES) - 1 else max(1, int(share * steps))
            train_lm(
                model, seqs, weights=counts, steps=n, batch_size=TRAIN_BATCH, lr=lr,
                seed=seed + phase, progress=shown,
            )
            done += n
    save_model(model, path, vocabulary=names_vocabulary())
    return path


class _Steps:
    """What ``train_lm`` takes for its per-call tqdm bar: iterates over its steps while moving the
    one overall bar, and shows the running loss there."""

    def __init__(self, bar, iterable):
        self.bar, self.iterable = bar, iterable

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.bar.update(1)

    def set_postfix(self, **kwargs):
        self.bar.set_postfix(**kwargs)


@contextlib.contextmanager
def _one_bar(total: int, progress: bool):
    """One tqdm bar over every phase's steps (time left included) while the phases train: the
    bar ``train_lm`` would open per call is swapped for a view of this one. Yields the
    ``progress`` flag to pass to ``train_lm`` (True only when the swap is in place)."""
    from tqdm.auto import tqdm

    from jaxrescore.models import training

    if not progress or not hasattr(training, "tqdm"):
        yield progress
        return
    with tqdm(total=total, desc="training the demo target", unit="step") as bar:
        original = training.tqdm
        training.tqdm = lambda iterable, **_: _Steps(bar, iterable)
        try:
            yield True
        finally:
            training.tqdm = original


# ---- models ------------------------------------------------------------------------------------

DRAFT_ORDER = 6
PROVE_WINDOW = 32
"""Draft candidates beyond k in the proving run's first round (measured on the names models:
fewer rounds than 0, fewer sequences than 64)."""
FIRST_WINDOW = 64
GAP_REGION_MARGIN = 1.0
GAP_TOP_NAMES = 4096
GAP_SAMPLES = 1024
GAP_MARGIN = 1.0


def fit_draft(order: int = DRAFT_ORDER):
    """The draft: an interpolated Kneser-Ney character n-gram fitted on the shipped names, each
    weighted by its birth count (normalised to mean 1, so the discount acts on a per-name scale).
    Fitting takes well under a second."""
    from jaxrescore.models.ngram import NGramLM

    seqs, counts = name_corpus()
    return NGramLM.fit(
        seqs, order=order, vocab_size=VOCAB_SIZE, eos=EOS, max_len=MAX_LEN,
        weights=counts * (len(counts) / counts.sum()),
    )


def load_target(path: str | os.PathLike | None = None):
    """The demo target (shipped weights by default, stored with the names vocabulary, so its
    sequences print as text), or any model saved with ``save_model``."""
    from jaxrescore.models.checkpoint import load_model

    path = shipped_target_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {str(path)!r}")
    _check_archive(path)
    try:
        model = load_model(path)
    except ValueError as e:
        raise DemoArgumentError(str(e)) from None
    return model


def _check_archive(path: Path) -> None:
    """A model file is an .npz (zip) archive: anything else is refused here in words, before numpy
    reads it (its advice for non-archives is to allow pickles, which a model file never needs)."""
    from jaxrescore.models.checkpoint import is_archive

    if is_archive(path):
        return
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
        kind = "a text file"
    except UnicodeDecodeError as err:
        kind = "a text file" if err.start > len(head) - 4 else "not an .npz archive"
    hint = " (to fit an n-gram draft on a text corpus: jaxrescore enumerate --draft-corpus FILE)" if kind == "a text file" else ""
    raise DemoArgumentError(
        f"{str(path)!r} is not a jaxrescore model file: it is {kind}, and a model file is the .npz "
        f"archive jaxrescore.models.save_model writes{hint}"
    )


class DemoArgumentError(ValueError):
    """A bad argument to a demo entry point (the CLI reports it in one line, exit status 2)."""


def check_prefix(prefix: str) -> tuple[int, ...]:
    """The prompt tokens of ``prefix`` (lowercase a-z, at most ``MAX_NAME_LEN - 1`` letters)."""
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


def gap_source(estimate, margin: float = GAP_MARGIN) -> str:
    """A sentence saying where an estimated ``assumed_gap`` came from."""
    return (
        f"assumed for sequences with target log-prob >= {estimate.region_lp:.3f} (the only ones "
        f"that could displace an answer): max target - draft = {estimate.excess:.3f} nats over "
        f"{estimate.n_region} such sequences (of {estimate.n_distinct} scored: the "
        f"{estimate.n_candidates} commonest names and {estimate.n_samples} target samples) "
        f"plus {margin:g} nat; an assumption, not a proof"
    )


# ---- queries -----------------------------------------------------------------------------------


def _draft_index(draft, progress: bool):
    """The draft's SeekIndex; its first build shows a progress bar when ``progress``, later
    deepenings only when they run long (so short passes do not print empty bars)."""
    from jaxrescore.index.seek import SeekIndex

    index = SeekIndex(draft, progress=progress or False)
    index.progress = None if progress else False
    return index


def _check_window(window) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise DemoArgumentError(f"window must be None or an integer >= 0, got {window!r}")
    return window


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DemoArgumentError(f"k must be a positive integer, got {k!r}")
    return k


def _check_gap(gap) -> float | None:
    if gap is None:
        return None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap < float("inf"):
        raise DemoArgumentError(f"gap must be a finite number >= 0 (nats), got {gap!r}")
    return float(gap)


def proven_top_k(index, target, k: int, window: int | None) -> dict:
    """The proven top-``k``: ``RescoredIndex(index, target).top_k(k, prove=True)`` and its cost."""
    from jaxrescore.rescore.rescored_index import RescoredIndex

    rescored = RescoredIndex(index, target, rerank_window=PROVE_WINDOW if window is None else window)
    result = rescored.top_k(k, prove=True)
    return {
        "result": result,
        "proven": result.proven,
        "frontier_bound": _finite_or_none(result.frontier_bound),
        "proof_reason": result.proof_reason,
        "rounds": result.rounds,
        "window": rescored.rerank_window,
        "target_calls": rescored.target_calls,
        "target_sequences": rescored.target_sequences,
    }


def certified_top_k(index, target, k: int, window: int | None, gap: float) -> dict:
    """The spec's gap-certified top-``k``: with ``window=None`` a :data:`FIRST_WINDOW` query grown
    until certified (``until_certified``), else one query with that window."""
    from jaxrescore.rescore.rescored_index import RescoredIndex

    rescored = RescoredIndex(index, target, rerank_window=FIRST_WINDOW if window is None else window, assumed_gap=gap)
    result = rescored.top_k(k, until_certified=window is None)
    return {
        "result": result,
        "certified": result.certified,
        "worst_log_prob": result.items[-1][1] if result.items else None,
        "bound": result.bound,
        "gap": result.gap,
        "excess": _finite_or_none(result.excess),
        "reason": result.reason,
        "assumed_gap": gap,
        "window": rescored.rerank_window,
        "rounds": result.rounds,
        "target_calls": rescored.target_calls,
        "target_sequences": rescored.target_sequences,
    }


def best_first_cost(target, k: int) -> dict:
    """What the exact answer costs without a draft: batched best-first search over the target."""
    from jaxrescore.baselines.best_first import best_first_top_k

    found = best_first_top_k(target, k)
    return {"forwards": found.forwards, "calls": found.calls, "items": [s for s, _ in found.items]}


def _finite_or_none(value):
    return value if value is not None and np.isfinite(value) else None


def _same_answer(a: list, b: list) -> bool:
    return [tuple(x) for x in a] == [tuple(x) for x in b]


def run_demo(
    *,
    k: int = 25,
    window: int | None = None,
    gap: float | None = None,
    prefix: str = "",
    target_path: str | os.PathLike | None = None,
    progress: bool = True,
    measure_exact: bool = True,
    certify: bool = True,
    on_stage: Callable[[str], None] | None = None,
    on_answer: Callable[[dict], None] | None = None,
) -> dict:
    """The names demo, end to end: the PROVEN ``k`` likeliest names under the target, found through
    the n-gram draft's SeekIndex, next to what an exact best-first search over the target costs and
    to the spec's gap-certified query.

    Args:
      k: names to return.
      window: rerank window of both runs; None: :data:`PROVE_WINDOW` for the proof, and a
        certificate-driven window for the gap run (see :func:`certified_top_k`).
      gap: assumed max ``target - draft`` in nats for the gap run; None = estimated with
        :func:`~jaxrescore.rescore.gap.estimate_top_gap` plus :data:`GAP_MARGIN`.
      prefix: only names starting with it (both models are prompted with it; log-probs are then
        conditional on the prefix).
      target_path: target weights (default: the shipped ones).
      progress: show the draft index's progress bar.
      measure_exact: also run the exact best-first search over the target.
      certify: also run the gap-certified query.
      on_stage: called with a short description as each stage starts (the CLI shows it on a
        terminal, so a long run is never silent).
      on_answer: called with the answer part of the result (``items``, ``true_top_k_overlap``,
        the proof keys, ``k``, ``prefix``) as soon as it is proven, before the comparisons run
        (the CLI prints the table then).

    Returns:
      A JSON-ready dict: ``items`` (``text``, ``target_log_prob``, ``draft_log_prob``,
      ``birth_rank``: rank by birth count, None for a string that is not a shipped name),
      ``true_top_k_overlap`` (how many items are among the ``k`` commonest names with the prefix),
      the proof (``proven``, ``frontier_bound``, ``proof_reason``, ``rounds``, ``window``,
      ``target_calls``, ``target_sequences``), ``exact_best_first`` (``forwards``, ``calls``,
      ``same_answer``) or None, ``gap_certified`` (``certified``, ``bound``, ``gap``, ``excess``,
      ``reason``, ``assumed_gap``, ``gap_source``, ``gap_region_lp``,
      ``gap_calibration_sequences``, ``gap_covers_answers``, ``window``, ``rounds``,
      ``target_calls``, ``target_sequences``, ``same_answer``) or None, ``draft_forwards``,
      ``seconds`` and the arguments.
    """
    import time

    from jaxrescore.data.names import decode, name_ranks

    k, window, gap = _check_k(k), _check_window(window), _check_gap(gap)
    prompt = check_prefix(prefix)
    stage = on_stage or (lambda text: None)
    start = time.perf_counter()
    stage("loading the target and fitting the draft")
    target, draft = load_target(target_path), fit_draft()
    if prompt:
        target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
    stage(f"building the draft index and proving the top {k}")
    index = _draft_index(draft, progress)
    proof = proven_top_k(index, target, k, window)
    result = proof.pop("result")
    answer = [s for s, _ in result.items]
    ranks = name_ranks()
    texts = [prefix + decode(seq) for seq in answer]
    true_top = [n for n, _ in load_names() if n.startswith(prefix)][:k]
    out = {
        "items": [
            {"text": text, "target_log_prob": lp, "draft_log_prob": _finite_or_none(dlp), "birth_rank": ranks.get(text)}
            for text, (_, lp), dlp in zip(texts, result.items, result.draft_log_probs)
        ],
        "true_top_k_overlap": len(set(true_top).intersection(texts)),
        **proof,
        "k": k,
        "prefix": prefix,
    }
    if on_answer is not None:
        on_answer(dict(out))
    exact = None
    if measure_exact:
        stage("exact best-first search over the target, for comparison")
        exact = best_first_cost(target, k)
        exact["same_answer"] = _same_answer(exact.pop("items"), answer)
    certified = None
    if certify:
        stage("running the gap-certified query" if gap is not None else "estimating the gap and running the gap-certified query")
        certified = _gap_run(index, draft, target, k, window, gap, prefix, answer)
    out.update(
        exact_best_first=exact,
        gap_certified=certified,
        draft_forwards=int(index.forwards),
        seconds=time.perf_counter() - start,
    )
    return out


def _gap_run(index, draft, target, k, window, gap, prefix, answer) -> dict:
    """The gap-certified query of :func:`run_demo`, with where its gap came from."""
    from jaxrescore.rescore.gap import estimate_top_gap

    if gap is None:
        common = [encode(n[len(prefix):]) for n, _ in load_names() if n.startswith(prefix)]
        estimate = estimate_top_gap(draft, target, k, common[:GAP_TOP_NAMES], n_samples=GAP_SAMPLES, region_margin=GAP_REGION_MARGIN)
        gap, source = estimate.excess + GAP_MARGIN, gap_source(estimate)
        region, calibration = estimate.region_lp, estimate.n_distinct
    else:
        source, region, calibration = "given with --gap", None, 0
    out = certified_top_k(index, target, k, window, gap)
    result = out.pop("result")
    out.update(
        gap_source=source,
        gap_region_lp=region,
        gap_calibration_sequences=calibration,
        gap_covers_answers=None if region is None or not result.items else result.items[-1][1] >= region,
        same_answer=_same_answer([s for s, _ in result.items], answer),
    )
    return out


# ---- printing ----------------------------------------------------------------------------------

WIDTH = 100
"""Columns of the printed output."""
UNITS = "log-prob = natural log of a probability, in nats (0 is certain; -2.3 is 10%)"


def _nats(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _wrapped(lines: list[str]) -> list[str]:
    """Long lines folded to :data:`WIDTH` columns, continuation lines indented."""
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]
    return out


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns (an ellipsis marks the cut)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _proof_lines(out: dict) -> list[str]:
    return [
        f"proven exact (no assumption): {out['proven']} — {out['proof_reason']}",
        f"target cost: {out['rounds']} scoring round(s), {out['target_calls']} batched call(s), "
        f"{out['target_sequences']} sequences scored by teacher forcing (window {out['window']})",
    ]


def _exact_lines(out: dict) -> list[str]:
    exact = out.get("exact_best_first")
    if not exact:
        return []
    same = "the same answer" if exact["same_answer"] else "A DIFFERENT answer"
    return [
        f"exact best-first search over the target: {exact['forwards']} prefix forwards in "
        f"{exact['calls']} batched calls ({same})"
    ]


def _certificate_verdict(cert: dict) -> str:
    """The gap certificate in plain words, from the result's numbers (the library's ``reason``
    is kept for cases these do not cover; the JSON carries it verbatim)."""
    verdict, gap, bound, worst = cert["certified"], cert["assumed_gap"], cert["bound"], cert.get("worst_log_prob")
    if verdict and bound is None:
        return "certified: True — every sequence the draft can produce was scored"
    if not verdict and cert.get("excess") is not None and "refuted" in cert["reason"]:
        return (
            f"certified: False — the assumed gap {gap:.3f} is contradicted: a scored sequence has "
            f"target - draft = {cert['excess']:.3f} nats"
        )
    if bound is not None and worst is not None and np.isfinite(bound):
        verb = "clears" if verdict else "does not clear"
        return (
            f"certified: {verdict} — the worst answer ({worst:.3f}) {verb} the highest draft "
            f"log-prob left unscored ({bound:.3f}) + the assumed gap ({gap:.3f}) + float tolerance"
        )
    return f"certified: {verdict} — {cert['reason']}"


def _certificate_lines(cert: dict | None) -> list[str]:
    if cert is None:
        return []
    lines = [
        "gap-certified query (complete IF target - draft <= the assumed gap wherever an answer "
        "could come from):",
        f"  {_certificate_verdict(cert)}",
        f"  assumed gap {cert['assumed_gap']:.3f} nats: {cert['gap_source']}",
        f"  observed over the rescored sequences: max |target - draft| {cert['gap']:.3f} nats, "
        f"max target - draft {_nats(cert['excess'])} nats",
        f"  cost: {cert['rounds']} round(s), {cert['target_calls']} call(s), "
        f"{cert['target_sequences']} sequences (window {cert['window']})"
        + ("" if cert["same_answer"] else "; its answer DIFFERS from the proven one"),
    ]
    if cert.get("gap_calibration_sequences"):
        lines.append(
            f"  gap calibration (one-off per model pair, not counted above): "
            f"{cert['gap_calibration_sequences']} sequences scored"
        )
    if cert.get("gap_covers_answers") is False:
        lines.append(
            "  WARNING: the answers fall below the region the gap was estimated on, so the "
            "certificate's assumption does not cover them"
        )
    return lines


def format_demo_answer(out: dict) -> str:
    """The proven answer: the names table, the overlap with the commonest names and the proof
    (what ``on_answer`` of :func:`run_demo` receives is enough)."""
    cond = f" starting with {out['prefix']!r}" if out["prefix"] else ""
    lines = _wrapped([
        f"top {out['k']} US first names{cond} under a character transformer (target), found through "
        f"a character {DRAFT_ORDER}-gram (draft)",
        UNITS + (", conditional on the prefix" if out["prefix"] else ""),
    ]) + [f"{'rank':>4}  {'name':<16}{'target (nats)':>15}{'draft (nats)':>15}  {'birth rank':>10}"]
    for i, item in enumerate(out["items"], 1):
        rank = item["birth_rank"]
        lines.append(
            f"{i:>4}  {_fit(item['text'], 16):<16}{item['target_log_prob']:>15.3f}"
            f"{_nats(item['draft_log_prob']):>15}  {rank if rank is not None else '-':>10}"
        )
    lines.append(
        f"{out['true_top_k_overlap']} of these are among the {out['k']} commonest names{cond} "
        "by birth count (SSA, 1880-2017)"
    )
    return "\n".join(lines + _wrapped(_proof_lines(out)))


def format_demo_details(out: dict) -> str:
    """What follows the answer: the best-first comparison, the gap certificate, the costs."""
    notes = _exact_lines(out) + _certificate_lines(out.get("gap_certified"))
    notes.append(
        f"draft index: {out['draft_forwards']} n-gram prefix forwards; wall time of the whole "
        f"run (loading models, draft index, proof, comparisons, gap estimate): {out['seconds']:.1f} s"
    )
    return "\n".join(_wrapped(notes))


def format_demo(out: dict) -> str:
    """The whole demo result as text: :func:`format_demo_answer` then :func:`format_demo_details`."""
    return format_demo_answer(out) + "\n" + format_demo_details(out)


# ---- your own models ---------------------------------------------------------------------------

DEFAULT_CORPUS_ORDER = 3


def read_corpus(path, model) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Sequences of ``model``'s support from a text file, one per line, and their weights.

    A line is ``TEXT`` or ``TEXT<TAB>COUNT`` (the count weights the line, e.g. a frequency; the
    shipped ``names.tsv.gz`` uncompressed is such a file). ``TEXT`` is read with the model's
    vocabulary when it carries one (characters for a character vocabulary, else
    whitespace-separated token strings), else as whitespace- or comma-separated token ids. A
    terminating model's ``eos`` is appended; a fixed-length model needs every line to have
    exactly ``max_len`` tokens. Blank lines are skipped. DemoArgumentError naming the file and
    line for anything else.
    """
    from jaxrescore.models.vocabulary import check_vocabulary, encode_text

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {str(path)!r}")
    vocab = check_vocabulary(getattr(model, "vocabulary", None), model.vocab_size)
    eos = model.eos
    seqs, weights = [], []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DemoArgumentError(f"cannot read corpus {str(path)!r}: {err}") from None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{number}"
        body, _, count = line.rstrip("\r\n").partition("\t")
        if not body.strip():
            continue
        try:
            weight = float(count) if count else 1.0
        except ValueError:
            raise DemoArgumentError(f"{where}: count {count!r} is not a number") from None
        if not (weight >= 0 and np.isfinite(weight)):
            raise DemoArgumentError(f"{where}: count {count!r} must be a finite number >= 0")
        try:
            if vocab is not None:
                seq = encode_text(body, vocab, eos)
            else:
                ids = tuple(int(t) for t in body.replace(",", " ").split())
                seq = ids + (() if eos is None or (ids and ids[-1] == eos) else (eos,))
        except ValueError as err:
            hint = "" if vocab is not None else " (the model has no vocabulary: lines are token ids)"
            raise DemoArgumentError(f"{where}: {err}{hint}") from None
        bad = [t for t in seq if not 0 <= t < model.vocab_size]
        if bad:
            raise DemoArgumentError(f"{where}: token ids {bad[:3]} outside [0, {model.vocab_size})")
        if eos is not None and eos in seq[:-1]:
            raise DemoArgumentError(f"{where}: eos={eos} inside the line")
        if (eos is None and len(seq) != model.max_len) or len(seq) > model.max_len:
            need = f"exactly {model.max_len}" if eos is None else f"at most {model.max_len} (eos included)"
            raise DemoArgumentError(f"{where}: {len(seq)} tokens; the target needs {need}")
        seqs.append(seq)
        weights.append(weight)
    if not seqs or sum(weights) <= 0:
        raise DemoArgumentError(f"corpus {str(path)!r} holds no sequence with a positive count")
    return seqs, np.asarray(weights, np.float64)


def fit_corpus_draft(path, target, order: int = DEFAULT_CORPUS_ORDER):
    """An n-gram draft of ``order`` fitted on the corpus file ``path`` (see :func:`read_corpus`),
    in the target's support and vocabulary; the weights are normalised to mean 1, as
    :func:`fit_draft` does."""
    from jaxrescore.models.ngram import NGramLM

    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise DemoArgumentError(f"draft order must be an integer >= 1, got {order!r}")
    seqs, weights = read_corpus(path, target)
    try:
        draft = NGramLM.fit(
            seqs, order=order, vocab_size=target.vocab_size, eos=target.eos, max_len=target.max_len,
            weights=weights * (len(weights) / weights.sum()),
        )
    except ValueError as err:
        raise DemoArgumentError(f"corpus {str(path)!r}: {err}") from None
    draft.vocabulary = getattr(target, "vocabulary", None)
    return draft


def _vocabulary(target, draft):
    """The token strings to print with: the target's, else the draft's (None: print ids)."""
    tv, dv = getattr(target, "vocabulary", None), getattr(draft, "vocabulary", None)
    if tv is not None and dv is not None and tv != dv:
        raise DemoArgumentError("target and draft carry different vocabularies; they must agree token by token")
    return tv if tv is not None else dv


def _prompt_tokens(prompt, prompt_text, vocabulary, eos) -> tuple[int, ...]:
    from jaxrescore.models.vocabulary import encode_text

    if prompt_text is None:
        return tuple(prompt)
    if prompt:
        raise DemoArgumentError("give the prompt as token ids or as text, not both")
    if vocabulary is None:
        raise DemoArgumentError("prompt text needs models that carry a vocabulary; give token ids instead")
    try:
        return encode_text(prompt_text, vocabulary, None if eos is None else eos)[: None if eos is None else -1]
    except ValueError as err:
        raise DemoArgumentError(f"prompt text: {err}") from None


def run_enumerate(
    *,
    target_path,
    draft_path=None,
    draft_corpus=None,
    draft_order: int = DEFAULT_CORPUS_ORDER,
    k: int = 25,
    window: int | None = None,
    gap: float | None = None,
    prompt: tuple[int, ...] = (),
    prompt_text: str | None = None,
    bits: float | None = None,
    progress: bool = True,
    on_stage: Callable[[str], None] | None = None,
    on_answer: Callable[[dict], None] | None = None,
) -> dict:
    """The proven top-``k`` of a user's own saved target, found through their own draft, plus the
    gap-certified query when ``gap`` is given.

    Args:
      target_path: the target's model file (any :func:`~jaxrescore.models.save_model` file).
      draft_path: the draft's model file; or
      draft_corpus, draft_order: a text corpus (see :func:`read_corpus`) to fit an n-gram draft
        of that order on. Exactly one of ``draft_path`` and ``draft_corpus``.
      k, window: as in :func:`run_demo`.
      gap: assumed max ``target - draft``; None = no gap-certified query (the proof needs none).
      prompt: token ids to condition both models on; or ``prompt_text``, read with the models'
        vocabulary.
      bits: optional depth budget of the draft index to build up front.
      progress, on_stage, on_answer: as in :func:`run_demo`.

    Returns:
      A JSON-ready dict: ``items`` (``tokens``: the continuation's ids, ``text``: prompt and
      continuation decoded with the models' vocabulary, or the ids when they carry none,
      ``target_log_prob``, ``draft_log_prob``), the proof keys of :func:`run_demo`,
      ``gap_certified`` (or None), ``draft_forwards``, ``vocabulary`` (whether text was
      decoded; fewer than ``k`` items only when ``k`` exceeds the target's support, which is
      never returned past), ``seconds`` and the arguments.
    """
    import time

    from jaxrescore.models.vocabulary import decode_tokens

    k, window, gap = _check_k(k), _check_window(window), _check_gap(gap)
    if (draft_path is None) == (draft_corpus is None):
        raise DemoArgumentError("give exactly one draft: a saved model (--draft) or a corpus (--draft-corpus)")
    if bits is not None and (isinstance(bits, bool) or not 0 <= bits < float("inf")):
        raise DemoArgumentError(f"bits must be a finite number >= 0, got {bits!r}")
    stage = on_stage or (lambda text: None)
    start = time.perf_counter()
    stage("loading the models")
    target = load_target(target_path)
    if draft_corpus is not None:
        stage(f"fitting a {draft_order}-gram draft on {draft_corpus}")
        draft = fit_corpus_draft(draft_corpus, target, draft_order)
    else:
        draft = load_target(draft_path)
    if (target.vocab_size, target.eos) != (draft.vocab_size, draft.eos):
        raise DemoArgumentError(
            f"target (vocab_size={target.vocab_size}, eos={target.eos}) and draft "
            f"(vocab_size={draft.vocab_size}, eos={draft.eos}) must share vocab_size and eos"
        )
    vocabulary = _vocabulary(target, draft)
    prompt = _prompt_tokens(prompt, prompt_text, vocabulary, target.eos)
    if prompt:
        try:
            target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
        except ValueError as err:
            raise DemoArgumentError(f"prompt: {err}") from None
    stage(f"building the draft index and proving the top {k}")
    index = _draft_index(draft, progress)
    if bits is not None:
        index.ensure_bits(bits)
    proof = proven_top_k(index, target, k, window)
    result = proof.pop("result")

    def text(seq):
        full = tuple(prompt) + tuple(seq)
        return decode_tokens(full, vocabulary, target.eos) if vocabulary else " ".join(map(str, full))

    out = {
        "items": [
            {"tokens": list(seq), "text": text(seq), "target_log_prob": lp,
             "draft_log_prob": _finite_or_none(dlp)}
            for (seq, lp), dlp in zip(result.items, result.draft_log_probs)
        ],
        **proof,
        "vocabulary": vocabulary is not None,
        "k": k,
        "prompt": list(prompt),
    }
    if on_answer is not None:
        on_answer(dict(out))
    certified = None
    if gap is not None:
        stage("running the gap-certified query")
        certified = certified_top_k(index, target, k, window, gap)
        other = certified.pop("result")
        certified.update(
            gap_source="given with --gap",
            same_answer=_same_answer([s for s, _ in other.items], [s for s, _ in result.items]),
        )
    out.update(gap_certified=certified, draft_forwards=int(index.forwards), seconds=time.perf_counter() - start)
    return out


def format_enumerate_answer(out: dict) -> str:
    """The proven answer of :func:`run_enumerate`: the table and the proof."""
    what = "text" if out.get("vocabulary") else "tokens"
    cond = ", conditional on the prompt" if out.get("prompt") else ""
    width = WIDTH - 6 - 30
    lines = _wrapped([UNITS + cond]) + [f"{'rank':>4}  {what:<{width}}{'target (nats)':>15}{'draft (nats)':>15}"]
    for i, item in enumerate(out["items"], 1):
        lines.append(
            f"{i:>4}  {_fit(item['text'], width):<{width}}{item['target_log_prob']:>15.3f}"
            f"{_nats(item['draft_log_prob']):>15}"
        )
    if out["proven"] and len(out["items"]) < out["k"]:
        lines.append(
            f"(the target's whole support has {len(out['items'])} sequences: fewer than k={out['k']})"
        )
    return "\n".join(lines + _wrapped(_proof_lines(out)))


def format_enumerate_details(out: dict) -> str:
    """What follows the answer: the gap certificate (when asked for) and the costs."""
    notes = _certificate_lines(out.get("gap_certified"))
    notes.append(
        f"draft index: {out['draft_forwards']} prefix forwards; wall time of the whole run "
        f"(loading models, draft index, proof{', gap query' if out.get('gap_certified') else ''}): "
        f"{out['seconds']:.1f} s"
    )
    return "\n".join(_wrapped(notes))


def format_enumerate(out: dict) -> str:
    """The whole enumerate result as text: answer, then details."""
    return format_enumerate_answer(out) + "\n" + format_enumerate_details(out)
