"""CallableModel: a plain Python function as an AutoregressiveEnumerable.

Two forms of ``fn`` are accepted:

* per-prefix (the reference library's form): ``fn(prefix: tuple[int, ...])`` returns the next-token
  table either as a ``(tokens, log_probs)`` pair of numpy arrays or as a list of ``(token, log_prob)``
  pairs. Tokens left out have log-prob ``-inf``. ``vocab_size`` may be omitted: it is then inferred
  as one plus the largest token id (or ``eos``) any table has returned so far, so it only grows, and
  a row returned early may be narrower than a later one (a consumer reads the width off each row).
* batched (``batched=True``): ``fn(prefixes: int32[B, T], lengths: int32[B]) -> float[B, V]``, row
  ``b`` the log-softmax after ``prefixes[b, :lengths[b]]``; ``vocab_size`` is required.

A per-prefix ``fn`` may speak token STRINGS, as the reference library's functions often do
(``eos="$"``): pass ``tokens=[...]`` (token id ``i`` is ``tokens[i]``), or just a string ``eos``
(the vocabulary is then inferred: ``eos`` is id 0 and every other string gets the next id when a
table first returns it). ``fn`` then receives each prefix as a tuple of strings and returns
strings; the model itself works in ids (``model.vocabulary[i]`` is token ``i``'s string, and
results over it carry ``texts``).

Every table is checked before use: a NaN, a log-prob above ``SIGN_TOL`` (float noise above 0 is
tolerated and clipped to 0 in every row this model returns), a duplicate or out-of-range token, a wrong shape, or a table whose
``logsumexp`` is more than ``NORM_TOL`` from 0 (not a distribution) raises ``ValueError`` naming the
prefix and what is wrong. The batched check is a few vectorised passes over the ``[B, V]`` block,
cheap next to any forward that produced it. Rows may be any float dtype, bfloat16 included (a JAX
function's 16-bit output); they are returned as float32, and once a 16-bit table has been seen the
model's ``score_tolerance`` is 0.1 nats (see :mod:`jaxrescore.models.scores`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from jax.sharding import Mesh

from jaxrescore._checks import check_bool, check_int
from jaxrescore.models.checks import is_float_dtype
from jaxrescore.models.mesh import batch_devices, mesh_context, shard_batch, to_host, with_recorded_mesh
from jaxrescore.models.scores import (
    BFLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    TABLE_TOLERANCE,
    FrontierScores,
    assemble,
    check_top_m,
    host_top_m,
    skip_mask,
)
from jaxrescore.models.prompt import PromptableMixin
from jaxrescore.models.vocabulary import check_vocabulary, is_token_string
from jaxrescore.sequences import as_sequence_batch, bucket_size, checked_batch
from jaxrescore.typing import ArrayLike, Sequences, Tokens

# log-probs up to this far above 0 are float noise of a log_softmax, not a broken model.
SIGN_TOL = 1e-5
# |logsumexp| allowed for one step table: loose enough for a bfloat16 log_softmax over a large vocab,
# tight enough to reject a truncated or unnormalised table.
NORM_TOL = 2e-2
# Rows per call of a batched fn when scoring sequences (padded to a power of two).
SCORE_CHUNK = 4096


class CallableModel(PromptableMixin):
    """An autoregressive model given by a next-token function (see the module docstring).

    Args:
      fn: the next-token function, per-prefix or batched.
      vocab_size: V; required when ``batched``, inferred (and growing) otherwise when omitted.
      max_len: the longest sequence in the support, EOS included (fixed-length models: the length).
      eos: end-of-sequence token id (a token string when ``fn`` speaks strings); when set the
        model terminates and only EOS-ended sequences of at most ``max_len`` tokens are in the
        support.
      batched: whether ``fn`` takes padded batches (see the module docstring).
      tokens: the token strings a per-prefix ``fn`` speaks (see the module docstring), or None.
    """

    mesh = None  # set by with_mesh: a batched fn then gets its rows split over the mesh

    def __init__(
        self,
        fn: Callable,
        *,
        vocab_size: int | None = None,
        max_len: int,
        eos: int | str | None = None,
        batched: bool = False,
        tokens: Sequence[str] | None = None,
    ):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        check_bool(batched, "batched")
        self.max_len = check_int(max_len, "max_len", minimum=1)
        self._names, eos, vocab_size = _token_names(tokens, eos, vocab_size, batched)
        if self._names is not None:
            self.vocabulary = tuple(self._names)
        self.eos = check_int(eos, "eos", minimum=0, allow_none=True)
        vocab = check_int(vocab_size, "vocab_size", minimum=1, allow_none=True)
        if batched and vocab is None:
            raise ValueError("vocab_size is required when batched=True (the [B, V] rows need a width)")
        if vocab is not None and self.eos is not None and self.eos >= vocab:
            raise ValueError(f"eos={self.eos} is not a token id below vocab_size={vocab}")
        self.fn = fn
        self.batched = bool(batched)
        self.vocab_inferred = vocab is None
        self._vocab = vocab if vocab is not None else (0 if self.eos is None else self.eos + 1)

    def with_mesh(self, mesh: Mesh | None, *, shard_params: bool = False) -> "CallableModel":
        """A copy whose batched ``fn`` receives its ``prefixes``/``lengths`` as JAX arrays with the
        batch axis split over ``mesh`` (rows padded to a multiple of its devices), called inside
        ``jax.set_mesh`` of the mesh's ``Auto`` version; so a jitted JAX ``fn`` runs data-parallel.
        A per-prefix ``fn`` runs on the host as before. ``shard_params`` is accepted for a uniform
        interface; a function has no weights the library could split. ``None``: no mesh."""
        return with_recorded_mesh(self, mesh, shard_params)

    @property
    def vocab_size(self) -> int:
        """V. With an inferred vocabulary: 1 + the largest token id seen so far (grows)."""
        return self._vocab

    # -- next-token tables -------------------------------------------------------------------------

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """Next-token log-probs ``float32[B, V]`` after each prefix, ``-inf`` for absent tokens,
        clipped to ``<= 0`` (the float noise a table may carry up to ``SIGN_TOL`` above 0 is
        dropped here, so every path — index, scores, proofs — sees the same steps).

        Args:
          prefixes: int32[B, T]; row ``b`` holds a prefix in its first ``lengths[b]`` positions.
          lengths: int32[B], each in ``[0, T]``.
        """
        prefixes, lengths = checked_batch(prefixes, lengths, what="prefixes")
        vocab, names = self._vocab, None if self._names is None else len(self._names)
        try:
            if self.batched:
                rows = self._batched_rows(prefixes, lengths)
            else:
                rows = self._per_prefix_rows(prefixes, lengths)
        except BaseException:
            # An inferred vocabulary may have grown on tables before the bad one: a failed call
            # leaves the model as it was.
            self._vocab = vocab
            if names is not None:
                del self._names[names:]
                self.vocabulary = tuple(self._names)
            raise
        return np.minimum(rows, np.float32(0.0))

    def _batched_rows(self, prefixes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        rows = to_host(self._call_batched(prefixes, lengths))
        want = (prefixes.shape[0], self._vocab)
        if rows.shape != want:
            raise ValueError(f"batched fn returned shape {rows.shape}, expected [B, V] = {want}")
        if not is_float_dtype(rows.dtype):
            raise ValueError(f"batched fn returned dtype {rows.dtype}, expected floating log-probs")
        self._note_precision(rows.dtype)
        rows = rows.astype(np.float32, copy=False)
        _check_rows(rows, lambda b: tuple(prefixes[b, : lengths[b]].tolist()))
        return rows

    def _call_batched(self, prefixes: np.ndarray, lengths: np.ndarray):
        if self.mesh is None:
            return self.fn(prefixes, lengths)
        b = prefixes.shape[0]
        d = batch_devices(self.mesh)
        rows = -(-max(b, 1) // d) * d
        p = np.zeros((rows,) + prefixes.shape[1:], np.int32)
        p[:b] = prefixes
        n = np.zeros(rows, np.int32)
        n[:b] = lengths
        with mesh_context(self.mesh):
            out = self.fn(shard_batch(p, self.mesh), shard_batch(n, self.mesh))
        return to_host(out)[:b]

    def _per_prefix_rows(self, prefixes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        keys = [tuple(prefixes[b, : lengths[b]].tolist()) for b in range(prefixes.shape[0])]
        tables = {}
        for key in keys:  # padding rows and shared prefixes call fn once
            if key not in tables:
                spoken = key if self._names is None else tuple(self._names[t] for t in key)
                tables[key] = self._parse_table(self.fn(spoken), key)
        width = self._vocab
        rows = np.full((len(keys), width), -np.inf, np.float32)
        for b, key in enumerate(keys):
            toks, lps = tables[key]
            rows[b, toks] = lps
        return rows

    def _parse_table(self, raw, prefix: tuple) -> tuple[np.ndarray, np.ndarray]:
        """One per-prefix table as ``(tokens int64[K], log_probs float32[K])``, validated."""
        if isinstance(raw, tuple) and len(raw) == 2 and isinstance(raw[0], np.ndarray):
            toks, lps = np.asarray(raw[0]), np.asarray(raw[1])
            if toks.ndim != 1 or toks.shape != lps.shape:
                raise ValueError(
                    f"fn{prefix!r} returned (tokens, log_probs) of shapes {toks.shape} and "
                    f"{lps.shape}; expected two 1-D arrays of equal length"
                )
        else:
            try:
                pairs = [(t, lp) for t, lp in raw]
            except (TypeError, ValueError):
                raise TypeError(
                    f"fn{prefix!r} returned {type(raw).__name__}; expected a (tokens, log_probs) pair "
                    "of numpy arrays or a list of (token, log_prob) pairs"
                ) from None
            toks = np.array([t for t, _ in pairs])
            lps = np.array([lp for _, lp in pairs], dtype=np.float64)
        if self._names is not None:
            toks = self._ids_of(toks, prefix)
        elif toks.size and toks.dtype.kind in "USO":
            raise ValueError(
                f"fn{prefix!r} returned token strings {toks[:3].tolist()}; pass tokens=[...] (or a "
                "string eos) so the model knows they are strings"
            )
        if toks.size and not np.issubdtype(toks.dtype, np.integer):
            raise ValueError(f"fn{prefix!r} returned non-integer tokens {toks[:5].tolist()}")
        toks = toks.astype(np.int64)
        if toks.size and toks.min() < 0:
            raise ValueError(f"fn{prefix!r} returned negative token ids {toks[toks < 0][:5].tolist()}")
        if not self.vocab_inferred and toks.size and toks.max() >= self._vocab:
            bad = toks[toks >= self._vocab][:5].tolist()
            raise ValueError(f"fn{prefix!r} returned token ids {bad} outside [0, {self._vocab})")
        if np.unique(toks).size != toks.size:
            uniq, counts = np.unique(toks, return_counts=True)
            raise ValueError(f"fn{prefix!r} returned duplicate tokens {uniq[counts > 1][:5].tolist()}")
        if not is_float_dtype(lps.dtype) and lps.size:
            raise ValueError(f"fn{prefix!r} returned log-probs of dtype {lps.dtype}, expected floats")
        self._note_precision(lps.dtype)
        lps = lps.astype(np.float32)
        row = np.full((1, toks.size), -np.inf, np.float32)
        row[0] = lps
        _check_rows(row, lambda b: prefix)
        if toks.size:
            self._vocab = max(self._vocab, int(toks.max()) + 1)
        return toks, lps

    def _ids_of(self, names: np.ndarray, prefix: tuple) -> np.ndarray:
        """The ids of the token strings a table returned; a new string gets the next id when the
        vocabulary is inferred, and is a ValueError naming it otherwise."""
        index = {n: i for i, n in enumerate(self._names)}
        out = np.empty(names.size, np.int64)
        for j, name in enumerate(names.tolist()):
            if name not in index:
                if not self.vocab_inferred:
                    raise ValueError(f"fn{prefix!r} returned token {name!r}, which is not in tokens")
                _check_name(name)
                index[name] = len(self._names)
                self._names.append(name)
            out[j] = index[name]
        self.vocabulary = tuple(self._names)
        return out

    # -- whole sequences ---------------------------------------------------------------------------

    def in_support(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """bool[N]: the structural support rule (length, EOS placement) for padded sequences."""
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths)
        if self.eos is None:
            return lengths == self.max_len
        pos = np.arange(tokens.shape[1])[None, :]
        is_eos = (tokens == self.eos) & (pos < lengths[:, None])
        last = np.where(lengths > 0, tokens[np.arange(len(lengths)), np.maximum(lengths - 1, 0)], -1)
        return (lengths >= 1) & (lengths <= self.max_len) & (last == self.eos) & (is_eos.sum(1) == 1)

    def score_sequences(self, seqs: Sequences, *, skip: ArrayLike | None = None) -> np.ndarray:
        """Log-probs ``float64[N]``: the float64 sum of the model's per-step log-probs (EOS step
        included); ``-inf`` for a sequence outside the support.

        Args:
          seqs: a SequenceBatch, an int[N, T] array or a list of token sequences.
          skip: optional int[N]: the first ``skip[i]`` steps of row ``i`` are left out of its sum
            (a conditioning prompt; see ``with_prompt``).
        """
        batch = as_sequence_batch(seqs)
        ok = self.in_support(*batch)
        out = np.full(batch.size, -np.inf)
        out[ok] = 0.0
        for s, p, rows in self._step_rows(batch, ok[:, None] & skip_mask(batch, skip, batch.tokens.shape[1])):
            np.add.at(out, s, _pick(rows, batch.tokens[s, p]))
        return out

    def score_frontier(self, seqs: Sequences, *, top_m: int, skip: ArrayLike | None = None) -> FrontierScores:
        """:meth:`score_sequences` plus each position's top-``top_m`` next-token log-probs and eos
        log-prob, from the same next-token tables (see
        :class:`~jaxrescore.models.scores.FrontierScores`). Every real position of every row is
        evaluated, in the support or not; scores of rows outside the support are ``-inf``.

        Args:
          seqs: a SequenceBatch, an int[N, T] array or a list of token sequences.
          top_m: how many of the likeliest next tokens to keep per position.
          skip: optional int[N], as in :meth:`score_sequences`.
        """
        top_m = check_top_m(top_m)
        batch = as_sequence_batch(seqs)
        n, w = batch.tokens.shape
        steps = np.zeros((n, w), np.float64)
        top_lps = np.full((n, w, top_m), -np.inf, np.float32)
        top_ids = np.zeros((n, w, top_m), np.int32)
        eos_lps = np.full((n, w), -np.inf, np.float32)
        for s, p, rows in self._step_rows(batch, batch.mask):
            steps[s, p] = _pick(rows, batch.tokens[s, p])
            top_lps[s, p], top_ids[s, p] = host_top_m(rows, top_m)
            if self.eos is not None and self.eos < rows.shape[1]:
                eos_lps[s, p] = rows[:, self.eos]
        out = assemble(batch, skip, steps, top_lps, top_ids, None if self.eos is None else eos_lps)
        scores = np.where(self.in_support(*batch), out.scores, -np.inf)
        return out._replace(scores=scores)

    # Set once a table arrives in a 16-bit float (bfloat16 rows from a JAX function).
    low_precision = False

    def _note_precision(self, dtype) -> None:
        if np.dtype(dtype).itemsize < 4:
            self.low_precision = True

    @property
    def score_tolerance(self) -> float:
        """Nats a score may move between calls: a per-prefix function returns the same table for
        a prefix every time; a batched one may depend on the batch (like any JAX forward); once
        a 16-bit float table (e.g. bfloat16 rows) has been seen, 0.1 (see
        :mod:`jaxrescore.models.scores`)."""
        if self.low_precision:
            return BFLOAT16_TOLERANCE
        return FLOAT32_TOLERANCE if self.batched else TABLE_TOLERANCE

    def _step_rows(self, batch, which: np.ndarray):
        """Yield ``(seq_idx, pos, rows)`` chunks over the steps where ``which: bool[N, T]``:
        ``rows[r]`` is the next-token row before token ``pos[r]`` of sequence ``seq_idx[r]``."""
        toks, _ = batch
        seq_idx, pos = np.nonzero(which)
        for lo in range(0, seq_idx.size, SCORE_CHUNK):
            s, p = seq_idx[lo : lo + SCORE_CHUNK], pos[lo : lo + SCORE_CHUNK]
            yield s, p, self._score_rows(toks[s], p)

    def _score_rows(self, prefixes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Rows for ``prefixes[b, :lengths[b]]``; batched calls are padded to power-of-two shapes."""
        if not self.batched:
            return self.next_logprobs(prefixes, lengths)
        b = prefixes.shape[0]
        t = max(int(lengths.max(initial=0)), 1)
        rows_b, len_t = bucket_size(b), bucket_size(t)
        padded = np.zeros((rows_b, len_t), np.int32)
        padded[:b, :t] = prefixes[:, :t]
        plen = np.zeros(rows_b, np.int32)
        plen[:b] = lengths
        return self.next_logprobs(padded, plen)[:b]

    def log_density(self, seq: Tokens) -> float:
        """The log-prob of one token sequence (``-inf`` outside the support)."""
        return float(self.score_sequences([tuple(seq)])[0])


def _token_names(tokens, eos, vocab_size, batched: bool):
    """``(names or None, eos id, vocab_size)`` for ``tokens=`` / a string ``eos`` (see the
    module docstring); the arguments unchanged when ``fn`` speaks ids."""
    if tokens is None and not isinstance(eos, str):
        return None, eos, vocab_size
    if batched:
        raise ValueError("tokens= and a string eos are for a per-prefix fn; a batched fn speaks token ids")
    if tokens is None:
        _check_name(eos)
        return [eos], 0, vocab_size
    try:
        names = list(check_vocabulary(tokens, len(tokens)))
    except TypeError:
        raise ValueError(f"tokens must be a sequence of token strings, got {type(tokens).__name__}") from None
    except ValueError as err:  # the vocabulary's rule, named after this argument
        raise ValueError(f"tokens: {err}") from None
    if vocab_size is not None and vocab_size != len(names):
        raise ValueError(f"vocab_size={vocab_size!r} disagrees with the {len(names)} tokens given")
    if isinstance(eos, str):
        if eos not in names:
            raise ValueError(f"eos={eos!r} is not one of the tokens")
        eos = names.index(eos)
    return names, eos, len(names)


def _check_name(name) -> None:
    if not is_token_string(name):
        raise ValueError(f"a token string must be a non-empty str without tabs or line breaks, got {name!r}")


def _pick(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``rows[r, tokens[r]]`` as float64, ``-inf`` where a token lies beyond a (narrow) row."""
    out = np.full(tokens.size, -np.inf)
    inside = tokens < rows.shape[1]
    out[inside] = rows[np.nonzero(inside)[0], tokens[inside]]
    return out


def _check_rows(rows: np.ndarray, prefix_of: Callable[[int], tuple]) -> None:
    """Raise ValueError unless every row of ``rows: float32[B, V]`` is a log-distribution.

    Three whole-block passes (max, exp, a row-sum matvec): once no entry exceeds ``SIGN_TOL``,
    ``exp`` cannot overflow, and a row whose entries all underflow cannot sum to ~1 anyway."""
    if rows.shape[0] == 0:
        return
    top = rows.max() if rows.shape[1] else np.float32(-np.inf)
    if np.isnan(top):
        b = int(np.argmax(np.isnan(rows).any(axis=1)))
        raise ValueError(f"next-token log-probs after prefix {prefix_of(b)} contain NaN")
    if top > SIGN_TOL:
        b = int(np.argmax((rows > SIGN_TOL).any(axis=1)))
        raise ValueError(
            f"next-token log-prob {float(rows[b].max())!r} > 0 after prefix {prefix_of(b)}; "
            "log-probs must be <= 0"
        )
    with np.errstate(divide="ignore", under="ignore"):
        mass = np.exp(rows) @ np.ones(rows.shape[1], np.float32)
        lse = np.log(mass)
    off = ~(np.abs(lse) <= NORM_TOL)
    if off.any():
        b = int(np.argmax(off))
        if not np.isfinite(rows[b]).any():
            raise ValueError(
                f"next-token table after prefix {prefix_of(b)} gives every token log-prob -inf; "
                "expected a distribution"
            )
        raise ValueError(
            f"next-token table after prefix {prefix_of(b)} is not a distribution: logsumexp = "
            f"{float(lse[b]):.6g} (probabilities sum to {float(mass[b]):.6g}), expected 0 within "
            f"{NORM_TOL}"
        )
