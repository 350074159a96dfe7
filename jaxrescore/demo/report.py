"""The demo's results as text: the answer table first (printed as soon as it is proven), then
the comparisons and costs. Output fits :data:`WIDTH` columns; log-probs are in nats."""

from __future__ import annotations

import math
import textwrap

from jaxrescore.data.names_models import DRAFT_ORDER
from jaxrescore.demo.defaults import GAP_MARGIN

WIDTH = 100
"""Columns of the printed output."""
UNITS = "log-prob = natural log of a probability, in nats (0 is certain; -2.3 is 10%)"


def _nats(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _wrapped(lines: list[str]) -> list[str]:
    """Long lines folded to :data:`WIDTH` columns, continuation lines indented."""
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]
    return out


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns (an ellipsis marks the cut)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _proof_lines(out: dict) -> list[str]:
    return [
        f"proven exact (no assumption): {out['proven']} — {out['proof_reason']}",
        f"target cost: {out['rounds']} scoring round(s), {out['target_calls']} batched call(s), "
        f"{out['target_sequences']} sequences scored by teacher forcing (window {out['window']})",
    ]


def _exact_lines(out: dict) -> list[str]:
    exact = out.get("exact_best_first")
    if not exact:
        return []
    same = "the same answer" if exact["same_answer"] else "A DIFFERENT answer"
    return [
        f"exact best-first search over the target: {exact['forwards']} prefix forwards in "
        f"{exact['calls']} batched calls ({same})"
    ]


def _certificate_verdict(cert: dict) -> str:
    """The gap certificate in plain words, from the result's numbers (the library's ``reason``
    is kept for cases these do not cover; the JSON carries it verbatim)."""
    verdict, gap, bound, worst = cert["certified"], cert["assumed_gap"], cert["bound"], cert.get("worst_log_prob")
    if verdict and bound is None:
        return "certified: True — every sequence the draft can produce was scored"
    # A scored sequence above the assumed gap contradicts it, whatever the bound says.
    if cert.get("gap_refuted"):
        return (
            f"certified: False — the assumed gap {gap:.3f} is contradicted: a scored sequence has "
            f"target - draft = {cert['excess']:.3f} nats"
        )
    if bound is not None and worst is not None and math.isfinite(bound):
        verb = "clears" if verdict else "does not clear"
        return (
            f"certified: {verdict} — the worst answer ({worst:.3f}) {verb} the highest draft "
            f"log-prob left unscored ({bound:.3f}) + the assumed gap ({gap:.3f}) + float tolerance"
        )
    return f"certified: {verdict} — {cert['reason']}"


def _certificate_lines(cert: dict | None) -> list[str]:
    if cert is None:
        return []
    lines = [
        "gap-certified query (complete IF target - draft <= the assumed gap wherever an answer "
        "could come from):",
        f"  {_certificate_verdict(cert)}",
        f"  assumed gap {cert['assumed_gap']:.3f} nats: {cert['gap_source']}",
        f"  observed over the rescored sequences: max |target - draft| {cert['gap']:.3f} nats, "
        f"max target - draft {_nats(cert['excess'])} nats",
        f"  cost: {cert['rounds']} round(s), {cert['target_calls']} call(s), "
        f"{cert['target_sequences']} sequences (window {cert['window']})"
        + ("" if cert["same_answer"] else "; its answer DIFFERS from the proven one"),
    ]
    if cert.get("gap_calibration_sequences"):
        lines.append(
            f"  gap calibration (one-off per model pair, not counted above): "
            f"{cert['gap_calibration_sequences']} sequences scored"
        )
    if cert.get("gap_covers_answers") is False:
        lines.append(
            "  WARNING: the answers fall below the region the gap was estimated on, so the "
            "certificate's assumption does not cover them"
        )
    return lines


def format_demo_answer(out: dict) -> str:
    """The proven answer: the names table, the overlap with the commonest names and the proof
    (what ``on_answer`` of ``names.run_demo`` receives is enough)."""
    cond = f" starting with {out['prefix']!r}" if out["prefix"] else ""
    if out.get("regex") is not None:
        cond += f" matching {out['regex']!r}"
    lines = _wrapped([
        f"top {out['k']} US first names{cond} under a character transformer (target), found through "
        f"a character {DRAFT_ORDER}-gram (draft)",
        UNITS + (", conditional on the prefix" if out["prefix"] else ""),
    ]) + [f"{'rank':>4}  {'name':<16}{'target (nats)':>15}{'draft (nats)':>15}  {'birth rank':>10}"]
    for i, item in enumerate(out["items"], 1):
        rank = item["birth_rank"]
        lines.append(
            f"{i:>4}  {_fit(item['text'], 16):<16}{item['target_log_prob']:>15.3f}"
            f"{_nats(item['draft_log_prob']):>15}  {rank if rank is not None else '-':>10}"
        )
    lines.append(
        f"{out['true_top_k_overlap']} of these are among the {out['k']} commonest names{cond} "
        "by birth count (SSA, 1880-2017)"
    )
    return "\n".join(lines + _wrapped(_proof_lines(out)))


def format_demo_details(out: dict) -> str:
    """What follows the answer: the best-first comparison, the gap certificate, the costs."""
    notes = _exact_lines(out) + _certificate_lines(out.get("gap_certified"))
    notes.append(
        f"draft index: {out['draft_forwards']} n-gram prefix forwards; wall time of the whole "
        f"run (loading models, draft index, proof, comparisons, gap estimate): {out['seconds']:.1f} s"
    )
    return "\n".join(_wrapped(notes))


def format_enumerate_answer(out: dict) -> str:
    """The proven answer of ``enumerate.run_enumerate``: the table and the proof."""
    what = "text" if out.get("vocabulary") else "tokens"
    cond = ", conditional on the prompt" if out.get("prompt") else ""
    width = WIDTH - 6 - 30
    lines = _wrapped([UNITS + cond]) + [f"{'rank':>4}  {what:<{width}}{'target (nats)':>15}{'draft (nats)':>15}"]
    for i, item in enumerate(out["items"], 1):
        lines.append(
            f"{i:>4}  {_fit(item['text'], width):<{width}}{item['target_log_prob']:>15.3f}"
            f"{_nats(item['draft_log_prob']):>15}"
        )
    if out["proven"] and len(out["items"]) < out["k"]:
        lines.append(
            f"(the target's whole support has {len(out['items'])} sequences: fewer than k={out['k']})"
        )
    return "\n".join(lines + _wrapped(_proof_lines(out)))


def format_enumerate_details(out: dict) -> str:
    """What follows the answer: the gap certificate (when asked for) and the costs."""
    notes = _certificate_lines(out.get("gap_certified"))
    notes.append(
        f"draft index: {out['draft_forwards']} prefix forwards; wall time of the whole run "
        f"(loading models, draft index, proof{', gap query' if out.get('gap_certified') else ''}): "
        f"{out['seconds']:.1f} s"
    )
    return "\n".join(_wrapped(notes))


def gap_source(estimate, margin: float = GAP_MARGIN) -> str:
    """A sentence saying where an ``assumed_gap`` estimated by ``estimate_top_gap`` (its
    ``TopGapEstimate``) plus ``margin`` came from."""
    return (
        f"assumed for sequences with target log-prob >= {estimate.region_lp:.3f} (the only ones "
        f"that could displace an answer): max target - draft = {estimate.excess:.3f} nats over "
        f"{estimate.n_region} such sequences (of {estimate.n_distinct} scored: the "
        f"{estimate.n_candidates} commonest names and {estimate.n_samples} target samples) "
        f"plus {margin:g} nat; an assumption, not a proof"
    )
