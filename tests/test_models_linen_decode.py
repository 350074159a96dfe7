"""from_linen of a module using flax's own decode cache (``decode=True`` attention): the model of
docs/kv_cache.md decodes incrementally without a hand-written step, its cached rows equal its full
forward, and a multi-token prefill equals the step-by-step rows."""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxrescore.models import decoding_session, from_linen
from model_checks import check_cached_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "kv_cache.md"


@pytest.fixture(scope="module")
def doc():
    """The page's example up to its model (the page's own run is tests/test_docs.py's)."""
    code = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)[0]
    namespace: dict = {}
    exec(compile(code.split("# A prompted model")[0], str(DOC), "exec"), namespace)
    return namespace


def test_decode_field_gives_a_session_whose_rows_equal_the_full_forward(doc):
    lm, v = doc["lm"], doc["V"]
    assert decoding_session(lm) is not None
    check_cached_rows(lm, v, 10)


def test_prefill_equals_step_by_step_and_the_prompt(doc):
    lm, v = doc["lm"], doc["V"]
    prompt = tuple(range(1, 13))
    pm = lm.with_prompt(prompt)
    rng = np.random.default_rng(1)
    pre = rng.integers(1, v, size=(8, 6)).astype(np.int32)
    lens = np.array([0, 1, 2, 3, 4, 5, 6, 6], np.int32)
    at_once = decoding_session(pm).next_logprobs(pre, lens)  # one prefill call over the prompt
    step = decoding_session(pm)
    for d in range(1, 7):
        step.next_logprobs(pre[:, :d], np.full(8, d, np.int32))
    assert step.extended == 8 * 5
    np.testing.assert_allclose(step.next_logprobs(pre, lens), at_once, atol=1e-5)
    full = np.concatenate([np.tile(prompt, (8, 1)), pre], axis=1).astype(np.int32)
    np.testing.assert_allclose(at_once, lm.next_logprobs(full, lens + len(prompt)), atol=1e-5)


def test_decode_module_choices(doc):
    module, variables, v, n = doc["module"], doc["variables"], doc["V"], doc["MAX_LEN"]
    kw = dict(vocab_size=v, bos_id=v, max_len=n, eos=0)
    assert decoding_session(from_linen(module, variables, decode_module=False, **kw)) is None
    explicit = from_linen(module, variables, decode_module=module.clone(decode=True), **kw)
    check_cached_rows(explicit, v, 6, rows=4)
    with pytest.raises(TypeError, match="decode_module"):
        from_linen(module, variables, decode_module="yes", **kw)

    class NoCache(nn.Module):  # a decode field, but no flax cache behind it
        decode: bool = False

        @nn.compact
        def __call__(self, tokens):
            return nn.Dense(v)(nn.Embed(v + 1, 4)(tokens))

    plain = NoCache()
    pv = plain.init(jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
    with pytest.raises(ValueError, match="no 'cache' collection"):
        from_linen(plain, pv, **kw)
    assert decoding_session(from_linen(plain, pv, decode_module=False, **kw)) is None
