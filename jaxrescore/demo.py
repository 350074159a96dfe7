"""The names demo: a shipped character transformer (target), an n-gram fitted at start-up (draft).

Everything the ``jaxrescore demo`` / ``enumerate`` / ``train`` commands do lives here as plain
functions returning plain data; :mod:`jaxrescore.cli` only parses arguments and prints.

The assumed gap. A character n-gram and a transformer disagree by many nats on strings far down
the distribution, so no useful gap holds globally. The certificate needs less: if every sequence
with target log-prob ``>= tau`` has ``|target - draft| <= G``, and the worst returned score ``w``
satisfies ``w >= tau`` and ``w >= bound + G``, then an unpulled sequence ``s`` with
``target(s) > w`` would have ``draft(s) >= target(s) - G > bound``, which no unpulled sequence
has. The default ``G`` is the gap observed on measured sequences above ``tau`` (the ``k``-th best
measured target score minus a nat) plus a margin, and the demo reports whether ``w >= tau``. It
is an estimate from a finite sample: the output always says so.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

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


def train_demo_target(
    out: str | os.PathLike | None = None,
    *,
    steps: int = TRAIN_STEPS,
    seed: int = TRAIN_SEED,
    progress: bool = True,
) -> Path:
    """Train the demo target from scratch and save it (``save_model`` format); returns the path.

    Batches sample names in proportion to birth count, so the model learns the distribution of
    first names of people born in the US 1880-2017. Deterministic for a given ``seed`` and
    ``steps`` on one platform.

    Args:
      out: where to write (default: the shipped weights file, overwritten atomically).
      steps: optimisation steps in all (batch 256, adamw, step-decayed learning rate).
      seed: initialisation and batch-sampling seed.
    """
    from jaxrescore.models.checkpoint import save_model
    from jaxrescore.models.training import train_lm
    from jaxrescore.models.transformer import TransformerLM

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < len(TRAIN_PHASES):
        raise ValueError(f"steps must be an integer >= {len(TRAIN_PHASES)}, got {steps!r}")
    seqs, counts = name_corpus()
    model = TransformerLM(target_config(), seed=seed)
    done = 0
    for phase, (share, lr) in enumerate(TRAIN_PHASES):
        n = steps - done if phase == len(TRAIN_PHASES) - 1 else max(1, int(share * steps))
        train_lm(
            model, seqs, weights=counts, steps=n, batch_size=TRAIN_BATCH, lr=lr,
            seed=seed + phase, progress=progress,
        )
        done += n
    path = Path(out) if out is not None else shipped_target_path()
    save_model(model, path)
    return path


# ---- models ------------------------------------------------------------------------------------

DRAFT_ORDER = 6
FIRST_WINDOW = 64
MAX_WINDOW = 16384
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
    """The demo target (shipped weights by default), or any model saved with ``save_model``."""
    from jaxrescore.models.checkpoint import load_model

    path = shipped_target_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {str(path)!r}")
    try:
        return load_model(path)
    except ValueError as e:
        raise DemoArgumentError(str(e)) from None


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


# ---- gap estimate ------------------------------------------------------------------------------


def estimate_region_gap(
    draft,
    target,
    candidates: list[tuple[int, ...]],
    k: int,
    *,
    n_samples: int = GAP_SAMPLES,
    region_margin: float = GAP_REGION_MARGIN,
    seed: int = 0,
) -> dict:
    """The observed max ``|target - draft|`` over the sequences a top-``k`` answer can come from.

    Why only there: an unpulled sequence can displace a returned one only if the target rates it
    at least as high as the worst returned item, whose log-prob is at least ``t_k``, the ``k``-th
    best target score among the measured sequences. So the certificate needs the gap to hold only
    on sequences with target log-prob >= ``t_k``; this measures it on those >= ``t_k -
    region_margin``, from ``candidates`` (e.g. the commonest names) plus ``n_samples`` ancestral
    samples from the target. A finite sample: an ESTIMATE, not a bound.

    Returns:
      ``{"measured", "sequences", "region_lp", "n_candidates", "n_samples", "target_scored"}``;
      ``region_lp`` is the lowest target log-prob the estimate covers, ``target_scored`` the
      distinct sequences the target scored for it (a one-off calibration cost per model pair).
    """
    from jaxrescore.models.sampling import sample_sequences

    samples = sample_sequences(target, n_samples, seed=seed).to_tuples()
    seqs = sorted(set(candidates) | set(samples))
    t = np.asarray(target.score_sequences(seqs), np.float64)
    d = np.asarray(draft.score_sequences(seqs), np.float64)
    region = float(np.sort(t)[::-1][min(k, t.size) - 1]) - region_margin
    keep = t >= region
    return {
        "measured": float(np.abs(t - d)[keep].max()),
        "sequences": int(keep.sum()),
        "region_lp": region,
        "n_candidates": len(candidates),
        "n_samples": int(n_samples),
        "target_scored": len(seqs),
    }


def assumed_gap_from(estimate: dict, margin: float = GAP_MARGIN) -> tuple[float, str]:
    """The default ``assumed_gap`` (estimate + margin) and a sentence saying where it came from."""
    value = estimate["measured"] + margin
    source = (
        f"assumed to hold for every sequence with target log-prob >= {estimate['region_lp']:.3f}, "
        f"the only ones that could displace an answer; estimated as the max |target - draft| = "
        f"{estimate['measured']:.3f} nats observed over {estimate['sequences']} such sequences "
        f"(from the {estimate['n_candidates']} commonest names and {estimate['n_samples']} target "
        f"samples) plus a {margin:g}-nat margin: an assumption, not a proof"
    )
    return value, source


# ---- queries -----------------------------------------------------------------------------------


def _draft_index(draft, progress: bool):
    """The draft's SeekIndex; its first build shows a progress bar when ``progress``, later
    deepenings only when they run long (so short passes do not print empty bars)."""
    from jaxrescore.index.seek import SeekIndex

    index = SeekIndex(draft, progress=progress or False)
    index.progress = None if progress else False
    return index


def _rescored_top_k(index, target, k: int, window: int, gap: float | None):
    from jaxrescore.rescore.index import RescoredIndex

    rescored = RescoredIndex(index, target, rerank_window=window, assumed_gap=gap)
    return rescored.top_k(k), rescored.target_calls, rescored.target_sequences


def pull_needed(index, need: float, start: int, cap: int) -> int | None:
    """A pull size ``n`` in ``[start, cap]`` whose sound bound ``index.bucket_bound(n)`` is at
    most ``need``: the first found by growing ``n`` from ``start`` in 25% steps (so at most 25%
    above the smallest), deepening the index as it goes. None if even ``cap`` does not get there
    (the index was cut above ``need``, or ``cap`` is too small)."""
    n = start
    while n <= cap:
        index.ensure_count(n + 1)
        if index.bucket_bound(n) <= need:
            return n
        if len(index) <= n:
            return None  # nothing more to pull: a cut prefix keeps the bound above need
        n = max(n + 1, int(n * 1.25))
    return None


def speculative_top_k(index, target, k: int, window: int | None, assumed_gap: float | None):
    """``RescoredIndex(index, target, rerank_window=..., assumed_gap=...).top_k(k)``.

    With ``window=None`` the window is chosen by the certificate itself: a first query with
    :data:`FIRST_WINDOW`; if it does not certify, its worst target score ``w`` says how far down
    the draft order must go (to a sound bound ``<= w - assumed_gap``), and ONE second query pulls
    that far; when even :data:`MAX_WINDOW` would not get there, no second query is made. A wider
    pull can only raise the worst returned score, so the second query certifies.

    Returns:
      ``(result, windows, target_calls, target_sequences)``: the final RescoreResult, the windows
      tried, and the target cost summed over the queries (one batched call each).
    """
    first = FIRST_WINDOW if window is None else window
    result, calls, sequences = _rescored_top_k(index, target, k, first, assumed_gap)
    windows = [first]
    retry = result.certified is False and result.bound is not None and len(result.items) == k
    if window is None and retry:
        need = result.items[-1][1] - assumed_gap
        n = pull_needed(index, need, k + first + 1, k + MAX_WINDOW)
        if n is not None:  # otherwise no window up to MAX_WINDOW could certify: spare the target
            windows.append(n - k)
            result, c, q = _rescored_top_k(index, target, k, windows[-1], assumed_gap)
            calls, sequences = calls + c, sequences + q
    return result, windows, calls, sequences


class _CallCounter:
    """Delegates to a model, counting its batched ``next_logprobs`` calls."""

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.eos, self.max_len = model.vocab_size, model.eos, model.max_len
        self.calls = 0

    def next_logprobs(self, prefixes, lengths):
        self.calls += 1
        return self.model.next_logprobs(prefixes, lengths)


def exact_target_cost(target, k: int) -> dict:
    """What enumerating the target itself costs: a SeekIndex over the target deepened until it
    holds ``k`` sequences (a lower bound on an exact top-k by the target alone).

    Returns:
      ``{"forwards": target prefix rows evaluated, "calls": batched target calls,
      "sequences": sequences indexed}``.
    """
    from jaxrescore.index.seek import SeekIndex

    counted = _CallCounter(target)
    index = SeekIndex(counted, progress=False).ensure_count(k)
    return {"forwards": int(index.forwards), "calls": counted.calls, "sequences": len(index)}


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


def _outcome(result, windows, calls, sequences) -> dict:
    """The RescoreResult fields every command reports (JSON-ready)."""
    return {
        "certified": result.certified,
        "bound": result.bound,
        "gap": result.gap,
        "excess": result.excess if np.isfinite(result.excess) else None,
        "reason": result.reason,
        "window": windows[-1],
        "windows_tried": windows,
        "target_calls": calls,
        "target_sequences": sequences,
    }


def run_demo(
    *,
    k: int = 25,
    window: int | None = None,
    gap: float | None = None,
    prefix: str = "",
    target_path: str | os.PathLike | None = None,
    progress: bool = True,
    measure_exact: bool = True,
) -> dict:
    """The names demo, end to end: the ``k`` likeliest names under the target, found through the
    n-gram draft's SeekIndex, with the certificate and the cost.

    Args:
      k: names to return.
      window: rerank window; None lets the certificate choose it (see :func:`speculative_top_k`).
      gap: assumed max ``|target - draft|`` in nats; None = estimated (see
        :func:`estimate_region_gap`) plus :data:`GAP_MARGIN`.
      prefix: only names starting with it (both models are prompted with it; log-probs are then
        conditional on the prefix).
      target_path: target weights (default: the shipped ones).
      progress: show the draft index's progress bar.
      measure_exact: also build a target SeekIndex to report what exact enumeration costs.

    Returns:
      A JSON-ready dict: ``items`` (``text``, ``target_log_prob``, ``draft_log_prob``),
      ``birth_ranks`` (rank by birth count, None for a string that is not a shipped name),
      ``true_top_k_overlap`` (how many items are among the ``k`` commonest names with the prefix),
      ``certified``, ``bound``, ``gap`` (observed max ``|target - draft|``), ``excess``
      (observed max ``target - draft``, None before any finite pair), ``reason``, ``assumed_gap``,
      ``gap_source``, ``gap_region_lp`` (the lowest target log-prob the gap estimate covers;
      None for a given gap), ``gap_calibration_sequences`` (target-scored by the gap estimate, a
      one-off cost not counted in ``target_sequences``), ``gap_covers_answers`` (whether the
      worst answer lies inside that region, which the certificate's argument needs), ``window``, ``target_calls``, ``target_sequences``, ``draft_forwards``,
      ``exact_target``, ``seconds`` and the arguments.
    """
    import time

    from jaxrescore.data.names import decode, name_ranks

    k, window, gap = _check_k(k), _check_window(window), _check_gap(gap)
    prompt = check_prefix(prefix)
    start = time.perf_counter()
    target, draft = load_target(target_path), fit_draft()
    if prompt:
        target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
    if gap is None:
        common = [encode(n[len(prefix):]) for n, _ in load_names() if n.startswith(prefix)]
        estimate = estimate_region_gap(draft, target, common[:GAP_TOP_NAMES], k)
        gap, source = assumed_gap_from(estimate)
        region, calibration = estimate["region_lp"], estimate["target_scored"]
    else:
        source, region, calibration = "given with --gap", None, 0
    index = _draft_index(draft, progress)
    result, windows, calls, sequences = speculative_top_k(index, target, k, window, gap)
    exact = exact_target_cost(target, k) if measure_exact else None
    ranks = name_ranks()
    texts = [prefix + decode(seq) for seq, _ in result.items]
    true_top = [n for n, _ in load_names() if n.startswith(prefix)][:k]
    out = {
        "items": [
            {"text": text, "target_log_prob": lp, "draft_log_prob": dlp}
            for text, (_, lp), dlp in zip(texts, result.items, result.draft_log_probs)
        ],
        "birth_ranks": [ranks.get(text) for text in texts],
        "true_top_k_overlap": len(set(true_top).intersection(texts)),
        **_outcome(result, windows, calls, sequences),
        "assumed_gap": gap,
        "gap_source": source,
        "gap_region_lp": region,
        "gap_calibration_sequences": calibration,
        "gap_covers_answers": None if region is None or not result.items
        else result.items[-1][1] >= region,
        "draft_forwards": int(index.forwards),
        "exact_target": exact,
        "k": k,
        "prefix": prefix,
        "seconds": time.perf_counter() - start,
    }
    return out


# ---- printing ----------------------------------------------------------------------------------


def _cost_lines(out: dict) -> list[str]:
    lines = [
        f"target cost: {out['target_calls']} batched call(s), {out['target_sequences']} sequences "
        f"scored by teacher forcing (rerank windows tried: {out['windows_tried']})"
    ]
    if out.get("gap_calibration_sequences"):
        lines.append(
            f"gap calibration (one-off per model pair, not counted above): "
            f"{out['gap_calibration_sequences']} sequences scored and {GAP_SAMPLES} sampled"
        )
    exact = out.get("exact_target")
    if exact:
        lines.append(
            f"exact target enumeration: a SeekIndex over the target needs {exact['forwards']} "
            f"prefix forwards in {exact['calls']} batched calls (one per depth and pass) to hold "
            f"{exact['sequences']} >= {out['k']} sequences"
        )
    return lines


def _nats(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} nats"


def _certificate_lines(out: dict) -> list[str]:
    gap = out.get("assumed_gap")
    lines = [
        f"certified: {out['certified']} ({out['reason']})",
        f"assumed gap: {gap:.3f} nats ({out['gap_source']})"
        if gap is not None
        else "assumed gap: none (no certificate requested)",
        f"observed over all rescored sequences (diagnostics; they include sequences far below "
        f"the answers): max |target - draft| {out['gap']:.3f} nats, max target - draft "
        f"{_nats(out['excess'])}",
    ]
    if out.get("gap_covers_answers") is False:
        lines.append(
            "WARNING: the answers fall below the region the gap was estimated on, so the "
            "certificate's assumption does not cover them"
        )
    return lines


def format_demo(out: dict) -> str:
    """The demo result as a text table plus certificate and cost lines."""
    cond = f" starting with {out['prefix']!r} (log-probs given the prefix)" if out["prefix"] else ""
    lines = [
        f"top {out['k']} US first names{cond}: ordered by a character {DRAFT_ORDER}-gram (draft), "
        f"scored by a character transformer (target)",
        f"{'rank':>4}  {'name':<16}{'target lp':>10}{'draft lp':>10}  {'birth rank':>10}",
    ]
    for i, (item, rank) in enumerate(zip(out["items"], out["birth_ranks"]), 1):
        lines.append(
            f"{i:>4}  {item['text']:<16}{item['target_log_prob']:>10.3f}"
            f"{item['draft_log_prob']:>10.3f}  {rank if rank is not None else '-':>10}"
        )
    lines.append(
        f"{out['true_top_k_overlap']} of these are among the {out['k']} commonest names"
        + (f" starting with {out['prefix']!r}" if out["prefix"] else "")
        + " by birth count (SSA, 1880-2017)"
    )
    lines += _certificate_lines(out)
    lines += _cost_lines(out)
    lines.append(
        f"draft index: {out['draft_forwards']} n-gram prefix forwards; "
        f"wall time {out['seconds']:.1f} s"
    )
    return "\n".join(lines)



# ---- your own models ---------------------------------------------------------------------------


def run_enumerate(
    *,
    target_path,
    draft_path,
    k: int = 25,
    window: int | None = None,
    gap: float | None = None,
    prompt: tuple[int, ...] = (),
    bits: float | None = None,
    progress: bool = True,
) -> dict:
    """Speculative top-``k`` with a user's own saved target and draft (``save_model`` files).

    Args:
      target_path, draft_path: model files; both models must share ``vocab_size`` and ``eos``.
      k, window: as in :func:`run_demo`.
      gap: assumed max ``|target - draft|``; None = no certificate (a sampled gap estimate is
        still reported, as a hint for choosing one).
      prompt: token ids to condition both models on.
      bits: optional depth budget of the draft index to build up front.

    Returns:
      A JSON-ready dict: ``items`` (``tokens``, ``text``, ``target_log_prob``,
      ``draft_log_prob``), the certificate and cost keys of :func:`run_demo`, ``gap_estimate``.
    """
    import time

    from jaxrescore.models.gap import estimate_gap

    k, window, gap = _check_k(k), _check_window(window), _check_gap(gap)
    start = time.perf_counter()
    if bits is not None and not 0 <= bits < float("inf"):
        raise DemoArgumentError(f"bits must be a finite number >= 0, got {bits!r}")
    target, draft = load_target(target_path), load_target(draft_path)
    if (target.vocab_size, target.eos) != (draft.vocab_size, draft.eos):
        raise DemoArgumentError(
            f"target (vocab_size={target.vocab_size}, eos={target.eos}) and draft "
            f"(vocab_size={draft.vocab_size}, eos={draft.eos}) must share vocab_size and eos"
        )
    if prompt:
        try:
            target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
        except ValueError as err:
            raise DemoArgumentError(f"prompt: {err}") from None
    index = _draft_index(draft, progress)
    if bits is not None:
        index.ensure_bits(bits)
    result, windows, calls, sequences = speculative_top_k(index, target, k, window, gap)
    hint = estimate_gap(draft, target, n=GAP_SAMPLES) if draft.max_len >= target.max_len else None
    return {
        "items": [
            {"tokens": list(seq), "text": " ".join(map(str, seq)), "target_log_prob": lp,
             "draft_log_prob": dlp}
            for (seq, lp), dlp in zip(result.items, result.draft_log_probs)
        ],
        **_outcome(result, windows, calls, sequences),
        "assumed_gap": gap,
        "gap_source": "given with --gap" if gap is not None else None,
        "gap_estimate": None if hint is None else hint._asdict(),
        "draft_forwards": int(index.forwards),
        "k": k,
        "prompt": list(prompt),
        "seconds": time.perf_counter() - start,
    }


def format_enumerate(out: dict) -> str:
    """The enumerate result as a text table plus certificate and cost lines."""
    lines = [f"{'rank':>4}  {'tokens':<40}{'target lp':>10}{'draft lp':>10}"]
    for i, item in enumerate(out["items"], 1):
        lines.append(
            f"{i:>4}  {item['text']:<40}{item['target_log_prob']:>10.3f}"
            f"{item['draft_log_prob']:>10.3f}"
        )
    lines += _certificate_lines(out)
    if out["gap_estimate"] is not None:
        est = out["gap_estimate"]
        lines.append(
            f"gap estimate (hint, not a proof): max {est['max_gap']:.3f}, "
            f"mean {est['mean_gap']:.3f} nats over {est['n_sequences']} target samples"
        )
    lines += _cost_lines(out)
    lines.append(
        f"draft index: {out['draft_forwards']} prefix forwards; wall time {out['seconds']:.1f} s"
    )
    return "\n".join(lines)
