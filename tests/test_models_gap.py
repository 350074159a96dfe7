import itertools

import numpy as np
import pytest

from jaxrescore.models.callable import CallableModel
from jaxrescore.rescore.gap import GapEstimate, estimate_gap
from jaxrescore.models.ngram import NGramLM
from jaxrescore.models.generate import sample_sequences
from jaxrescore.models.transformer import TransformerConfig, TransformerLM


def corpus(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(1, 4, size=rng.integers(0, 5))) + (0,) for _ in range(n)]


def test_sampling_stays_in_support_and_follows_the_model():
    m = NGramLM.fit(corpus(), order=2, vocab_size=4, eos=0)
    s = sample_sequences(m, 4000, seed=0)
    assert s.tokens.shape == (4000, m.max_len)
    for toks in s.to_tuples()[:200]:
        assert toks[-1] == 0 and 0 not in toks[:-1] and len(toks) <= m.max_len
    # the first token's empirical frequencies match the model's first row
    p0 = np.exp(m.next_logprobs(np.zeros((1, 1), np.int32), np.array([0])))[0]
    freq = np.bincount(s.tokens[:, 0], minlength=4) / 4000
    np.testing.assert_allclose(freq, p0, atol=0.03)


def test_fixed_length_sampling():
    rng = np.random.default_rng(1)
    m = NGramLM.fit([tuple(rng.integers(0, 3, size=4)) for _ in range(50)], vocab_size=3)
    s = sample_sequences(m, 10, seed=1)
    assert (s.lengths == 4).all()


def test_estimate_gap_on_given_and_sampled_sequences():
    draft = NGramLM.fit(corpus(), order=2, vocab_size=4, eos=0, max_len=6)
    target = TransformerLM(
        TransformerConfig(vocab_size=4, d_model=32, n_layers=1, n_heads=2, max_len=6, eos=0)
    )
    seqs = corpus(30, seed=5)
    est = estimate_gap(draft, target, seqs)
    gap = np.abs(target.score_sequences(seqs) - draft.score_sequences(seqs))
    assert isinstance(est, GapEstimate) and est.n_sequences == 30
    assert est.max_gap == pytest.approx(gap.max()) and est.mean_gap == pytest.approx(gap.mean())
    sampled = estimate_gap(draft, target, n=8, seed=0)
    assert sampled.n_sequences == 8 and sampled.max_gap >= sampled.mean_gap > 0
    assert estimate_gap(draft, draft, n=8).max_gap == 0.0


def test_gap_input_checks():
    a = NGramLM.fit(corpus(), vocab_size=4, eos=0, max_len=5)
    b = NGramLM.fit(corpus(), vocab_size=4, eos=0, max_len=6)
    with pytest.raises(ValueError, match="max_len"):
        estimate_gap(a, b)
    with pytest.raises(ValueError, match="share vocab_size"):
        estimate_gap(a, NGramLM.fit([(1, 2)], vocab_size=4))
    with pytest.raises(ValueError, match="n must"):
        estimate_gap(b, a, n=0)


def test_sampling_never_asks_a_per_prefix_model_about_prefixes_past_eos():
    # A reference-style per-prefix table only knows in-support prefixes: asking past eos fails.
    tables = {
        p: np.log([0.5 + 0.1 * len(p), 0.3 - 0.05 * len(p), 0.2 - 0.05 * len(p)])
        for n in range(4)
        for p in itertools.product([1, 2], repeat=n)
    }
    model = CallableModel(lambda p: (np.arange(3), tables[tuple(p)]), vocab_size=3, max_len=4, eos=0)
    samples = sample_sequences(model, 64, seed=1)
    assert all(s[-1] == 0 and 0 not in s[:-1] for s in samples.to_tuples())
    assert estimate_gap(model, model, n=16).max_gap == 0.0
