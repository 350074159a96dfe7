"""The reliability battery (issues 10 and 19, "Done when"): random cases against brute force.

A *case* is a JSON-ready dict describing a tiny draft/target pair and the queries to run on it
(see :func:`case_strategy`): fixed-length and eos models, random quantizers, dyadic rows whose
steps sit exactly on bucket edges, ties (uniform rows, equal entries), -inf and huge-negative
steps (-5e17, -1e30, near float32's minimum), float32 rows (every model here returns float32
rows, the batched form with the 1e-3 float32 tolerance), positive-noise steps (up to 5e-6 above
0), branch_cap, budget caps (max_depth_bits, initial_bits), prompts, sweeps, saved-and-loaded
indexes, queries from several threads, and (issue 19) drafts that differ from their target:
longer or shorter, another eos (none, another id, an eos draft of a fixed-length target), one
token wider (the target declares its own vocabulary, declares the draft's with no mass on the
extra token, or is a per-prefix function whose vocabulary is inferred), ``top_m`` below V,
every index kind (SeekIndex, AREnvelopeIndex, tests/brute.py's BruteIndex with a bucket bound
and in the reference library's shape without one), with or without a draft model to complete
with, ``rescore_many`` over one index per prompt, and objects reused across queries.
:func:`mismatched_strategy` forces every case into at least one of issue 19's families.

What is checked, for every query (plain, ``prove=True``, ``until_certified=True``, sweeps,
``rescore_many``, threads):

- ``proven is True`` only on the target's exact slice over its WHOLE support, tie-aware: the
  returned scores equal the true ranks' scores and every item is a distinct support sequence
  with the score the target model itself gives it (its own float32 rows, summed in float64);
- ``certified is True`` only on that exact slice, whenever ``assumed_gap`` is a TRUE one-sided
  gap (at least ``max(target - draft)`` over the support, ``+inf`` when the target gives mass
  to a sequence the draft rules out: then no gap is true and no claim is checked), never while
  the result's own ``excess`` refutes the gap, and never when a sequence the target scored for
  that object (in that call or earlier; see :class:`Evidence`) refutes it: its TRUE
  ``target - draft`` (+inf for a finite target score the draft rules out) above
  ``assumed_gap`` + the target's score tolerance. Gaps below the truth ("half") exercise it;
- items are target-exact and sorted; a proving search on these supports (at most a few hundred
  sequences) always proves.

Cases that ever failed live in ``tests/corpus/*.json`` and are replayed first (a case with an
``"xfail"`` entry pins a known defect outside this battery's files: it must keep failing until
fixed, then the entry is removed). A failing hypothesis case is written there automatically
(``JAXRESCORE_CORPUS`` overrides the folder). Each test reports how many cases and queries it
ran on stdout and as the ``battery`` user property (conftest prints them in the summary).
CI draws the same cases every run; ``JAXRESCORE_BATTERY_EXPLORE=1`` draws new ones and
``JAXRESCORE_BATTERY_EXAMPLES`` / ``..._SPECIAL`` / ``..._MISMATCH`` set how many.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from brute import TableModel, as_model
from jaxrescore import RescoredIndex, SeekIndex

CORPUS = Path(os.environ.get("JAXRESCORE_CORPUS", Path(__file__).parent / "corpus"))
TIE_TOL = 1e-9
EVIDENCE_SLACK = 1e-5
LN2 = math.log(2.0)
HUGE = {"-inf": -math.inf, "-5e17": -5e17, "-1e30": -1e30, "-3e38": -3.0e38}


# ---- models ------------------------------------------------------------------------------------


def _normalise(row: np.ndarray) -> np.ndarray:
    finite = np.isfinite(row)
    top = row[finite].max()
    return row - (top + np.log(np.exp(row[finite] - top).sum()))


def _dyadic(vocab: int, rng) -> np.ndarray:
    """Probabilities 1/2, 1/4, ..., 2**-(V-1), 2**-(V-1) in random order: every step is a whole
    number of bits, so step buckets land exactly on bucket edges."""
    p = np.array([2.0 ** -(i + 1) for i in range(vocab - 1)] + [2.0 ** -(vocab - 1)])
    return np.log(rng.permutation(p))


def build_table(spec: dict, vocab: int, eos, seed: int) -> TableModel:
    """A TableModel with rows of one ``style``: random softmax, uniform (everything ties) or
    dyadic (exact bucket edges)."""
    style = spec.get("style", "softmax")
    model = TableModel(vocab, spec["max_len"], seed, eos=eos, temperature=spec.get("temperature", 2.0))
    rng = np.random.default_rng([seed, 11])
    for p in model.steps:
        if style == "uniform":
            model.steps[p] = np.full(vocab, -math.log(vocab))
        elif style == "dyadic":
            model.steps[p] = _dyadic(vocab, rng)
    return model


def derive_draft(target: TableModel, case: dict) -> TableModel:
    """The draft table: the target's rows ('same'), with noise ('good', 'noisy'), every
    preference reversed ('adversarial') or independent ('useless'); rows the target does not
    have (past its max_len or eos, after a token outside its vocabulary) are random. The draft
    may have its own ``draft_max_len``, ``draft_eos`` (None: fixed length) and a larger
    ``draft_vocab``: the target's rows then get one more token (random mass, the target gives
    it none)."""
    kind, seed = case["draft"], case["draft_seed"]
    length = case.get("draft_max_len", target.max_len)
    vocab = case.get("draft_vocab", target.vocab_size)
    out = TableModel(vocab, length, seed, eos=case["draft_eos"] if "draft_eos" in case else target.eos)
    noise = {"good": 0.1, "noisy": 1.0, "same": 0.0}.get(kind)
    rng = np.random.default_rng([seed, 5])
    wider = np.random.default_rng([seed, 6])
    for p in out.steps:
        base = target.steps.get(p)
        if base is None or kind == "useless":
            continue
        if vocab > base.size:
            base = _normalise(np.append(base, base.max() + wider.normal(-1.0, 1.5, vocab - base.size)))
        if kind == "adversarial":
            out.steps[p] = _normalise(-base)
        else:
            out.steps[p] = _normalise(base + noise * rng.standard_normal(vocab))
    return out


def apply_perturbations(models: dict, case: dict) -> None:
    """Edit rows in place. ``{"model": "target"|"draft"|"both", "prefix": [...], ...}`` with
    ``"token"`` and ``"value"`` (a HUGE key, "tie": equal to the row's best other entry, or
    "noise": the row becomes that token with log-prob +5e-6, a positive float-noise step) or
    ``"row"``: the whole row verbatim (strings "-inf" allowed)."""
    for pert in case.get("perturb", []):
        prefix = tuple(pert["prefix"])
        for name in ("target", "draft") if pert["model"] == "both" else (pert["model"],):
            table = models[name]
            if prefix not in table.steps:
                continue
            row = table.steps[prefix].astype(np.float64).copy()
            if "row" in pert:
                row = np.array([float(x) for x in pert["row"]], np.float64)
            else:
                t, value = pert["token"] % table.vocab_size, pert["value"]
                if value == "noise":
                    row = np.full(table.vocab_size, -np.inf)
                    row[t] = 5e-6
                else:
                    others = np.delete(row, t)
                    edited = row.copy()
                    if value == "tie":
                        if np.isfinite(others).any():
                            edited[t] = others[np.isfinite(others)].max()
                    else:
                        edited[t] = HUGE[value]
                    # Keep only edits that leave a distribution (rows of nothing but huge
                    # entries cannot be renormalised in float64: -1e30 + log 2 == -1e30).
                    if (edited > -1e6).any():
                        row = _normalise(edited)
            table.steps[prefix] = row


def support_of(table: TableModel, prompt: tuple) -> list:
    conts = [s[len(prompt):] for s in table.support() if s[: len(prompt)] == prompt and len(s) > len(prompt)]
    return conts


def true_excess(draft_model, target_model, support) -> float:
    """max(target - draft, 0) over the support (of the prompted models); +inf when the target
    gives mass to a sequence the draft gives none."""
    t = np.asarray(target_model.score_sequences(support), np.float64)
    d = np.asarray(draft_model.score_sequences(support), np.float64)
    live = np.isfinite(t)
    if (live & ~np.isfinite(d)).any():
        return math.inf
    return float(max((t[live] - d[live]).max(initial=0.0), 0.0))


# ---- one case ----------------------------------------------------------------------------------


class Stats:
    def __init__(self, strict: bool = False):
        self.strict = strict
        self.cases = self.queries = self.proven = self.certified = self.beyond_support = self.refuted = 0

    def line(self, name: str) -> str:
        return (
            f"battery[{name}]: {self.cases} cases, {self.queries} queries ({self.proven} proven, "
            f"{self.certified} certified checked against brute force, {self.beyond_support} asking "
            f"past the target's support, {self.refuted} with a gap their own evidence refutes)"
        )


def check_result(r, truth: dict, start: int, k: int, gap, excess: float, tolerance: float, what: str, stats: Stats,
                 tie_tol: float = TIE_TOL, evidence: float = -math.inf):
    """Assert the battery's claims about one RescoreResult (see the module docstring). Scores
    match within ``tie_tol`` (exact for table models; a JAX model's float32 forward moves a score
    by up to its ``score_tolerance`` between batches). ``evidence``: the largest true
    target - draft over what the target scored for this object so far (see :class:`Evidence`)."""
    stats.queries += 1
    got = [lp for _, lp in r.items]
    assert got == sorted(got, reverse=True), f"{what}: items not sorted by target score"
    for s, lp in r.items:
        want = truth.get(tuple(s), -math.inf)
        assert lp == want or abs(lp - want) <= tie_tol, f"{what}: item {s} has {lp}, the target gives {want}"
    if r.certified and gap is not None and r.excess > gap + tolerance + 1e-12:
        raise AssertionError(f"{what}: certified while excess {r.excess} > gap {gap}: {r.reason}")
    # The draft's float32 rows may reach the library through another sum (an index's float64
    # table): EVIDENCE_SLACK keeps the check off the last bits.
    if r.certified and gap is not None and evidence > gap + tolerance + EVIDENCE_SLACK:
        raise AssertionError(
            f"{what}: certified against its own evidence: a sequence scored on this object (this call "
            f"or earlier) has target - draft = {evidence} > gap {gap} + tolerance {tolerance} (the "
            f"result's excess says {r.excess}): {r.reason}"
        )
    if gap is not None and evidence > gap + tolerance + EVIDENCE_SLACK:
        stats.refuted += 1
    claims = []
    if r.proven:
        claims.append("proven")
        stats.proven += 1
    if r.certified and gap is not None and gap >= excess:
        claims.append("certified")
        stats.certified += 1
    if not claims:
        return
    finite = sorted((v for v in truth.values() if v > -math.inf), reverse=True)
    want = finite[start : start + k]
    if start + k > len(finite):
        stats.beyond_support += 1
    ok = len(got) == len(want) and len({tuple(s) for s, _ in r.items}) == len(got)
    ok = ok and all(abs(a - b) <= tie_tol for a, b in zip(got, want))
    assert ok, (
        f"{what}: {' and '.join(claims)} on a wrong answer: got {got}, the target's exact slice "
        f"[{start}, {start + k}) is {want} (reasons: {r.proof_reason!r}; {r.reason!r})"
    )


class Side:
    """One prompt's view of a case: the prompted target and draft, the target's whole support with
    its scores (``truth``), the true one-sided excess, and the draft score of any sequence (what
    the evidence check needs)."""

    def __init__(self, models: dict, t_base, d_base, prompt: tuple):
        target_table, draft_table = models["target"], models["draft"]
        self.prompt = prompt
        self.t_model = t_base.with_prompt(prompt) if prompt else t_base
        self.d_model = d_base.with_prompt(prompt) if prompt else d_base
        self.support = support_of(target_table, prompt)
        self.truth = dict(zip(self.support, np.asarray(self.t_model.score_sequences(self.support), np.float64)))
        self.draft_support = support_of(draft_table, prompt)
        everything = sorted(set(self.support) | set(self.draft_support), key=lambda s: (len(s), s))
        self._draft = {}
        self.excess = max(self.excess_of(everything), 0.0)

    def draft_scores(self, seqs: list) -> np.ndarray:
        missing = [s for s in dict.fromkeys(seqs) if s not in self._draft]
        if missing:
            self._draft.update(zip(missing, np.asarray(self.d_model.score_sequences(missing), np.float64)))
        return np.array([self._draft[s] for s in seqs], np.float64)

    def excess_of(self, seqs: list) -> float:
        """max(target - draft) over ``seqs`` where the target is finite (-inf when none is); +inf
        for a sequence the target gives mass and the draft none."""
        live = [s for s in seqs if self.truth.get(s, -math.inf) > -math.inf]
        if not live:
            return -math.inf
        t = np.array([self.truth[s] for s in live])
        return float((t - self.draft_scores(live)).max())


class Evidence:
    """Every sequence the target scored, by the RescoredIndex object it was scored for: the
    target's ``score_frontier`` and ``score_sequences`` are wrapped on the base model (a prompted
    target calls its base; ``rescore_many`` calls the shared base). Every row sent that is a
    whole target sequence is evidence about the gap, a draft sequence's view included (cut at the
    target's max_len or after its eos: the forward scored that target sequence); its excess is the
    TRUE target - draft (+inf outside the draft's support). Calls made while no owner is set (the
    oracle's own) are not recorded."""

    def __init__(self, sides: dict):
        self.sides = sides  # prompt -> Side
        self.rows = []  # (owner object, thread id, prompt, continuation)
        self.owners: dict = {}
        self._lock = threading.Lock()
        self.pulled: set | None = None  # see only_pulled

    def only_pulled(self, index):
        """Count only what ``index`` handed out: for a library without a draft scorer (no draft
        model, an index without one), a sequence its search found has no draft score the library
        could know (NaN), so it is no evidence."""
        self.pulled = set()
        for name in ("unrank", "unrank_batch"):
            real = getattr(index, name, None)
            if real is None:
                continue

            def recorded(*args, _real=real, _name=name, **kwargs):
                out = _real(*args, **kwargs)
                seqs = [out[0]] if _name == "unrank" else out[0]
                self.pulled.update(tuple(int(t) for t in x) for x in seqs)
                return out

            setattr(index, name, recorded)

    def watch(self, base):
        """Record ``base``'s scoring calls (the methods are wrapped on the instance)."""
        for name in ("score_frontier", "score_sequences"):
            setattr(base, name, self._wrap(getattr(base, name)))
        return base

    def _wrap(self, real):
        def recorded(seqs, *args, **kwargs):
            if self.owners:
                self._note(seqs, kwargs.get("skip"))
            return real(seqs, *args, **kwargs)

        return recorded

    def _note(self, seqs, skip):
        from jaxrescore.sequences import as_sequence_batch

        batch = as_sequence_batch(seqs)
        tokens, lengths = np.asarray(batch.tokens), np.asarray(batch.lengths)
        skips = np.zeros(len(lengths), np.int64) if skip is None else np.asarray(skip).reshape(-1)
        me = threading.get_ident()
        with self._lock:
            for row, n, sk in zip(tokens.tolist(), lengths.tolist(), skips.tolist()):
                if n == 0:
                    continue
                row = tuple(row[:n])
                prompts = [p for p in self.owners if len(p) <= sk and row[: len(p)] == p]
                if prompts:
                    p = max(prompts, key=len)
                    self.rows.append((self.owners[p], me, p, row[len(p):]))

    def owner(self, by_prompt: dict):
        """Context: calls made inside are scored for ``by_prompt[prompt]`` (a RescoredIndex)."""
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.owners = by_prompt
            try:
                yield
            finally:
                self.owners = {}

        return ctx()

    def mark(self) -> int:
        return len(self.rows)

    def excess(self, obj, *, mine_after: int | None = None) -> float:
        """The largest true excess over the evidence scored for ``obj``; with ``mine_after``
        (threads) only rows recorded before that mark or by the calling thread count."""
        me = threading.get_ident()
        with self._lock:
            rows = [(i, r) for i, r in enumerate(self.rows) if r[0] is obj]
        by_prompt: dict = {}
        for i, (_, thread, p, seq) in rows:
            if mine_after is not None and i >= mine_after and thread != me:
                continue
            if self.pulled is None or seq in self.pulled:
                by_prompt.setdefault(p, set()).add(seq)
        return max((self.sides[p].excess_of(sorted(seqs)) for p, seqs in by_prompt.items()), default=-math.inf)


def build_index(case: dict, models: dict, d_model, tmp: Path | None, n: int):
    """The case's draft index: ``seek`` (SeekIndex, maybe saved and loaded), ``envelope``
    (AREnvelopeIndex: approximate order, never certifies), ``brute`` (tests/brute.py's
    BruteIndex with a bucket bound) or ``foreign`` (the reference library's shape: a quantizer
    and truncation reports, no bucket_bound)."""
    q = case.get("quantizer", [1.0, 8])
    kind = case.get("index", "seek")
    if kind == "envelope":
        from jaxrescore import AREnvelopeIndex

        return AREnvelopeIndex(d_model, bin_width_bits=q[0], oversample=q[1], n_paths=case.get("n_paths", 8),
                               seed=case["draft_seed"] % 97, max_depth_bits=case.get("max_depth_bits", 64.0),
                               progress=False)
    if kind in ("brute", "foreign"):
        from brute import BruteIndex
        from jaxrescore.quantize import Quantizer

        budget = case.get("max_depth_bits")
        return BruteIndex(models["draft"], Quantizer(q[0], q[1]), budget_bits=budget, with_bound=kind == "brute",
                          finite_only=True)
    kwargs = dict(bin_width_bits=q[0], oversample=q[1], branch_cap=case.get("branch_cap"),
                  max_depth_bits=case.get("max_depth_bits", 64.0), initial_bits=case.get("initial_bits", 8.0),
                  progress=False)
    index = SeekIndex(d_model, **kwargs)
    if case.get("save_load") and tmp is not None:
        path = tmp / f"index-{n}.npz"
        index.save(path)
        index = SeekIndex.load(path, d_model, progress=False)
    return index


def _top_m(case: dict, vocab: int) -> dict:
    top_m = case.get("top_m")
    if top_m is None:
        return {}
    return {"top_m": max(1, vocab - 1) if top_m == "V-1" else int(top_m)}


def run_case(case: dict, stats: Stats, tmp: Path | None = None) -> None:
    """Build the case's models and index, run its queries, check every result."""
    stats.cases += 1
    vocab, eos = case["vocab"], case["eos"]
    target_table = build_table(case, vocab, eos, case["target_seed"])
    draft_table = derive_draft(target_table, case)
    models = {"target": target_table, "draft": draft_table}
    apply_perturbations(models, case)
    form, batched = case.get("target_form", "exact"), case.get("batched", False)
    # The oracle declares its vocabulary; the library gets a fresh target per object (below), so
    # an inferred vocabulary is still unknown when a query starts, as on a user's first query.
    t_oracle = as_model(target_table, batched=batched, form="exact" if form == "inferred" else form)
    d_base = as_model(draft_table)
    # An inferred vocabulary is 0 (or eos + 1) before the model's first table and a prompt is
    # checked against it: a prompted target answers first, as a user's model would have. A prompt
    # token it never gives mass is outside its vocabulary (with_prompt refuses it): no prompt then.
    probe = as_model(target_table, batched=batched, form=form)
    probe.score_sequences(target_table.support())
    prompt = tuple(case.get("prompt", ()))
    if any(t >= probe.vocab_size or t == draft_table.eos for t in prompt) or len(prompt) >= draft_table.max_len:
        prompt = ()  # (a forced mismatch may leave a prompt the draft cannot continue)
    side = Side(models, t_oracle, d_base, prompt)
    sides = {prompt: side}
    many_prompts = _many_prompts(case) if case.get("many") else []
    many_prompts = [p for p in many_prompts if all(t < probe.vocab_size for t in p)]
    many_prompts = many_prompts if len(many_prompts) == 2 else []
    for p in many_prompts:
        sides.setdefault(p, Side(models, t_oracle, d_base, p))
    evidence = Evidence(sides)

    def library_target(prompts=(prompt,)):
        """A fresh target (its calls recorded), prompted by each of ``prompts``."""
        base = evidence.watch(as_model(target_table, batched=batched, form=form))
        if any(prompts):
            base.score_sequences(target_table.support())
        return [base.with_prompt(p) if p else base for p in prompts]

    t_model, d_model, truth, excess = side.t_model, side.d_model, side.truth, side.excess
    tolerance = t_model.score_tolerance
    index = build_index(case, models, d_model, tmp, stats.cases)
    if not case.get("draft_model", True) and case.get("index") in ("brute", "foreign"):
        evidence.only_pulled(index)
    extra = dict(draft_model=d_model if case.get("draft_model", True) else None, **_top_m(case, vocab))

    def check(r, ri, start, k, gap, what, *, mine_after=None, many_side=None):
        s = many_side or side
        seen = evidence.excess(ri, mine_after=mine_after)
        check_result(r, s.truth, start, k, gap, s.excess, tolerance, what, stats, evidence=seen)

    objects: dict = {}
    queries = case["queries"]
    for qi, (start, k, window, mode, how) in enumerate(queries):
        gap = _gap(mode, excess)
        what = f"case {case.get('name', '?')} query {qi} {how} start={start} k={k} window={window} gap={gap}"
        key = (window, gap) if case.get("reuse") else qi
        if key not in objects:  # reused: later queries see what earlier ones scored on the object
            objects[key] = RescoredIndex(index, library_target()[0], rerank_window=window, assumed_gap=gap, **extra)
        ri = objects[key]
        with evidence.owner({prompt: ri}):
            if how == "plain":
                r = ri.slice(start, k)
            elif how == "prove":
                r = ri.slice(start, k, prove=True)
            elif how == "until_certified":
                if gap is None:
                    continue
                r = ri.slice(start, k, until_certified=True)
            else:
                raise ValueError(how)
        if how == "prove":
            finite = sorted((v for v in truth.values() if v > -math.inf), reverse=True)
            if start + k <= len(finite):
                assert r.proven is True, f"{what}: the search did not prove: {r.proof_reason}"
        check(r, ri, start, k, gap, what)

    if case.get("sweep"):
        plain = [q for q in queries if q[4] == "plain"] or queries[:1]
        # A wide companion of the first query: the call then scores more than the narrow queries
        # pull, and every query must refute from all of it (issue 19 item 4).
        plain = plain + [[plain[0][0], plain[0][1], 50, plain[0][3], "plain"]]
        ri = RescoredIndex(index, library_target()[0], rerank_window=0, **extra)
        gaps = [_gap(q[3], excess) for q in plain]
        for group in [list(range(len(plain)))]:
            with evidence.owner({prompt: ri}):
                results = ri.sweep([plain[i][0] for i in group], [plain[i][1] for i in group],
                                   [plain[i][2] for i in group], [gaps[i] for i in group])
            for i, r in zip(group, results):
                start, k = plain[i][0], plain[i][1]
                check(r, ri, start, k, gaps[i], f"case {case.get('name')} sweep query {i}")

    if many_prompts:
        _run_many(case, sides, library_target(many_prompts), evidence, stats, check, extra)

    if case.get("threads"):
        q = case.get("quantizer", [1.0, 8])
        shared_index = SeekIndex(d_model, bin_width_bits=q[0], oversample=q[1], branch_cap=case.get("branch_cap"),
                                 max_depth_bits=case.get("max_depth_bits", 64.0), initial_bits=0.5, progress=False)
        shared = RescoredIndex(shared_index, library_target()[0], rerank_window=1, assumed_gap=_gap("true", excess),
                               **extra)
        results, errors, marks = {}, [], {}

        def work(i, start, k, prove):
            try:
                marks[i] = evidence.mark()
                results[i] = shared.slice(start, k, prove=prove)
            except Exception as err:  # pragma: no cover - reported below
                errors.append(err)
            else:
                results[i] = (results[i], evidence.excess(shared, mine_after=marks[i]))

        jobs = [(i, q[0], q[1], i % 2 == 0) for i, q in enumerate(queries * 2)]
        threads = [threading.Thread(target=work, args=job) for job in jobs]
        with evidence.owner({prompt: shared}):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert not errors, errors
        finite = sum(1 for v in truth.values() if v > -math.inf)
        for i, start, k, prove in jobs:
            r, seen = results[i]
            if prove and start + k <= finite:
                assert r.proven is True, f"case {case.get('name')} thread {i}: did not prove: {r.proof_reason}"
            check_result(r, truth, start, k, shared.assumed_gap, excess, tolerance,
                         f"case {case.get('name')} thread {i}", stats, evidence=seen)


def _many_prompts(case: dict) -> list:
    """Two prompts of one token for ``rescore_many`` (one index per prompt, the documented use),
    or none when the target's support leaves no room for them."""
    d_eos = case["draft_eos"] if "draft_eos" in case else case["eos"]
    body = [t for t in range(case["vocab"]) if t not in (case["eos"], d_eos)]
    if min(case["max_len"], case.get("draft_max_len", case["max_len"])) < 2 or len(body) < 2:
        return []
    first = case["many"] % len(body)
    return [(body[first],), (body[(first + 1) % len(body)],)]


def _run_many(case, sides, targets, evidence, stats, check, extra) -> None:
    """``rescore_many`` over one index per prompt (``targets``: prompted models of one base):
    every result checked against its own prompt's brute force and the evidence scored for its
    own index."""
    from jaxrescore import rescore_many

    q = case.get("quantizer", [1.0, 8])
    start, k, window, mode, how = case["queries"][0]
    indexes, prompts = [], [t.prompt for t in targets]
    for p, target in zip(prompts, targets):
        s = sides[p]
        idx = SeekIndex(s.d_model, bin_width_bits=q[0], oversample=q[1], branch_cap=case.get("branch_cap"),
                        max_depth_bits=case.get("max_depth_bits", 64.0), progress=False)
        extra_p = {**extra, "draft_model": s.d_model if extra.get("draft_model") is not None else None}
        indexes.append(RescoredIndex(idx, target, rerank_window=window, assumed_gap=_gap(mode, s.excess), **extra_p))
    prove = how == "prove"
    with evidence.owner(dict(zip(prompts, indexes))):
        results = rescore_many(indexes, k, prove=prove)
    for p, ri, r in zip(prompts, indexes, results):
        s = sides[p]
        what = f"case {case.get('name')} rescore_many prompt {p} k={k} window={window} prove={prove}"
        if prove:
            finite = sorted((v for v in s.truth.values() if v > -math.inf), reverse=True)
            if k <= len(finite):
                assert r.proven is True, f"{what}: the search did not prove: {r.proof_reason}"
        check(r, ri, 0, k, ri.assumed_gap, what, many_side=s)


def _gap(mode, excess: float):
    """The assumed gap of a query: None, the true excess ("true"), half of it ("half"), or the
    true excess plus a margin (a number). A case whose true excess is infinite has no true gap:
    the number itself (0.5 for "half")."""
    if mode is None:
        return None
    if mode == "true":
        return excess if math.isfinite(excess) else None
    if mode == "half":  # a gap the truth refutes (when the excess is positive): only evidence checks apply
        return excess / 2 if math.isfinite(excess) else 0.5
    return excess + float(mode) if math.isfinite(excess) else float(mode)


# ---- the strategy ------------------------------------------------------------------------------


@st.composite
def case_strategy(draw):
    vocab = draw(st.integers(2, 4))
    eos = draw(st.sampled_from([None] + list(range(vocab))))
    # Supports of a few to ~100 sequences: big enough for most queries to ask inside them.
    max_len = draw(st.integers(1, {2: 5, 3: 4, 4: 3}[vocab]))
    case = {
        "vocab": vocab, "eos": eos, "max_len": max_len,
        "target_seed": draw(st.integers(0, 10**6)), "draft_seed": draw(st.integers(0, 10**6)),
        "style": draw(st.sampled_from(["softmax", "softmax", "uniform", "dyadic"])),
        "temperature": draw(st.sampled_from([0.5, 2.0, 4.0])),
        "draft": draw(st.sampled_from(["same", "good", "noisy", "useless", "adversarial"])),
        "batched": draw(st.booleans()),
        "quantizer": [draw(st.sampled_from([0.25, 0.5, 1.0, 1.7, 3.0])), draw(st.sampled_from([1, 2, 8]))],
    }
    if eos is not None and max_len >= 2 and draw(st.integers(0, 2)) == 2:
        case["draft_max_len"] = max_len + 1  # the target is shorter than its draft (item 9)
    # Issue 19: a draft that differs from its target in length (longer or shorter, any eos),
    # eos (a fixed-length draft of an eos target, another eos, an eos draft of a fixed-length
    # target) and vocabulary (the draft's one token wider; the target gives that token no mass).
    mismatch = draw(st.integers(0, 5))
    if mismatch == 1:
        case["draft_max_len"] = max_len + 1
    elif mismatch == 2 and max_len >= 2:
        case["draft_max_len"] = max_len - 1
    d_vocab = vocab
    if vocab <= 3 and draw(st.integers(0, 4)) == 4:
        case["draft_vocab"] = d_vocab = vocab + 1
    if draw(st.integers(0, 4)) == 4:
        case["draft_eos"] = draw(st.sampled_from([None] + [t for t in range(d_vocab) if t != eos]))
    d_eos = case["draft_eos"] if "draft_eos" in case else eos
    d_len = case.get("draft_max_len", max_len)
    # The target's vocabulary: declared (its table's width), declared one wider with no mass
    # there, or inferred (a per-prefix function without vocab_size); top_m below V.
    case["target_form"] = draw(st.sampled_from(["exact"] * 4 + ["inferred", "inferred", "wide"]))
    if case["target_form"] != "exact":
        case["batched"] = False
    case["top_m"] = draw(st.sampled_from([None, None, 1, 2, "V-1"]))
    case["index"] = draw(st.sampled_from(["seek"] * 5 + ["envelope", "brute", "foreign"]))
    case["draft_model"] = draw(st.integers(0, 5)) != 0
    case["reuse"] = draw(st.integers(0, 2)) == 2
    if draw(st.integers(0, 3)) == 3:
        case["branch_cap"] = draw(st.integers(1, vocab))
    if draw(st.integers(0, 3)) == 3:
        case["max_depth_bits"] = draw(st.sampled_from([1.0, 3.0, 6.0, 12.0]))
    if draw(st.integers(0, 2)) == 2:
        case["initial_bits"] = draw(st.sampled_from([0.0, 0.5, 2.0]))
    body = [t for t in range(vocab) if t != eos]
    # A prompt must be a prefix both models can continue.
    prompt_ok = [t for t in body if t != d_eos] if min(max_len, d_len) >= 2 else []
    if prompt_ok and draw(st.integers(0, 3)) == 3:
        case["prompt"] = [draw(st.sampled_from(prompt_ok))]
    if case.get("prompt") and case["index"] in ("brute", "foreign"):
        case["index"] = "seek"  # BruteIndex lists an unprompted table
    if len(prompt_ok) >= 2 and draw(st.integers(0, 5)) == 5:
        case["many"] = draw(st.integers(1, 3))  # rescore_many over one index per prompt
    perturb = []
    for _ in range(draw(st.integers(0, 3))):
        depth = draw(st.integers(0, max(max_len - 1, 0)))
        prefix = [draw(st.sampled_from(body or [0])) for _ in range(depth)]
        perturb.append({
            "model": draw(st.sampled_from(["target", "draft", "both"])),
            "prefix": prefix,
            "token": draw(st.integers(0, vocab - 1)),
            "value": draw(st.sampled_from(["-inf", "-5e17", "-1e30", "-3e38", "tie", "tie", "noise"])),
        })
    if perturb:
        case["perturb"] = perturb
    n_q = draw(st.integers(1, 3))
    case["queries"] = [
        [draw(st.sampled_from([0, 0, 1, 3])), draw(st.sampled_from([1, 2, 3, 6])), draw(st.sampled_from([0, 1, 3, 10, 50])),
         draw(st.sampled_from([None, "true", "true", 0.5, "half"])), draw(st.sampled_from(["plain", "plain", "prove", "until_certified"]))]
        for _ in range(n_q)
    ]
    case["sweep"] = draw(st.integers(0, 3)) == 3
    case["save_load"] = draw(st.integers(0, 4)) == 4
    case["threads"] = draw(st.integers(0, 6)) == 6
    return case


MISMATCHES = ["longer", "shorter", "draft_fixed", "draft_eos_other", "target_fixed_draft_eos", "vocab", "inferred",
              "top_m"]


@st.composite
def mismatched_strategy(draw):
    """Issue 19's families, each case forced into at least one: a draft longer or shorter than
    its target, a draft with another eos (none, another id, an eos draft of a fixed-length
    target), a wider draft vocabulary, an inferred target vocabulary, top_m below V."""
    case = draw(case_strategy())
    vocab, eos, max_len = case["vocab"], case["eos"], case["max_len"]
    forced = draw(st.sampled_from(MISMATCHES))
    if forced == "longer":
        case["draft_max_len"] = max_len + 1
    elif forced == "shorter" and max_len >= 2:
        case["draft_max_len"] = max_len - 1
    elif forced == "draft_fixed" and eos is not None:
        case["draft_eos"] = None
    elif forced == "draft_eos_other" and eos is not None:
        case["draft_eos"] = draw(st.sampled_from([t for t in range(case.get("draft_vocab", vocab)) if t != eos]))
    elif forced == "target_fixed_draft_eos" and eos is None:
        case["draft_eos"] = draw(st.integers(0, case.get("draft_vocab", vocab) - 1))
    elif forced == "vocab" and vocab <= 3:
        case["draft_vocab"] = vocab + 1
        case["target_form"] = draw(st.sampled_from(["exact", "wide", "inferred"]))
    elif forced == "inferred":
        case["target_form"], case["batched"] = "inferred", False
    else:
        case["top_m"] = draw(st.sampled_from([1, 2, "V-1"]))
    if case.get("target_form", "exact") != "exact":
        case["batched"] = False
    return case


def _case_name(case: dict) -> str:
    body = json.dumps({k: v for k, v in case.items() if k not in ("name", "note", "xfail")}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def _is_final_run() -> bool:
    """Whether hypothesis is replaying its final (shrunk) failing example."""
    try:
        from hypothesis.control import current_build_context

        return bool(current_build_context().is_final)
    except Exception:  # noqa: BLE001 - an API change only costs the automatic corpus entry
        return False


def _record(case: dict) -> Path:
    """Write a failing case into the corpus (named by its content hash)."""
    CORPUS.mkdir(parents=True, exist_ok=True)
    case = {**case, "name": _case_name(case)}
    path = CORPUS / f"{case['name']}.json"
    path.write_text(json.dumps(case, indent=1, sort_keys=True) + "\n")
    return path


def _report(request, stats: Stats, name: str) -> None:
    """Print the counts and record them (conftest's terminal summary shows them, also under
    pytest-xdist); recorded at teardown so the summary shows each test once."""
    line = stats.line(name)
    print(line)
    request.node.__dict__["_battery_line"] = line


# ---- the tests ---------------------------------------------------------------------------------

CORPUS_FILES = sorted(CORPUS.glob("*.json"))


def _corpus_params():
    for path in CORPUS_FILES:
        case = json.loads(path.read_text())
        marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if case.get("xfail") else []
        yield pytest.param(case, id=path.stem, marks=marks)


@pytest.mark.parametrize("case", list(_corpus_params()))
def test_corpus_replays_first(case, request, tmp_path):
    """Every case that ever failed, replayed before anything random."""
    stats = Stats(strict=bool(case.get("strict")))
    run_case(case, stats, tmp_path)
    _report(request, stats, f"corpus {case.get('name')}")


def _battery(request, tmp_path_factory, stats: Stats, name: str):
    tmp = tmp_path_factory.mktemp(name)

    def body(case):
        try:
            run_case(case, stats, tmp)
        except Exception:
            if _is_final_run():
                path = _record(case)
                print(f"battery: failing case written to {path}")
            raise

    return body


# CI runs the same cases every time (derandomize); JAXRESCORE_BATTERY_EXPLORE=1 draws new ones
# (with more examples through JAXRESCORE_BATTERY_EXAMPLES, to hunt for new corpus cases).
SETTINGS = dict(deadline=None, derandomize=not os.environ.get("JAXRESCORE_BATTERY_EXPLORE"), database=None,
                print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@settings(max_examples=int(os.environ.get("JAXRESCORE_BATTERY_EXAMPLES", 350)), **SETTINGS)
@given(case=case_strategy())
@example(case={  # issue 10 item 1: positive-noise steps, the same model as draft and target
    "name": "item1-positive-noise", "vocab": 3, "eos": None, "max_len": 2, "target_seed": 0, "draft_seed": 0,
    "draft": "same", "perturb": [
        {"model": "both", "prefix": [], "row": ["-inf", -LN2, -LN2 + 5e-6]},
        {"model": "both", "prefix": [1], "row": [1e-5, "-inf", "-inf"]},
        {"model": "both", "prefix": [2], "row": [0.0, "-inf", "-inf"]},
        {"model": "both", "prefix": [0], "row": [0.0, "-inf", "-inf"]}],
    "queries": [[0, 1, 0, 0.0, "plain"], [0, 2, 0, "true", "plain"], [0, 1, 0, None, "prove"]]})
@example(case={  # issue 10 item 2: a finite step far below the bucket sentinel
    "name": "item2-huge-step", "vocab": 2, "eos": None, "max_len": 1, "target_seed": 0, "draft_seed": 0,
    "draft": "same", "perturb": [{"model": "both", "prefix": [], "row": [0.0, -5e17]}],
    "queries": [[0, 2, 0, "true", "plain"], [0, 1, 0, "true", "plain"], [0, 2, 0, None, "prove"]]})
@example(case={  # logit masks at float32's minimum, uniform ties, a capped and budget-cut index
    "name": "masks-ties-caps", "vocab": 3, "eos": 0, "max_len": 3, "target_seed": 1, "draft_seed": 2,
    "style": "uniform", "draft": "noisy", "branch_cap": 2, "max_depth_bits": 3.0, "quantizer": [1.0, 1],
    "perturb": [{"model": "draft", "prefix": [], "token": 1, "value": "-3e38"}],
    "queries": [[0, 3, 0, "true", "plain"], [1, 2, 3, "true", "until_certified"], [0, 4, 1, None, "prove"]],
    "sweep": True})
@example(case={  # issue 19 item 4: a narrow sweep query certifies while the wide one refutes the gap
    "name": "issue19-sweep-evidence", "vocab": 4, "eos": None, "max_len": 1, "target_seed": 0, "draft_seed": 0,
    "draft": "same", "quantizer": [0.25, 8], "perturb": [
        {"model": "target", "prefix": [], "row": [math.log(0.3), math.log(0.6), math.log(0.05), math.log(0.05)]},
        {"model": "draft", "prefix": [], "row": [math.log(0.9)] + [math.log(0.1 / 3)] * 3}],
    "queries": [[0, 1, 0, "half", "plain"]], "sweep": True})
def test_battery_random_cases(request, tmp_path_factory, case):
    stats = request.node.__dict__.setdefault("_battery_stats", Stats())
    _battery(request, tmp_path_factory, stats, "random")(case)


@settings(max_examples=int(os.environ.get("JAXRESCORE_BATTERY_EXAMPLES_SPECIAL", 150)), **SETTINGS)
@given(case=case_strategy().map(lambda c: {**c, "sweep": True, "save_load": True,
                                           "threads": c["target_seed"] % 3 == 0,
                                           "style": "dyadic" if c["target_seed"] % 2 else c["style"]}))
@example(case={  # exact bucket edges with a coarse quantizer, saved and loaded, from threads
    "name": "dyadic-edges", "vocab": 4, "eos": None, "max_len": 3, "target_seed": 3, "draft_seed": 4,
    "style": "dyadic", "draft": "good", "quantizer": [1.0, 1], "initial_bits": 0.5,
    "queries": [[0, 5, 0, "true", "plain"], [2, 3, 1, "true", "plain"], [0, 6, 0, None, "prove"]],
    "sweep": True, "save_load": True, "threads": True})
def test_battery_sweeps_saved_indexes_threads(request, tmp_path_factory, case):
    stats = request.node.__dict__.setdefault("_battery_stats", Stats())
    _battery(request, tmp_path_factory, stats, "sweeps")(case)


@settings(max_examples=int(os.environ.get("JAXRESCORE_BATTERY_EXAMPLES_MISMATCH", 300)), **SETTINGS)
@given(case=mismatched_strategy())
@example(case={  # issue 19 item 1: a fixed-length target shorter than its draft
    "name": "issue19-longer-draft", "vocab": 3, "eos": None, "max_len": 2, "target_seed": 3, "draft_seed": 4,
    "draft": "useless", "draft_max_len": 3, "queries": [[0, 1, 2, None, "prove"], [0, 2, 0, None, "plain"]]})
@example(case={  # issue 19 item 1: an eos target under a fixed-length draft (eos mid-sequence)
    "name": "issue19-fixed-draft-of-eos-target", "vocab": 3, "eos": 2, "max_len": 3, "target_seed": 0,
    "draft_seed": 1000, "draft": "useless", "draft_eos": None, "queries": [[0, 1, 0, None, "prove"]]})
@example(case={  # issue 19 items 2 and 3: an inferred vocabulary, top_m=1, -inf draft steps
    "name": "issue19-inferred-top-m", "vocab": 4, "eos": None, "max_len": 3, "target_seed": 5, "draft_seed": 6,
    "draft": "adversarial", "target_form": "inferred", "top_m": 1, "reuse": True,
    "perturb": [{"model": "draft", "prefix": [], "token": 1, "value": "-inf"}],
    "queries": [[0, 2, 1, "true", "prove"], [0, 2, 1, "true", "plain"]], "sweep": True})
def test_battery_mismatched_pairs(request, tmp_path_factory, case):
    """Issue 19: draft/target pairs whose max_len, eos and vocabulary differ, inferred target
    vocabularies, top_m below V, every index kind, rescore_many."""
    stats = request.node.__dict__.setdefault("_battery_stats", Stats())
    _battery(request, tmp_path_factory, stats, "mismatched")(case)


@pytest.fixture(autouse=True)
def _print_counts(request):
    yield
    stats = request.node.__dict__.get("_battery_stats")
    if stats is not None:
        _report(request, stats, request.node.name)
    line = request.node.__dict__.get("_battery_line")
    if line is not None:
        request.node.user_properties.append(("battery", line))


@pytest.mark.parametrize("eos", [None, 0])
def test_battery_float32_jax_models(request, eos):
    """A float32 JAX target (TransformerLM, on-device top-m, score tolerance 1e-3) through an
    int8-twin draft and an n-gram draft fitted on its samples, brute-forced over its support."""
    import jax

    from jaxrescore import NGramLM, TransformerConfig, TransformerLM, quantize_int8
    from jaxrescore.models.generate import sample_sequences

    stats = Stats()
    for seed in range(3):
        cfg = TransformerConfig(vocab_size=3, d_model=16, n_layers=1, n_heads=2, max_len=3, eos=eos)
        target = TransformerLM(cfg, seed=seed)
        target.params = jax.tree.map(lambda x: 3.0 * x, target.params)  # answers apart from ties
        table = TableModel(3, 3, 0, eos=eos)
        support = table.support()
        truth = dict(zip(support, target.score_sequences(support)))
        ngram = NGramLM.fit(sample_sequences(target, 300, seed=seed), order=2, vocab_size=3, eos=eos, max_len=3)
        for draft in (quantize_int8(target), ngram):
            excess = true_excess(draft, target, support)
            for start, k, window, prove in ((0, 3, 0, True), (2, 4, 1, True), (0, 5, 2, False)):
                gap = excess + 0.1
                ri = RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=window, assumed_gap=gap)
                r = ri.slice(start, k, prove=prove)
                if prove:
                    assert r.proven is True, r.proof_reason
                check_result(r, truth, start, k, gap, excess, target.score_tolerance,
                             f"jax seed {seed} {type(draft).__name__} [{start}, {start + k})", stats, tie_tol=2e-3)
        stats.cases += 1
    _report(request, stats, f"float32 jax eos={eos}")


def test_a_wrong_proof_is_caught(monkeypatch, tmp_path):
    """The battery can fail: a frontier that forgets the root's exits proves wrong answers."""
    from brute import keep_only_exits

    keep_only_exits(monkeypatch, lambda ex, structure: ex.depth > 0)
    case = {"name": "broken-frontier", "vocab": 3, "eos": None, "max_len": 3, "target_seed": 5,
            "draft_seed": 6, "draft": "adversarial", "queries": [[0, 3, 0, None, "prove"]]}
    with pytest.raises(AssertionError, match="proven on a wrong answer"):
        run_case(case, Stats(), tmp_path)


def test_a_wrong_certificate_is_caught(monkeypatch, tmp_path):
    """The battery can fail: a draft bound 3 nats too optimistic certifies wrong answers under a
    true gap."""
    from jaxrescore.rescore.draft import DraftBound, DraftView

    real = DraftView.bound

    def optimistic(self, n, pull):
        b = real(self, n, pull)
        return DraftBound(b.value - 3.0, b.why) if math.isfinite(b.value) else b

    monkeypatch.setattr(DraftView, "bound", optimistic)
    case = {"name": "broken-bound", "vocab": 4, "eos": None, "max_len": 3, "target_seed": 0,
            "draft_seed": 1, "draft": "good", "queries": [[3, 3, 0, "true", "plain"]]}
    with pytest.raises(AssertionError, match="certified on a wrong answer"):
        run_case(case, Stats(), tmp_path)


def test_a_recorded_case_replays(tmp_path):
    """A failing case is written as JSON that run_case accepts unchanged."""
    global CORPUS
    saved, CORPUS = CORPUS, tmp_path
    try:
        case = {"vocab": 2, "eos": 1, "max_len": 3, "target_seed": 1, "draft_seed": 2, "draft": "good",
                "queries": [[0, 2, 1, "true", "plain"]]}
        path = _record(case)
        again = json.loads(path.read_text())
        assert again["name"] == path.stem == _case_name(case)
        run_case(again, Stats(), tmp_path)
    finally:
        CORPUS = saved
