"""RescoreResult: what a query returns (items, verdicts, costs), and how it prints and exports."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class RescoreResult:
    """Outcome of a :class:`RescoredIndex` query: target-exact items plus two verdicts.

    ``top_k``/``slice`` are speculative: the items are always target-exact and target-ordered, but
    completeness is established only when ``proven is True`` (no assumption) or ``certified is
    True`` (under ``assumed_gap``) — check those, not ``items`` alone.

    Attributes:
      items: ``(sequence, target_log_prob)`` pairs, target-exact (each score is the target's
        full forward of that sequence, never its cached incremental path alone), sorted by
        target score (ties by draft rank).
      certified: the spec's gap certificate. None when no ``assumed_gap`` was supplied
        (certification never attempted); True only when the draft support was exhausted or the
        returned set's worst target score provably clears ``bound + assumed_gap`` plus the
        target's score tolerance; False when certification was requested but not proven (no
        sound bound, a short result from a draft that is not exhausted, the bound did not clear
        the gap, or the library's own observations refute the gap: ``excess > assumed_gap``).
      bound: the certified upper bound on any unpulled candidate's draft log-prob that the
        certificate was checked against, or None when no bound applies: nothing was left
        unpulled (the draft support was exhausted), no ``assumed_gap`` was supplied, or the draft
        index could not supply a sound bound.
      gap: running max observed ``|target_lp - draft_lp|`` over everything rescored on this index
        so far, including this query: a diagnostic, never a certificate.
      reason: why ``certified`` is what it is, in words.
      excess: running max observed ``target_lp - draft_lp`` (the side of the gap the certificate
        relies on); -inf before any finite pair.
      draft_log_probs: the draft's log-prob of each item, aligned with ``items`` (NaN when the
        draft could not score a sequence the search found).
      draft_ranks: the draft rank of each item, aligned with ``items``: its 0-based position in
        the pulled head (the draft index's rank, as ``unrank`` takes it), or None for an item the
        speculative search found outside the head.
      proven: the assumption-free verdict. None when the target gives no next-token
        distributions (a bare scoring function); True when the worst returned target score
        clears the frontier bound plus the target's score tolerance, so the items are the
        target's exact top-k (or slice) over its whole support, whatever the draft; False
        otherwise (``proof_reason`` says why), e.g. when the target's cached path disagreed with
        its full forward on the answer by more than the tolerance (the assumptions are listed in
        :mod:`jaxrescore.rescore.frontier`).
      frontier_bound: the frontier bound (an upper bound on the target score of every sequence
        the query did not score; -inf when it scored the whole support), or None without
        distributions.
      proof_reason: why ``proven`` is what it is, in words.
      rounds: target scoring rounds this query made (1 unless ``prove`` or ``until_certified``
        searched further); every round is one batched target call. A search whose answer holds
        numbers of the target's cached path checks them by a full forward in its last round's
        call, or, when that round had nothing else to score, in a call of its own (a round).
      positions: token positions the target computed for this query (see
        :attr:`~jaxrescore.rescore.RescoredIndex.target_positions`).
      check_positions: of ``positions``, those of the full forwards that checked the answer's
        cached numbers (each checked row's whole forward, its prompt included).
      texts: each item's sequence as text after the target's prompt, if any (``eos`` left out),
        aligned with ``items``, when the target has a vocabulary or a tokenizer (see
        :mod:`jaxrescore.models.text`); else None.
      gap_refuted: whether the library's own observations refute ``assumed_gap`` (``excess >
        assumed_gap +`` the target's score tolerance: the certificate's decision, not a second
        one); None when no gap was supplied.

    ``print(result)`` shows a table (:meth:`table`), a notebook an HTML one, both numbering
    ranks from 1 like the ``jaxrescore`` command; :meth:`to_dict` and :meth:`to_json` export
    everything (``draft_ranks`` as stored: from 0).
    """

    items: list
    certified: bool | None
    bound: float | None
    gap: float
    reason: str = ""
    excess: float = -math.inf
    draft_log_probs: tuple = field(default=())
    draft_ranks: tuple = field(default=())
    proven: bool | None = None
    frontier_bound: float | None = None
    proof_reason: str = ""
    rounds: int = 1
    texts: list | None = None
    positions: int = 0
    check_positions: int = 0
    gap_refuted: bool | None = None

    def __repr__(self) -> str:
        best = ""
        if self.items:
            seq, lp = self.items[0]
            shown = self.texts[0] if self.texts is not None else " ".join(map(str, seq))
            best = f", best={lp:.4g} {_clip(shown, 40)!r}"
        return (
            f"RescoreResult(items={len(self.items)}, proven={self.proven}, certified={self.certified}, "
            f"rounds={self.rounds}{best})"
        )

    def __str__(self) -> str:
        return self.table()

    def table(self, max_rows: int = 20) -> str:
        """The items as a text table (rank, target and draft log-probs, draft rank, sequence or
        text) under one line of verdicts; at most ``max_rows`` rows (a last line counts the rest).

        Both ranks count from 1, as every printed table of the library and the ``jaxrescore``
        command does: ``rank`` is the item's place in this answer (for a ``slice(start, k)``, its
        rank in the target's order is ``start + rank``), ``draft_rank`` is ``draft_ranks[i] + 1``."""
        rows = self._rows(max_rows)
        head = ("rank", "log_prob", "draft_lp", "draft_rank", "text" if self.texts is not None else "sequence")
        cells = [head] + [tuple(str(c) for c in r) for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(4)]
        lines = [self._verdicts()]
        for c in cells:
            lines.append("  ".join(c[i].rjust(widths[i]) for i in range(4)) + "  " + c[4])
        if len(self.items) > len(rows):
            lines.append(f"... {len(self.items) - len(rows)} more")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from html import escape

        rows = self._rows(50)
        head = "".join(f"<th>{h}</th>" for h in ("rank", "log_prob", "draft_lp", "draft_rank", "text" if self.texts is not None else "sequence"))
        body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        more = f"<p>... {len(self.items) - len(rows)} more</p>" if len(self.items) > len(rows) else ""
        return f"<p>{escape(self._verdicts())}</p><table><tr>{head}</tr>{body}</table>{more}"

    def _rows(self, max_rows: int) -> list:
        out = []
        for i, (seq, lp) in enumerate(self.items[:max_rows]):
            draft = self.draft_log_probs[i] if i < len(self.draft_log_probs) else math.nan
            rank = self.draft_ranks[i] if i < len(self.draft_ranks) else None
            shown = self.texts[i] if self.texts is not None else " ".join(map(str, seq))
            # printed from 1 (see table); the fields keep the index's 0-based ranks
            out.append((i + 1, f"{lp:.4f}", f"{draft:.4f}", "-" if rank is None else rank + 1, shown))
        return out

    def _verdicts(self) -> str:
        return (
            f"{len(self.items)} items; proven={self.proven} (frontier bound {self.frontier_bound}); "
            f"certified={self.certified} (bound {self.bound}); rounds={self.rounds}"
        )

    def to_dict(self) -> dict:
        """Every field as plain Python (lists, floats, bools, None): JSON-ready but for
        non-finite floats (see :meth:`to_json`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["items"] = [[list(seq), float(lp)] for seq, lp in self.items]
        out["draft_log_probs"] = [float(x) for x in self.draft_log_probs]
        out["draft_ranks"] = list(self.draft_ranks)
        out["texts"] = None if self.texts is None else list(self.texts)
        return out

    def to_json(self) -> str:
        """:meth:`to_dict` as strict JSON; a non-finite float is written as the string
        ``"inf"``, ``"-inf"`` or ``"nan"`` (e.g. ``frontier_bound`` is ``"-inf"`` when the whole
        support was scored)."""
        import json

        return json.dumps(_finite(self.to_dict()), allow_nan=False)


def _finite(value):
    """``value`` with every non-finite float replaced by its name (for strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
