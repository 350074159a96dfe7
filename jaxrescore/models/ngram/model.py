"""NGramLM: an interpolated Kneser-Ney n-gram model stored as sparse back-off tables.

The model is a thin shell: its state is an :class:`~jaxrescore.models.ngram.tables.NGramTables`
(a NamedTuple of arrays), fitting is :mod:`jaxrescore.models.ngram.fit` and every lookup a pure
function of :mod:`jaxrescore.models.ngram.lookup`; the shell checks arguments, keeps the tables
and the caches built from them once (the dense rows of every seen context, each level's terms by
value) and answers the protocol. Everything runs on the host in numpy; with a mesh, lookups still
run on the host (a table model has no forward to split).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from jax.sharding import Mesh

from jaxrescore._checks import check_int
from jaxrescore.models.base import check_support
from jaxrescore.models.batching import length_bucket
from jaxrescore.models.checks import check_prefixes, check_tokens
from jaxrescore.models.mesh import check_mesh, with_recorded_mesh
from jaxrescore.models.ngram import lookup
from jaxrescore.models.ngram.fit import check_corpus, fit_levels
from jaxrescore.models.ngram.tables import NGramLevel, NGramTables, build_tables, levels_from_dense
from jaxrescore.models.prompt import PromptableMixin
from jaxrescore.models.scores import TABLE_TOLERANCE, StepScored
from jaxrescore.sequences import SequenceBatch, as_sequence_batch
from jaxrescore.typing import ArrayLike, Sequences


class NGramLM(StepScored, PromptableMixin):
    """Interpolated Kneser-Ney n-gram LM over sparse back-off tables (build with :meth:`fit`).

    Attributes:
      vocab_size, eos, max_len: the protocol attributes.
      order: n (contexts of ``order - 1`` tokens).
      discounts: ``D_k`` per context length ``k = 0..order-1``.
      tables: the state, an :class:`~jaxrescore.models.ngram.tables.NGramTables`.
      mesh: optional ``jax.sharding.Mesh`` (recorded; lookups run on the host).
    """

    score_tolerance = TABLE_TOLERANCE  # a context's row is the same in every batch

    def __init__(
        self,
        levels: Sequence[NGramLevel],
        *,
        order: int,
        vocab_size: int,
        eos: int | None,
        max_len: int,
        discounts: Sequence[float],
        mesh: Mesh | None = None,
    ):
        self.order = check_int(order, "order", minimum=1)
        self.vocab_size, self.eos, self.max_len = check_support(vocab_size, eos, max_len, "NGramLM")
        self.tables: NGramTables = build_tables(levels, self.order, self.vocab_size)
        self.discounts = tuple(float(d) for d in discounts)
        self.mesh = check_mesh(mesh)
        self._dense = None  # (the dense cache or None when too large,), built on first use
        self._by_value = None  # each level's terms by value, built on first use

    def __repr__(self) -> str:
        return (
            f"NGramLM(order={self.order}, V={self.vocab_size}, eos={self.eos}, "
            f"max_len={self.max_len}, contexts={self.n_contexts}, terms={self.n_terms})"
        )

    def with_mesh(self, mesh: Mesh | None, *, shard_params: bool = False) -> "NGramLM":
        """A copy sharing the tables that records ``mesh`` (lookups still run on the host: a table
        model has no forward to split). ``shard_params`` is accepted for a uniform interface."""
        return with_recorded_mesh(self, mesh, shard_params)

    @property
    def levels(self) -> tuple:
        """One :class:`~jaxrescore.models.ngram.tables.NGramLevel` per context length ``0..order-1``."""
        return self.tables.levels

    @property
    def base_row(self) -> np.ndarray:
        """float64[V], ``P_0`` (the unigram level with its uniform back-off)."""
        return self.tables.base_row

    @property
    def n_contexts(self) -> int:
        """Seen contexts over all context lengths."""
        return self.tables.n_contexts

    @property
    def n_terms(self) -> int:
        """Stored n-gram terms over all orders (what memory grows with)."""
        return self.tables.n_terms

    @property
    def nbytes(self) -> int:
        """Bytes of the tables (levels, the entry keys and the dense order-0 row)."""
        return self.tables.nbytes

    @classmethod
    def fit(
        cls,
        sequences: Sequences,
        *,
        order: int = 3,
        vocab_size: int,
        eos: int | None = None,
        max_len: int | None = None,
        discount: float | None = 0.75,
        weights: ArrayLike | None = None,
        mesh: Mesh | None = None,
    ) -> "NGramLM":
        """Fit counts from a corpus (vectorised numpy: a few sorts per order).

        Args:
          sequences: the corpus, in the model's support: a SequenceBatch or list of token
            sequences; with ``eos`` every sequence ends with ``eos`` (and has no other eos);
            without it every sequence has exactly ``max_len`` tokens.
          order: n in ``[1, MAX_ORDER]`` (1 = unigram).
          vocab_size: V; tokens lie in ``[0, V)``.
          eos: end-of-sequence id, or None for fixed-length sequences.
          max_len: the longest sequence in the support (default: the longest in the corpus).
          discount: ``D`` in ``(0, 1]`` for every order, or None for Ney's per-order estimate
            ``n1 / (n1 + 2 n2)`` (meaningful for integer counts).
          weights: optional non-negative float[N]: how often each sequence occurs.
          mesh: optional ``jax.sharding.Mesh`` (recorded; lookups run on the host).
        """
        batch, w, order, vocab_size, eos, max_len = check_corpus(
            sequences, order, vocab_size, eos, max_len, discount, weights
        )
        levels, discounts = fit_levels(batch, w, order, vocab_size, discount)
        return cls(levels, order=order, vocab_size=vocab_size, eos=eos, max_len=max_len, discounts=discounts, mesh=mesh)

    @classmethod
    def from_table(
        cls,
        table: ArrayLike,
        context_keys: Sequence[ArrayLike],
        *,
        order: int,
        vocab_size: int,
        eos: int | None,
        max_len: int,
        discounts: Sequence[float],
        mesh: Mesh | None = None,
    ) -> "NGramLM":
        """The model of a dense table (the storage of model files written before sparse tables):
        ``table`` float32[R, V] full log-prob rows of every seen context of every order, and per
        context length ``k`` its sorted base-``(V + 1)`` keys (oldest token most significant)."""
        v = check_int(vocab_size, "vocab_size", minimum=1)
        order = check_int(order, "order", minimum=1)
        levels = levels_from_dense(table, context_keys, order, v)
        return cls(levels, order=order, vocab_size=v, eos=eos, max_len=max_len, discounts=discounts, mesh=mesh)

    # ---- caches -----------------------------------------------------------------------------

    def _dense_table(self) -> np.ndarray | None:
        """The dense rows of every seen context (``lookup.dense_table``), built on first use; None
        past ``lookup.DENSE_CELLS``."""
        if self._dense is None:
            self._dense = (lookup.dense_table(self.tables),)
        return self._dense[0]

    def _terms_by_value(self) -> list:
        if self._by_value is None:
            self._by_value = lookup.terms_by_value(self.tables)
        return self._by_value

    # ---- the protocol -----------------------------------------------------------------------

    def _checked(self, seqs: Sequences) -> tuple[SequenceBatch, int]:
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        return batch, length_bucket(int(batch.lengths.max(initial=0)), self.max_len)

    def step_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W]``: each token's log-prob given its prefix (padding
        entries meaningless)."""
        batch, width = self._checked(seqs)
        if batch.size == 0:
            return batch, np.zeros((0, width), np.float32)
        return batch, lookup.step_logprobs(self.tables, batch, width, self._dense_table())

    def frontier_stats(
        self, seqs: Sequences, top_m: int
    ) -> tuple[SequenceBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The batch, steps float32[N, W], each position's top-m log-probs float32[N, W, m] and
        ids int32[N, W, m], and eos log-probs float32[N, W]: rows built at the real positions."""
        batch, steps = self.step_logprobs(seqs)
        vals, ids, eos_lps = lookup.position_top_m(
            self.tables, batch, steps.shape[1], top_m, self.eos, self._dense_table()
        )
        return batch, steps, vals, ids, eos_lps

    def position_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W, V]``: next-token log-probs before each position."""
        batch, width = self._checked(seqs)
        if batch.size == 0:
            return batch, np.zeros((0, width, self.vocab_size), np.float32)
        chain = lookup.position_chain(self.tables, batch, width)
        rows = lookup.row_logprobs(self.tables, chain.reshape(-1, self.order), self._dense_table())
        return batch, rows.reshape(batch.size, width, self.vocab_size)

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]`` log-prob rows after each prefix.

        Args:
          prefixes: int32[B, T], left-aligned prefixes.
          lengths: int32[B], each in ``[0, max_len - 1]``.
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        if batch.size == 0:
            return np.zeros((0, self.vocab_size), np.float32)
        return lookup.row_logprobs(self.tables, lookup.prefix_chain(self.tables, batch), self._dense_table())

    def next_logprobs_above(
        self, prefixes: ArrayLike, lengths: ArrayLike, thresholds: ArrayLike
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The cells of each :meth:`next_logprobs` row at or above a threshold, and a bound on the
        rest, without building the ``V``-wide rows (what a ``SeekIndex`` over a wide vocabulary
        keeps; see :mod:`jaxrescore.index.seek.rows`).

        Args:
          prefixes: int32[B, T], left-aligned prefixes.
          lengths: int32[B], each in ``[0, max_len - 1]``.
          thresholds: float32[B], one per row (``-inf`` keeps every finite cell).

        Returns:
          ``(ptr, tok, val, rest)``: row ``b``'s finite cells with log-prob ``>= thresholds[b]`` are
          ``tok[ptr[b]:ptr[b+1]]`` (int32, ascending) with log-probs ``val`` (float32, the values of
          :meth:`next_logprobs` bit for bit); ``rest: float32[B]`` bounds the log-prob of every
          finite cell left out (at least the largest of them, below the threshold; ``-inf`` when
          none is).
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        thr = np.asarray(thresholds)
        if thr.shape != (batch.size,) or not np.issubdtype(thr.dtype, np.floating) or np.isnan(thr).any():
            raise ValueError(
                f"thresholds must be {batch.size} float log-probs (one per prefix, no NaN); got shape "
                f"{thr.shape}, dtype {thr.dtype}"
            )
        chain = lookup.prefix_chain(self.tables, batch)
        return lookup.cells_above(self.tables, chain, thr.astype(np.float32), self._terms_by_value(), self._dense_table())
