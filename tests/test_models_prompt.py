import itertools

import numpy as np
import pytest

from jaxrescore.models.ngram import NGramLM
from jaxrescore.models.prompt import PromptedModel
from jaxrescore.models.generate import sample_sequences
from jaxrescore.models.transformer import TransformerConfig, TransformerLM


def ngram():
    rng = np.random.default_rng(0)
    seqs = [tuple(int(t) for t in rng.integers(1, 4, size=rng.integers(0, 5))) + (0,) for _ in range(200)]
    return NGramLM.fit(seqs, order=3, vocab_size=4, eos=0)


def test_prompted_scores_are_conditionals_summing_to_one():
    rng = np.random.default_rng(1)
    m = NGramLM.fit([tuple(rng.integers(0, 3, size=4)) for _ in range(60)], order=2, vocab_size=3)
    pm = m.with_prompt([2])
    assert isinstance(pm, PromptedModel) and pm.max_len == 3
    conts = list(itertools.product(range(3), repeat=3))
    np.testing.assert_allclose(np.exp(pm.score_sequences(conts)).sum(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(
        pm.score_sequences(conts),
        m.score_sequences([(2,) + c for c in conts]) - m.score_sequences([(2,)])[0],
        atol=1e-5,
    )


def test_nested_and_empty_prompts():
    m = ngram()
    seqs = [(3, 0), (1, 2, 0), (0,)]
    np.testing.assert_allclose(
        m.with_prompt([1]).with_prompt([2]).score_sequences(seqs),
        m.with_prompt([1, 2]).score_sequences(seqs),
    )
    assert m.with_prompt([1]).with_prompt([2]).prompt == (1, 2)
    np.testing.assert_allclose(m.with_prompt([]).score_sequences(seqs), m.score_sequences(seqs))


def test_several_prompts_in_one_base_call():
    """The lead's rescoring pattern: prompt + candidate rows, skip = prompt length."""
    m = TransformerLM(TransformerConfig(vocab_size=4, d_model=32, n_layers=1, n_heads=2, max_len=6, eos=0))
    jobs = [((1,), (2, 0)), ((1, 3), (0,)), ((), (3, 3, 0)), ((2, 2, 2), (1, 0))]
    one_call = m.score_sequences([p + c for p, c in jobs], skip=[len(p) for p, _ in jobs])
    separate = [m.with_prompt(p).score_sequences([c])[0] for p, c in jobs]
    np.testing.assert_allclose(one_call, separate, atol=1e-5)


def test_sampling_a_prompted_model():
    pm = ngram().with_prompt([1, 2])
    s = sample_sequences(pm, 16, seed=0)
    assert s.tokens.shape == (16, pm.max_len)
    assert all(t[-1] == 0 and len(t) <= pm.max_len for t in s.to_tuples())


def test_a_prompt_may_contain_eos():
    """A chat prompt ends the user's turn with the eos that ends the answer: the prompt is
    context, its continuations the support; the teacher-forced and the cached paths agree."""
    m = TransformerLM(TransformerConfig(vocab_size=4, d_model=32, n_layers=1, n_heads=2, max_len=6, eos=0))
    pm = m.with_prompt([1, 0, 2])
    seqs = [(0,), (3, 0), (1, 2, 0)]
    by_rows = []
    for s in seqs:  # row j: log p(. | prompt + s[:j]), prefixes padded to 2 tokens
        prefixes = np.array([list(s[:j]) + [0] * (2 - j) for j in range(len(s))], np.int32)
        rows = pm.next_logprobs(prefixes, np.arange(len(s), dtype=np.int32))
        by_rows.append(sum(float(rows[j, t]) for j, t in enumerate(s)))
    np.testing.assert_allclose(pm.score_sequences(seqs), by_rows, atol=1e-4)
    assert ngram().with_prompt([1, 0]).max_len == ngram().max_len - 2


def test_prompt_errors():
    m = ngram()
    with pytest.raises(ValueError, match="no room"):
        m.with_prompt([1] * m.max_len)
    with pytest.raises(ValueError, match="tokens must lie"):
        m.with_prompt([9])
    with pytest.raises(ValueError, match="skip must have shape"):
        m.with_prompt([1]).score_sequences([(0,)], skip=[0, 1])
