"""Ancestral sampling from any model of the protocol: one batched ``next_logprobs`` call per step."""

from __future__ import annotations

import numpy as np

from jaxrescore._checks import check_int
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.checked import checked_model
from jaxrescore.sequences import SequenceBatch


def sample_sequences(model: AutoregressiveEnumerable, n: int, *, seed: int = 0) -> SequenceBatch:
    """``n`` sequences drawn token by token from ``model`` (host float64 inverse-CDF sampling).

    A terminating model's row stops at its first ``eos``; a row that reaches ``max_len - 1``
    tokens without one is closed with ``eos``, so every sample lies in the model's support
    (such rows are drawn from the model truncated at ``max_len``). A fixed-length model's rows
    have exactly ``max_len`` tokens.

    Returns:
      SequenceBatch with tokens int32[n, max_len] and lengths int32[n].
    """
    n = check_int(n, "n", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    model = checked_model(model, "model")  # a duck model's rows are checked as they arrive
    rng = np.random.default_rng(seed)
    t = model.max_len
    tokens = np.zeros((n, t), np.int32)
    lengths = np.full(n, t, np.int32)
    alive = np.ones(n, bool)
    for j in range(t):
        if model.eos is not None and j == t - 1:
            tokens[alive, j] = model.eos
            break
        # Finished rows ride along as the empty prefix (always a valid one, unlike a prefix past
        # eos), so every step has the same batch shape (fewer compiles).
        lp = model.next_logprobs(tokens[:, : max(j, 1)], np.where(alive, j, 0).astype(np.int32))
        cdf = np.cumsum(np.exp(lp.astype(np.float64)), axis=1)
        u = rng.random(n) * cdf[:, -1]
        tok = np.minimum((cdf < u[:, None]).sum(axis=1), model.vocab_size - 1)
        tokens[alive, j] = tok[alive]
        if model.eos is not None:
            done = alive & (tok == model.eos)
            lengths[done] = j + 1
            alive &= ~done
            if not alive.any():
                break
    return SequenceBatch(tokens, lengths)
