"""The design card, literally: the pure core and the pure proof check, under ``jax.jit`` and
``jax.vmap`` over a batch of queries with an explicit carry, give the shell's verdicts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from brute import TableModel, as_model
from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.rescore import GapCarry, frontier_bound, proof_verdict, rescore_sweep, slice_worst
from jaxrescore.rescore.core import CERT_NONE, CERT_TRUE
from jaxrescore.rescore.frontier import structure_numbers
from jaxrescore.rescore.proof import padded
from jaxrescore.rescore.target import target_structure


def pure_queries(target_lps, draft_lps, valid, edges, starts, ks, gaps, carry, arrays, structure, tolerance, *, k_max):
    """Every query's order, certificate and proof from arrays alone: the vmapped core, then the
    frontier of each query's own rows and the verdict, vmapped over the queries."""
    out, carry = rescore_sweep(target_lps, draft_lps, valid, edges, starts, ks, gaps, carry, k_max=k_max,
                               tolerance=tolerance)

    def proof(rows, start, k, log_probs, mask):
        bound, moved = frontier_bound(arrays, rows, *structure)
        return proof_verdict(slice_worst(log_probs, mask, k), start, bound, moved, tolerance), bound

    proven, bound = jax.vmap(proof)(valid[:, : arrays.tokens.shape[0]], starts, ks, out.log_probs, out.mask)
    return out, proven, bound, carry


JIT_QUERIES = jax.jit(pure_queries, static_argnames="k_max")


@pytest.mark.parametrize("eos, kind", [(0, "good"), (None, "noisy"), (2, "reversed")])
def test_jit_vmap_of_the_pure_functions_equals_the_shell(eos, kind):
    target = TableModel(4, 4, 101, eos=eos, temperature=2.0)
    noise = {"good": 0.1, "noisy": 1.0, "reversed": 0.0}[kind]
    draft = TableModel(4, 4, 7, eos=eos, base=target if kind != "reversed" else None, noise=noise)
    t_model, d_model = as_model(target), as_model(draft)
    starts, ks = [0, 0, 2, 1, 0, 5], [1, 4, 3, 6, 12, 2]
    windows, gaps = [0, 3, 1, 40, 0, 7], [None, 0.5, 3.0, 8.0, None, 0.0]
    shell = RescoredIndex(SeekIndex(d_model), t_model).sweep(starts, ks, windows, gaps)

    fresh = RescoredIndex(SeekIndex(d_model), t_model)
    extents = [s + k + w for s, k, w in zip(starts, ks, windows)]
    pull = fresh.draft.pull(max(extents))
    scored = fresh.new_scored_set()
    scored.add(pull.seqs, pull.draft_lps, np.arange(len(pull.seqs)))
    n = len(scored)
    rows = [min(e, n) for e in extents]
    edges = np.full(n, np.nan)
    for r, g in zip(rows, gaps):
        if g is not None:
            edges[r - 1] = fresh.draft.bound(r, pull).value
    # one padded shape for every case: the pure functions compile once
    size = 256
    valid = np.arange(size)[None, :] < np.array(rows)[:, None]
    target_lps, draft_lps, edges_p = (np.full(size, fill) for fill in (-np.inf, -np.inf, np.nan))
    target_lps[:n], draft_lps[:n], edges_p[:n] = scored.target_lps, scored.draft_lps, edges
    arrays = padded(scored.arrays(), size, 8)
    with jax.enable_x64(True):
        carry = GapCarry(jnp.float64(0.0), jnp.float64(-jnp.inf), jnp.int32(0), jnp.int32(0))
        out, proven, bound, after = JIT_QUERIES(
            target_lps, draft_lps, valid, edges_p, np.array(starts), np.array(ks),
            np.array([np.nan if g is None else g for g in gaps]), carry, arrays,
            structure_numbers(target_structure(t_model)), scored.tolerance, k_max=16)
    out, proven, bound = jax.device_get((out, proven, bound))
    for q, r in enumerate(shell):
        items = [scored.seqs[i] for i in out.perm[q][out.mask[q]]]
        assert items == [s for s, _ in r.items]
        code = int(out.certified[q])
        assert r.certified == (None if code == CERT_NONE else code == CERT_TRUE)
        assert r.proven == bool(proven[q]) and r.frontier_bound == pytest.approx(float(bound[q]), abs=1e-12)
    assert int(after.sequences) == n and int(after.calls) == 1
    assert any(r.proven for r in shell) and (kind != "good" or any(r.certified for r in shell))


def test_a_proven_sweep_equals_its_single_proven_queries():
    """``sweep(..., prove=True)`` searches once for its widest query; every slice it returns is
    proven and equal to the same slice proven alone."""
    target = TableModel(4, 5, 3, eos=1, temperature=2.0)
    draft = TableModel(4, 5, 9, eos=1, base=target, noise=1.0)
    t_model, d_model = as_model(target), as_model(draft)
    starts, ks = [0, 3, 0, 7], [2, 4, 10, 1]
    swept = RescoredIndex(SeekIndex(d_model), t_model, rerank_window=0).sweep(starts, ks, prove=True)
    for (s, k), r in zip(zip(starts, ks), swept):
        alone = RescoredIndex(SeekIndex(d_model), t_model, rerank_window=0).slice(s, k, prove=True)
        assert r.proven is True and alone.proven is True
        assert [lp for _, lp in r.items] == pytest.approx([lp for _, lp in alone.items], abs=1e-9)
