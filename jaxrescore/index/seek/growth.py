"""Growth: deepening to a budget in one pass, or pass by pass until the index holds ``n`` sequences.

Growth by count deepens by measurement, never by a guess: each pass goes at most to the next whole
bit beyond the budget built (``GROWTH_STEP_BITS``), less (down to ``1 / MAX_SUBSTEPS`` of it) when
the growth the last pass measured reaches ``n`` sooner, straight to the first bucket holding a
child when that is further, and it stops as soon as the index holds ``n`` sequences. A pass that
would pass a limit is retried with smaller steps down to one bucket; when even that fails the
IndexLimitError carries (``kept``) the last consistent state, the passes that fitted.
"""

from __future__ import annotations

import math

from jaxrescore.index.seek import build
from jaxrescore.index.seek.expand import Session
from jaxrescore.index.seek.limits import MAX_RANK, IndexLimitError
from jaxrescore.index.seek.order import rank
from jaxrescore.index.seek.rows import compact
from jaxrescore.index.seek.settings import SeekSettings, max_budget
from jaxrescore.index.seek.state import SeekState, size
from jaxrescore.quantize import NO_BUCKET

# Growth by count deepens to the next multiple of this many bits per pass: the index then ends at
# most one step's worth of sequences past what was asked. Passes cost what they admit (the kept
# rows remember their frontier), so small steps are cheap; a whole bit is the reference grid.
GROWTH_STEP_BITS = 1.0
# ... and a pass goes a smaller part of a step (at least 1 / MAX_SUBSTEPS of it) when the growth
# measured by the last pass says n is reached sooner.
MAX_SUBSTEPS = 4


def grow(cfg: SeekSettings, state: SeekState, session: Session, budget: int, request: str) -> SeekState:
    """One build pass to ``budget``, compacted and ranked, all or nothing: on an IndexLimitError
    ``err.kept`` is ``state`` (a model error simply leaves ``state`` to the caller)."""
    try:
        new = build.grow_pass(cfg, state, session, budget, request)
    except IndexLimitError as err:
        err.kept = state
        raise
    new = rank(new._replace(chunks=compact(new.chunks)))
    return new._replace(measured=(state.budget, size(state)))  # the growth this pass measured


def deepen_to(cfg: SeekSettings, state: SeekState, session: Session, budget: int, request: str) -> SeekState:
    """Built to ``budget`` in one pass (no pass when built, or when nothing new fits)."""
    if budget <= state.budget:
        return state
    if state.budget >= 0 and state.frontier_min > budget:
        return state._replace(budget=budget)
    return grow(cfg, state, session, budget, request)


def deepen_for_count(cfg: SeekSettings, state: SeekState, session: Session, n: int, request: str,
                     max_rows: int | None = None) -> SeekState:
    """Deepened pass by pass until ``n`` sequences are held (or nothing more can be). With
    ``max_rows``: no pass that would take the model rows evaluated beyond ``max_rows`` more than
    now; growth simply stops before it (a query's budget, not an error)."""
    n = min(n, MAX_RANK)  # no index holds more: larger requests mean "as many as there are"
    if max_rows is not None:
        cfg = cfg._replace(max_rows=state.n_rows + max_rows)
    while size(state) < n and state.frontier_min < NO_BUCKET and state.budget < max_budget(cfg):
        try:
            state = _grow_fitting(cfg, state, session, next_step(cfg, state, n), request)
        except IndexLimitError as err:
            if max_rows is None or err.limit != "max_rows":
                raise
            return state
    return state


def next_step(cfg: SeekSettings, state: SeekState, n: int) -> int:
    """The budget of the next pass of growth by count towards ``n`` sequences: the next
    multiple of ``GROWTH_STEP_BITS`` beyond the budget built, or less when the growth MEASURED
    by the last pass reaches ``n`` sooner (never less than ``1 / MAX_SUBSTEPS`` of a step, so
    at most that many passes a step), or the first bucket holding a child when that is
    further (no empty passes); within ``max_depth_bits``. It never passes the next whole
    step, so the index ends at or below the whole-step budget that holds ``n``."""
    q, b, held = cfg.quantizer, state.budget, size(state)
    step = max(GROWTH_STEP_BITS, 1.0 / q.scale)
    target = q.budget((math.floor(b / q.scale / step + 1e-9) + 1) * step)
    seen = state.measured  # (budget, sequences) before the last pass
    if seen is not None and 0 < seen[1] < held < n and seen[0] < b:
        per_bucket = math.log(held / seen[1]) / (b - seen[0])
        reach = b + math.ceil(math.log(n / held) / per_bucket)
        least = b + max(1, math.ceil(step * q.scale / MAX_SUBSTEPS))
        target = min(target, max(reach, least))
    return min(max(target, b + 1, state.frontier_min), max_budget(cfg))


def _grow_fitting(cfg: SeekSettings, state: SeekState, session: Session, target: int, request: str) -> SeekState:
    """One pass to ``target``; if it would pass a limit, retry halfway back (never below the
    first bucket beyond the budget) before giving up."""
    while True:
        if state.frontier_min > target:
            return state._replace(budget=max(state.budget, target))
        try:
            return grow(cfg, state, session, target, request)
        except IndexLimitError:
            smaller = max(state.frontier_min, (state.budget + target) // 2)
            if smaller >= target:
                raise
            target = smaller
