"""SeekIndex build time and peak memory against the bit budget, beside the reference library.

Two fixed random fixed-length models (a float32 next-token table per position and previous token,
as in ``bench_seek_index.py``): V=32, L=6 and V=64, L=8. Each build runs in a FRESH subprocess
(so peak RSS is the build's own): the model is made, the process's RSS is read, the index is built
to the budget, and the peak RSS above that baseline is reported with the wall time, the sequences
indexed, the index's own ``nbytes`` and bytes per indexed sequence. The reference library builds
the same table to the same budget where it finishes within the time limit. A plot of time and
memory against bits is written to the output folder.

    python3 benchmarks/bench_seek_memory.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os

from common import have_mixle, reference_note, run_child, section, table

COMMAND = "python3 benchmarks/run.py --only seek_memory"
HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {here!r})
from bench_seek_index import make_table, jax_model, mixle_model
vocab, length, bits, side = {vocab}, {length}, {bits}, {side!r}
table = make_table(vocab, length, 0)
def rss():  # peak so far, bytes (Linux reports KiB)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if side == "ours":
    from jaxrescore.index.seek import SeekIndex
    model = jax_model(table)
    model.next_logprobs(table[:1, 0, :1].astype("int32"), [0])  # compile outside the build
    base = rss(); t = time.perf_counter()
    index = SeekIndex(model, initial_bits=bits, max_depth_bits=bits, progress=False, max_bytes=8 << 30)
    out = dict(seconds=time.perf_counter() - t, peak=rss() - base, n=len(index), nbytes=index.nbytes)
else:
    from mixle.enumeration import SeekIndex as MixleSeek
    model = mixle_model(table)
    base = rss(); t = time.perf_counter()
    index = MixleSeek(model, bin_width_bits=1.0, oversample=8, max_depth_bits=bits)
    index.ensure_bits(bits)
    out = dict(seconds=time.perf_counter() - t, peak=rss() - base, n=len(index), nbytes=None)
print(json.dumps(out))
"""


def build(vocab, length, bits, side, timeout):
    return run_child(CHILD.format(here=HERE, vocab=vocab, length=length, bits=bits, side=side), timeout, 120)


def run(quick: bool = False, out_dir=None) -> str:
    models = ((32, 6),) if quick else ((32, 6), (64, 8))
    budgets = (12, 16) if quick else (12, 16, 20, 24, 28)
    timeout = 30
    with_mixle = have_mixle() and not quick
    rows, points = [], []
    for vocab, length in models:
        mixle_dead = None  # why larger budgets of the reference are skipped (an error, or a prediction)
        mixle_times: list = []
        for bits in budgets:
            ours = build(vocab, length, bits, "ours", timeout)
            row = [f"V={vocab} L={length}", bits]
            if "error" in ours:
                row += [ours["error"], "", "", "", ""]
            else:
                row += [ours["n"], f"{ours['seconds']:.2f} s", f"{ours['peak'] / 2**20:.0f} MiB",
                        f"{ours['nbytes'] / 2**20:.1f} MiB", f"{ours['nbytes'] / max(ours['n'], 1):.0f}"]
                points.append((vocab, length, bits, ours["seconds"], ours["peak"]))
            if with_mixle:
                if mixle_dead:
                    theirs = {"error": f"skipped ({mixle_dead})"}
                else:
                    theirs = build(vocab, length, bits, "mixle", timeout)
                    mixle_times.append(theirs.get("seconds"))
                    mixle_dead = (f"a smaller budget: {theirs['error']}" if "error" in theirs
                                  else _over_cut(mixle_times, timeout))
                row += [theirs.get("error") or f"{theirs['seconds']:.2f} s",
                        "" if "error" in theirs else f"{theirs['peak'] / 2**20:.0f} MiB"]
            rows.append(row)
    header = ["model", "bits", "sequences", "build", "peak RSS", "index nbytes", "bytes / sequence"]
    if with_mixle:
        header += ["reference build", "reference peak RSS"]
    plot = _plot(points, out_dir)
    text = f"""
Fixed random tables ({", ".join(f"V={v} L={n}" for v, n in models)}), `bin_width_bits=1`, `oversample=8`; one fresh
subprocess per build; peak RSS above the process's RSS before the build (model made first, and
for jaxrescore its forward compiled); `index nbytes` is what `max_bytes` counts (nodes plus the kept
next-token rows, 4 V bytes each, which let deepening skip forwards already paid for). Builds are
cut at {timeout} s (the subprocess's start included).

{table(header, rows)}
{reference_note(quick)}{plot}
"""
    return section("SeekIndex build time and peak memory against the bit budget", COMMAND, text)


def _over_cut(times: list, cut: float) -> str | None:
    """Why the reference's next budget is skipped: the growth of its last two build times
    (measured here, 4 bits apart) predicts it past the cut; None otherwise."""
    if len(times) < 2 or not times[-2] or not times[-1] or times[-2] < 0.5:
        return None
    predicted = times[-1] * times[-1] / times[-2]
    if predicted <= cut:
        return None
    return (f"predicted {predicted:.0f} s, over the {cut:.0f} s cut: {times[-2]:.1f} s then {times[-1]:.1f} s "
            "at the two budgets below")


def _plot(points, out_dir) -> str:
    if not points or out_dir is None:
        return ""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for vocab, length in sorted({(p[0], p[1]) for p in points}):
        ps = [p for p in points if p[:2] == (vocab, length)]
        a.plot([p[2] for p in ps], [p[3] for p in ps], "o-", label=f"V={vocab} L={length}")
        b.plot([p[2] for p in ps], [p[4] / 2**20 for p in ps], "o-", label=f"V={vocab} L={length}")
    for ax, label in ((a, "build time (s)"), (b, "peak RSS above baseline (MiB)")):
        ax.set_xlabel("bit budget")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "seek_memory.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"\n![SeekIndex build time and memory against bits]({path})\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print(run(args.quick, args.out))


if __name__ == "__main__":
    main()
