"""The wide benchmark's --quick run (benchmarks/bench_wide.py): it finishes, its table has every
method's row, and every answer that claims proven or certified is best-first's exact answer.

Also checks of the workload itself (benchmarks/wide.py): the parser gives the sampler's
sentences finite log-probs and rejects broken ones, and the corpus is deterministic.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import wide  # noqa: E402


def test_corpus_deterministic_and_parsed():
    a, b = wide.sample_corpus(300, 7), wide.sample_corpus(300, 7)
    assert a == b and a != wide.sample_corpus(300, 8)
    lang = wide.language()
    assert lang.vocab_size == len(set(lang.words)) and lang.words[lang.eos] == "<eos>"
    lps = np.array([wide.source_logprob(s) for s in a])
    assert np.isfinite(lps).all() and (lps < 0).all()
    lengths = [len(s) for s in a]
    assert min(lengths) >= 9 and max(lengths) <= wide.MAX_LEN
    s = a[0]
    assert wide.source_logprob(s[:-1]) == -np.inf  # no eos
    assert wide.source_logprob(s[:-2] + s[-1:]) == -np.inf  # time word missing
    # The possessive agrees with the subject: swap its/their/his/her and the sentence is out.
    poss = [i for i, t in enumerate(s) if lang.words[t] in wide.POSSESSIVES][-1]
    other = next(w for w in wide.POSSESSIVES if w != lang.words[s[poss]])
    broken = s[:poss] + (lang.ids[other],) + s[poss + 1:]
    assert wide.source_logprob(broken) == -np.inf


def test_source_probabilities_sum_to_one_on_a_small_slice():
    """The parser's probabilities are the sampler's: over many draws, the empirical frequency of
    the commonest sentence matches its parsed probability."""
    draws = wide.sample_corpus(40_000, 11)
    values, counts = np.unique(np.array([hash(s) for s in draws]), return_counts=True)
    top = draws[[hash(s) for s in draws].index(values[np.argmax(counts)])]
    p = np.exp(wide.source_logprob(top))
    freq = counts.max() / len(draws)
    assert abs(freq - p) < 4 * np.sqrt(p * (1 - p) / len(draws)) + 1e-4


@pytest.mark.slow
def test_quick_run(tmp_path):
    import bench_wide

    text = bench_wide.run(quick=True, out_dir=str(tmp_path))
    assert text.startswith("## Top-k on a wide workload")
    assert "python3 benchmarks/bench_wide.py --quick" in text
    assert os.path.exists(tmp_path / "wide_target_quick.npz") and os.path.exists(tmp_path / "wide_student_quick.npz")
    rows = [line for line in text.splitlines() if line.startswith("| top-10 of 'the dog' |")]
    methods = [r.split(" | ")[1] for r in rows]
    for name in ("best-first (batch 10)", "best-first, KV cache (batch 10)", "prove, 3-gram draft", "prove, student draft",
                 "prove jointly (rescore_many), student draft",
                 "certified, 3-gram draft", "certified, student draft", "SeekIndex(target)", "beam (B = 10)",
                 "beam (B = 40)"):
        assert name in methods, (name, methods)
    # Every proven or certified claim was compared with best-first's answer in the run itself:
    # every proof must agree; a certificate may only be wrong where its assumed gap is false.
    proofs = re.search(r"(\d+) of (\d+) proven answers equal best-first's exact answer", text)
    assert proofs and proofs.group(1) == proofs.group(2) and int(proofs.group(2)) >= 3, text
    assert "WRONG" not in text
    certs = re.search(r"(\d+) of (\d+) certified answers do(.*)", text)
    assert certs and (certs.group(1) == certs.group(2) or "is false there" in certs.group(3))
    summary = {r.split(" | ")[1]: r.split(" | ") for r in rows}
    assert summary["best-first (batch 10)"][5] == "1.00"
    for name, cells in summary.items():
        verdict = cells[6]
        if re.match(r"[1-9]\d*/", verdict):  # some prompt proven or certified
            assert cells[5].startswith("1.00"), (name, cells)


@pytest.mark.parametrize("bad", ["the dragon", "dog dog xyz"])
def test_encode_names_unknown_word(bad):
    with pytest.raises(KeyError, match="not a word"):
        wide.language().encode(bad)
