"""SeekIndex: random access by rank into a model's support, in exact quantized order.

The index's state is a :class:`~jaxrescore.index.seek.state.SeekState` (arrays and plain values);
functions over it build (:mod:`~jaxrescore.index.seek.build`, :mod:`~jaxrescore.index.seek.expand`),
grow (:mod:`~jaxrescore.index.seek.growth`), order (:mod:`~jaxrescore.index.seek.order`), answer
(:mod:`~jaxrescore.index.seek.queries`), check the limits (:mod:`~jaxrescore.index.seek.limits`) and
save and load it (:mod:`~jaxrescore.index.seek.io`); :class:`~jaxrescore.index.seek.index.SeekIndex`
is the thin shell that checks arguments, holds the lock and stores the state they return.

Order. Sequences are ordered by *structural fine bucket* (the sum of the per-step buckets of
:class:`~jaxrescore.quantize.Quantizer`) ascending. Within one bucket the order is the depth-first
order that tries likelier tokens first: sequences compare step by step, a step ranking before
another when its log-prob is higher, equal log-probs by token id (the reference library's order).
The draft log-prob an index reports is the float64 sum of the model's per-step log-probs, each
clipped to ``<= 0`` first (so float noise cannot break the bucket bound).

Build. The index holds the prefix tree of every sequence within a bit budget. It is built level by
level: all live prefixes of one depth go to ``model.next_logprobs`` in chunks of ``chunk_rows``
(shapes padded to powers of two), the children whose cumulative bucket stays within the budget form
the next depth. The next-token rows of expanded prefixes are kept, so deepening to a larger budget
reads the newly admitted children off them and pays forwards only for prefixes it has never seen.
Each kept row also remembers its smallest child bucket beyond the budget built (the unexpanded
frontier, :attr:`~jaxrescore.index.seek.rows.RowChunk.nxt`): a deepening from budget ``b`` to ``b'`` reads only the rows with
a child in ``(b, b']``, so its cost follows the nodes it admits, not the rows kept. After each
build one vectorised pass per depth sorts siblings, counts the sequences below every prefix (the
count DP, bottom-up) and gives each sequence its depth-first position (top-down); the sequences are
then sorted by (bucket, position). Counts are int64: every counted sequence is one node the index
holds within ``max_bytes``, so no count can come near 2**63.

Growth. :meth:`~jaxrescore.index.seek.index.SeekIndex.ensure_count` grows by measurement, never by a guess: it deepens pass by
pass, each pass at most to the next whole bit beyond the budget built (``GROWTH_STEP_BITS``), less
(down to a quarter bit, ``MAX_SUBSTEPS``) when the growth the last pass measured reaches ``n``
sooner, straight to the first bucket holding a child when that is further, and stops as soon as
the index HOLDS ``n`` sequences. Each pass admits, best-first in the index's order, exactly the prefixes between the two
budgets. So the index ends at a budget no larger than the smallest whole-bit budget (counted from
the one built at the call) whose sequences number ``n`` or more: it holds no more sequences, and
expands no prefix, that a one-bit-at-a-time growth would not; the overshoot is at most the last
bit's worth.
Nothing is predicted, so nothing is refused on a prediction: the limits stop a pass only on what it
is about to allocate.

Rows. A wide vocabulary (``row_storage="auto"``: V > ``DENSE_ROW_VOCAB``; or ``"sparse"``) keeps
each expanded prefix's row sparse (:mod:`jaxrescore.index.seek.rows`): the cells whose child could enter
within ``KEEP_MARGIN_BITS`` beyond the budget, and a bound on the rest. Memory
then grows with the sequences indexed, not with V. The bound keeps the frontier (and so
``bucket_bound``) sound, and a deepening whose budget reaches a row's bound runs the model on that
prefix again before admitting its children (counted in ``forwards``). A table model of this
package that offers ``next_logprobs_above(prefixes, lengths, thresholds)``
(:class:`~jaxrescore.models.NGramLM`, prompted or not) hands over the kept cells and a bound itself, so no
``V``-wide row is ever built (except where ``branch_cap`` or the ``max_len`` cut needs one, and
the root's).

Limits. ``max_bytes`` (default :func:`~jaxrescore.index.seek.settings.default_max_bytes`) and ``max_nodes`` cap the index's size,
counted as ``NODE_BYTES`` per prefix-tree node plus ``4 * V`` bytes per kept whole row (a sparse
row: 8 bytes per kept cell and 12 more; rows yet to come are charged the average so far). They are
enforced on what is actually built: every admission of children, and every sparse row run again,
is checked against them before it is allocated (the children admitted, and the rows their
expansion will need). A pass that would pass a limit is undone whole, so the index stays
consistent: a budget-complete prefix tree. Growth by count (``ensure_count``, ``slice``,
``threshold``) then retries with smaller steps down to one bucket, KEEPS every pass that fitted and
raises :class:`~jaxrescore.index.IndexLimitError` (a ValueError) naming the request, the limit, the size and what the
index now holds; the index keeps answering from it. A one-pass request (``ensure_bits``, ``count``,
``count_bracket``, ``rank_bracket``, the constructor) leaves the index as it was. Transient memory
during a build can reach about twice ``max_bytes`` (sorting, merging row chunks), so set it to
about half of what may be used.

Soundness. :meth:`~jaxrescore.index.seek.index.SeekIndex.bucket_bound` bounds the draft log-prob of every sequence ranked ``>= n``
or never indexed. A prefix's bucket lower-bounds the bucket of all its completions, so the index
tracks the smallest bucket of everything it cut: children beyond the budget (recomputed at every
build), children dropped by ``branch_cap`` and, for a terminating model, prefixes cut at ``max_len``
(permanent). A terminating model's mass beyond ``max_len`` is treated like any other cut: it keeps
``truncated`` True and stays under the bound, as a target model may continue where the draft stops.
A finite step deeper than ``quantize.MAX_STEP_BITS`` (a logit mask such as ``-1e30``) saturates at a
bucket no budget reaches (``max_depth_bits <= quantize.MAX_BUDGET_BITS``): such children are never
indexed, stay cut (``truncated`` True, never "exhausted") and are covered by the bound, which the
smaller, saturated bucket only loosens. Only ``-inf`` steps are outside the support.

Threads. Every public method and property takes the index's re-entrant lock, so one index may be
shared by threads (deepening by one waits for another's); the lock is left out of pickles. A call
that fails leaves the state it started from (growth by count keeps the passes that fitted).
"""

from jaxrescore.index.seek.index import SeekIndex
from jaxrescore.index.seek.limits import IndexLimitError
from jaxrescore.index.seek.settings import default_max_bytes
from jaxrescore.index.seek.state import SeekState

__all__ = ["IndexLimitError", "SeekIndex", "SeekState", "default_max_bytes"]
