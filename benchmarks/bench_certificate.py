"""Certificate soundness side by side: the reference library (mixle 0.8.2) against jaxrescore.

On random tiny models whose whole support can be listed, every query runs through
  * mixle's RescoredIndex over mixle's SeekIndex (the reference, as shipped),
  * jaxrescore's RescoredIndex over the SAME mixle SeekIndex (our foreign-index rules),
  * jaxrescore's RescoredIndex over jaxrescore's SeekIndex,
all with ``assumed_gap`` = the true max |target - draft| over the support (so the assumption holds
and every certificate must be right). A certificate is WRONG when ``certified is True`` but the
returned scores are not the true top-k target scores. Prints a table; run:

    pip install -e ".[bench]" && python3 benchmarks/bench_certificate.py [--models 200]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
from common import have_mixle, reference_note, section, table

from jaxrescore import RescoredIndex
from jaxrescore.index.seek import SeekIndex
from jaxrescore.models.callable import CallableModel


def random_tables(rng, vocab, length, noise):
    """Draft and target next-token tables keyed by prefix (fixed-length models)."""
    draft, target = {}, {}
    for n in range(length):
        for prefix in itertools.product(range(vocab), repeat=n):
            logits = 1.5 * rng.standard_normal(vocab)
            draft[prefix] = logits - np.logaddexp.reduce(logits)
            t = logits + noise * rng.standard_normal(vocab)
            target[prefix] = t - np.logaddexp.reduce(t)
    return draft, target


def scorer(tables):
    def score(seqs):
        return [float(sum(tables[s[:i]][t] for i, t in enumerate(s))) for s in seqs]

    return score


def measure(models, seed):
    from mixle.enumeration.autoregressive import AutoregressiveEnumerable as MixleAR
    from mixle.enumeration.envelope import AREnvelopeIndex as MixleEnvelope
    from mixle.enumeration.rescore import RescoredIndex as MixleRescored
    from mixle.enumeration.seek_index import SeekIndex as MixleSeek

    rng = np.random.default_rng(seed)
    names = [
        "mixle over mixle SeekIndex",
        "jaxrescore over mixle SeekIndex",
        "jaxrescore over jaxrescore SeekIndex",
        "mixle over mixle AREnvelopeIndex",
        "jaxrescore over mixle AREnvelopeIndex",
    ]
    stats = {n: {"queries": 0, "certified": 0, "wrong": 0} for n in names}
    for _ in range(models):
        vocab, length = int(rng.integers(2, 5)), int(rng.integers(3, 6))
        noise = float(rng.choice([0.05, 0.3, 1.0]))
        # Coarse buckets make the per-step floor slack (up to length - 1 buckets) large.
        bw, ov = float(rng.choice([1.0, 2.0, 3.0])), int(rng.choice([1, 2]))
        draft_t, target_t = random_tables(rng, vocab, length, noise)
        support = list(itertools.product(range(vocab), repeat=length))
        d_score, t_score = scorer(draft_t), scorer(target_t)
        gap = float(np.max(np.abs(np.array(t_score(support)) - np.array(d_score(support)))))
        truth = sorted(t_score(support), reverse=True)
        step = lambda p, tables=draft_t: (np.arange(vocab), tables[p])  # noqa: E731
        mixle_index = MixleSeek(MixleAR(step, max_len=length), bin_width_bits=bw, oversample=ov)
        # the envelope index's ranks are approximate (it samples paths); DESIGN says never certify
        envelope = MixleEnvelope(MixleAR(step, max_len=length), n_paths=4, seed=int(rng.integers(1 << 30)))
        ours_index = SeekIndex(
            CallableModel(step, vocab_size=vocab, max_len=length), bin_width_bits=bw, oversample=ov, progress=False
        )
        for k, window in [(1, 0), (1, 3), (2, 1), (3, 4), (5, 10), (1, 20)]:
            want = truth[:k]
            for name, make in [
                (names[0], lambda: MixleRescored(mixle_index, t_score, rerank_window=window, assumed_gap=gap)),
                (names[1], lambda: RescoredIndex(mixle_index, t_score, rerank_window=window, assumed_gap=gap)),
                (names[2], lambda: RescoredIndex(ours_index, t_score, rerank_window=window, assumed_gap=gap)),
                (names[3], lambda: MixleRescored(envelope, t_score, rerank_window=window, assumed_gap=gap)),
                (names[4], lambda: RescoredIndex(envelope, t_score, rerank_window=window, assumed_gap=gap)),
            ]:
                result = make().top_k(k)
                got = [lp for _, lp in result.items]
                stats[name]["queries"] += 1
                if result.certified is True:
                    stats[name]["certified"] += 1
                    wrong = not np.allclose(got, want, rtol=0, atol=1e-9)
                    stats[name]["wrong"] += wrong
                    if wrong and "example" not in stats[name]:
                        stats[name]["example"] = (
                            f"{name}: V={vocab} L={length} bin_width_bits={bw} oversample={ov} k={k} "
                            f"window={window} assumed_gap={gap:.4f} bound={result.bound:.4f}\n"
                            f"  returned target scores {np.round(got, 4).tolist()}\n"
                            f"  true top-{k} scores     {np.round(want, 4).tolist()}"
                        )
    return stats


def _compare(stats: dict) -> str:
    """This run's certified and wrong counts of each library over each foreign index."""
    out = []
    for index in ("mixle SeekIndex", "mixle AREnvelopeIndex"):
        ref, ours = stats[f"mixle over {index}"], stats[f"jaxrescore over {index}"]
        out.append(f"over the {index} the reference certified {ref['certified']} ({ref['wrong']} wrongly) and "
                   f"jaxrescore {ours['certified']} ({ours['wrong']} wrongly)")
    return "; ".join(out)


def run(quick: bool = False, out_dir=None, models: int = 200, seed: int = 0) -> str:
    if not have_mixle() or quick:
        body = "Needs the reference library; not run." + reference_note(quick)
        return section("Certificate soundness against the reference library (mixle 0.8.2)", COMMAND, body)
    stats = measure(models, seed)
    rows = [[name, s["queries"], s["certified"], f"**{s['wrong']}**" if s["wrong"] else 0] for name, s in stats.items()]
    examples = "\n".join(f"```\n{s['example']}\n```" for s in stats.values() if "example" in s)
    text = f"""
{models} random fixed-length models (V in 2..4, L in 3..5, coarse quantizers: bin_width_bits in
{{1, 2, 3}}, oversample in {{1, 2}}), 6 queries each (k, window in (1,0) (1,3) (2,1) (3,4) (5,10)
(1,20)), `assumed_gap` = the TRUE max |target - draft| over the whole support, so every
certificate must be right. A certificate is wrong when `certified is True` but the returned
target scores are not the true top-k.

{table(["rescoring over draft index", "queries", "certified", "WRONG certified"], rows)}

First wrong certificate of each wrong row:

{examples or "(none)"}

Why the reference goes wrong over its SeekIndex: it bounds unpulled items by the bucket of the
edge item's TOTAL log-prob, but its index orders by the SUM of per-step bucket floors, which can
be up to L-1 buckets shallower. Over its AREnvelopeIndex: the envelope's ranks are approximate,
it repeats sequences and runs out at an estimated size, and the reference treats running out as
exhaustion and bounds by bucket anyway. jaxrescore over a foreign index subtracts the per-step
slack, treats running out as exhaustion only when the index reports `truncated=False`, drops
repeated sequences and refuses to certify (`jaxrescore/rescore/draft.py`). In this run, over
the same foreign indexes: {_compare(stats)}.
"""
    return section("Certificate soundness against the reference library (mixle 0.8.2)", COMMAND, text)


COMMAND = "python3 benchmarks/run.py --only certificate"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(run(models=args.models, seed=args.seed))


if __name__ == "__main__":
    main()
