"""The reliability battery (issue 10, "Done when"): random cases against brute force.

A *case* is a JSON-ready dict describing a tiny draft/target pair and the queries to run on it
(see :func:`case_strategy`): fixed-length and eos models, target shorter than its draft, random
quantizers, dyadic rows whose steps sit exactly on bucket edges, ties (uniform rows, equal
entries), -inf and huge-negative steps (-5e17, -1e30, near float32's minimum), float32 rows
(every model here returns float32 rows, the batched form with the 1e-3 float32 tolerance),
positive-noise steps (up to 5e-6 above 0), branch_cap, budget caps (max_depth_bits,
initial_bits), prompts, sweeps, saved-and-loaded indexes and queries from several threads.

What is checked, for every query (plain, ``prove=True``, ``until_certified=True``, sweeps):

- ``proven is True`` only on the target's exact slice over its WHOLE support, tie-aware: the
  returned scores equal the true ranks' scores and every item is a distinct support sequence
  with the score the target model itself gives it (its own float32 rows, summed in float64);
- ``certified is True`` only on that exact slice, whenever ``assumed_gap`` is a TRUE one-sided
  gap (at least ``max(target - draft)`` over the support, ``+inf`` when the target gives mass
  to a sequence the draft rules out: then no gap is true and no claim is checked), and never
  while the result's own ``excess`` refutes the gap;
- items are target-exact and sorted; a proving search on these supports always proves.

Cases that ever failed live in ``tests/corpus/*.json`` and are replayed first (a case with an
``"xfail"`` entry pins a known defect outside this battery's files: it must keep failing until
fixed, then the entry is removed). A failing hypothesis case is written there automatically
(``JAXRESCORE_CORPUS`` overrides the folder). Each test reports how many cases and queries it
ran on stdout and as the ``battery`` user property (conftest prints them in the summary).
CI draws the same cases every run; ``JAXRESCORE_BATTERY_EXPLORE=1`` draws new ones and
``JAXRESCORE_BATTERY_EXAMPLES`` / ``..._SPECIAL`` set how many.
"""

from __future__ import annotations

import hashlib
import itertools
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
    preference reversed ('adversarial') or independent ('useless'); rows past the target's
    max_len (a longer draft) are random."""
    kind, seed = case["draft"], case["draft_seed"]
    length = case.get("draft_max_len", target.max_len)
    out = TableModel(target.vocab_size, length, seed, eos=target.eos)
    noise = {"good": 0.1, "noisy": 1.0, "same": 0.0}.get(kind)
    rng = np.random.default_rng([seed, 5])
    for p in out.steps:
        base = target.steps.get(p)
        if base is None or kind == "useless":
            continue
        if kind == "adversarial":
            out.steps[p] = _normalise(-base)
        else:
            out.steps[p] = _normalise(base + noise * rng.standard_normal(target.vocab_size))
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
        self.cases = self.queries = self.proven = self.certified = self.beyond_support = 0

    def line(self, name: str) -> str:
        return (
            f"battery[{name}]: {self.cases} cases, {self.queries} queries ({self.proven} proven, "
            f"{self.certified} certified checked against brute force, {self.beyond_support} asking "
            f"past the target's support)"
        )


def check_result(r, truth: dict, start: int, k: int, gap, excess: float, tolerance: float, what: str, stats: Stats,
                 tie_tol: float = TIE_TOL):
    """Assert the battery's claims about one RescoreResult (see the module docstring). Scores
    match within ``tie_tol`` (exact for table models; a JAX model's float32 forward moves a score
    by up to its ``score_tolerance`` between batches)."""
    stats.queries += 1
    got = [lp for _, lp in r.items]
    assert got == sorted(got, reverse=True), f"{what}: items not sorted by target score"
    for s, lp in r.items:
        want = truth.get(tuple(s), -math.inf)
        assert lp == want or abs(lp - want) <= tie_tol, f"{what}: item {s} has {lp}, the target gives {want}"
    if r.certified and gap is not None and r.excess > gap + tolerance + 1e-12:
        raise AssertionError(f"{what}: certified while excess {r.excess} > gap {gap}: {r.reason}")
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


def run_case(case: dict, stats: Stats, tmp: Path | None = None) -> None:
    """Build the case's models and index, run its queries, check every result."""
    stats.cases += 1
    vocab, eos = case["vocab"], case["eos"]
    target_table = build_table(case, vocab, eos, case["target_seed"])
    draft_table = derive_draft(target_table, case)
    models = {"target": target_table, "draft": draft_table}
    apply_perturbations(models, case)
    t_model = as_model(target_table, batched=case.get("batched", False))
    d_model = as_model(draft_table)
    prompt = tuple(case.get("prompt", ()))
    if prompt:
        t_model, d_model = t_model.with_prompt(prompt), d_model.with_prompt(prompt)
    support = support_of(target_table, prompt)
    truth = dict(zip(support, np.asarray(t_model.score_sequences(support), np.float64)))
    draft_support = support_of(draft_table, prompt)
    excess = true_excess(d_model, t_model, sorted(set(support) | set(draft_support), key=lambda s: (len(s), s)))
    tolerance = t_model.score_tolerance

    q = case.get("quantizer", [1.0, 8])
    kwargs = dict(bin_width_bits=q[0], oversample=q[1], branch_cap=case.get("branch_cap"),
                  max_depth_bits=case.get("max_depth_bits", 64.0), initial_bits=case.get("initial_bits", 8.0),
                  progress=False)
    index = SeekIndex(d_model, **kwargs)
    if case.get("save_load") and tmp is not None:
        path = tmp / f"index-{stats.cases}.npz"
        index.save(path)
        index = SeekIndex.load(path, d_model, progress=False)

    queries = case["queries"]
    for qi, (start, k, window, mode, how) in enumerate(queries):
        gap = _gap(mode, excess)
        what = f"case {case.get('name', '?')} query {qi} {how} start={start} k={k} window={window} gap={gap}"
        ri = RescoredIndex(index, t_model, rerank_window=window, assumed_gap=gap, draft_model=d_model)
        if how == "plain":
            r = ri.slice(start, k)
        elif how == "prove":
            r = ri.slice(start, k, prove=True)
            finite = sorted((v for v in truth.values() if v > -math.inf), reverse=True)
            if start + k <= len(finite):
                assert r.proven is True, f"{what}: the search did not prove: {r.proof_reason}"
        elif how == "until_certified":
            if gap is None:
                continue
            r = ri.slice(start, k, until_certified=True)
        else:
            raise ValueError(how)
        check_result(r, truth, start, k, gap, excess, tolerance, what, stats)

    if case.get("sweep"):
        plain = [q for q in queries if q[4] == "plain"] or queries[:1]
        ri = RescoredIndex(index, t_model, rerank_window=0)
        gaps = [_gap(q[3], excess) for q in plain]
        for group in [list(range(len(plain)))]:
            results = ri.sweep([plain[i][0] for i in group], [plain[i][1] for i in group],
                               [plain[i][2] for i in group], [gaps[i] for i in group])
            for i, r in zip(group, results):
                start, k = plain[i][0], plain[i][1]
                check_result(r, truth, start, k, gaps[i], excess, tolerance, f"case {case.get('name')} sweep", stats)

    if case.get("threads"):
        shared = RescoredIndex(SeekIndex(d_model, **{**kwargs, "initial_bits": 0.5}), t_model, rerank_window=1,
                               assumed_gap=_gap("true", excess), draft_model=d_model)
        results, errors = {}, []

        def work(i, start, k, prove):
            try:
                results[i] = shared.slice(start, k, prove=prove)
            except Exception as err:  # pragma: no cover - reported below
                errors.append(err)

        jobs = [(i, q[0], q[1], i % 2 == 0) for i, q in enumerate(queries * 2)]
        threads = [threading.Thread(target=work, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for i, start, k, _ in jobs:
            check_result(results[i], truth, start, k, shared.assumed_gap, excess, tolerance,
                         f"case {case.get('name')} thread {i}", stats)


def _gap(mode, excess: float):
    """The assumed gap of a query: None, the true excess ("true"), or the true excess plus a
    margin (a number). A case whose true excess is infinite has no true gap: the number itself."""
    if mode is None:
        return None
    if mode == "true":
        return excess if math.isfinite(excess) else None
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
    if draw(st.integers(0, 3)) == 3:
        case["branch_cap"] = draw(st.integers(1, vocab))
    if draw(st.integers(0, 3)) == 3:
        case["max_depth_bits"] = draw(st.sampled_from([1.0, 3.0, 6.0, 12.0]))
    if draw(st.integers(0, 2)) == 2:
        case["initial_bits"] = draw(st.sampled_from([0.0, 0.5, 2.0]))
    body = [t for t in range(vocab) if t != eos]
    if max_len >= 2 and body and draw(st.integers(0, 3)) == 3:
        case["prompt"] = [draw(st.sampled_from(body))]
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
         draw(st.sampled_from([None, "true", "true", 0.5])), draw(st.sampled_from(["plain", "plain", "prove", "until_certified"]))]
        for _ in range(n_q)
    ]
    case["sweep"] = draw(st.integers(0, 3)) == 3
    case["save_load"] = draw(st.integers(0, 4)) == 4
    case["threads"] = draw(st.integers(0, 6)) == 6
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


@settings(max_examples=int(os.environ.get("JAXRESCORE_BATTERY_EXAMPLES", 450)), **SETTINGS)
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
    from jaxrescore.models.sampling import sample_sequences

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
    from jaxrescore.rescore import frontier as frontier_mod
    from jaxrescore.rescore.frontier import Exits

    real = frontier_mod.node_exits

    def broken(s, trie, structure, floor=-np.inf):
        ex = real(s, trie, structure, floor)
        keep = ex.depth > 0
        return Exits(*(a[keep] for a in ex))

    monkeypatch.setattr(frontier_mod, "node_exits", broken)
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
