"""Prompt conditioning: a model whose support is the continuations of a fixed prompt.

``model.with_prompt(prompt)`` returns a :class:`PromptedModel`. Its sequences are continuations
``c`` and its scores are the conditional log-probs ``log p(c | prompt)``: every call prepends the
prompt and calls the base model ONCE, excluding the prompt's own steps from scores with the base's
``skip`` argument. A draft index built over a prompted model therefore enumerates completions.

Over a base that decodes incrementally (:mod:`jaxrescore.models.decoding`), ``next_logprobs``
reuses the prompt's key/value cache, computed once per prompted model: a row costs its own
positions, not the prompt's. Teacher forcing (``score_sequences``, ``score_frontier``) stays one
full forward of ``prompt + c``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from jax.sharding import Mesh

from jaxrescore.models.base import AutoregressiveEnumerable, check_int
from jaxrescore.models.decoding import proof_session
from jaxrescore.models.scores import FrontierScores
from jaxrescore.models.text import check_tokenizer, encode_prompt
from jaxrescore.sequences import SequenceBatch, as_sequence_batch
from jaxrescore.typing import ArrayLike, Sequences, Tokens


def check_prompt(base, prompt) -> tuple[int, ...]:
    """Validate ``prompt`` for ``base`` and return it as a tuple of ints.

    A prompt (possibly empty: then the prompted model scores like the base) must hold token ids
    in ``[0, vocab_size)`` and leave room for at least one more token. It may contain ``eos``: a
    prompt is context, not a sequence of the support (a chat prompt ends the user's turn with the
    same ``<|im_end|>`` that ends the answer), and the support is the continuations after it.
    """
    if isinstance(prompt, (str, bytes)):
        raise TypeError(f"prompt must be a sequence of integer token ids, got {type(prompt).__name__}")
    try:
        arr = np.asarray(prompt)
    except (OverflowError, ValueError) as err:
        raise ValueError(f"prompt must be a sequence of integer token ids: {err}") from None
    if arr.ndim > 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(
            f"prompt must be a flat sequence of integer token ids, got dtype {arr.dtype} shape "
            f"{arr.shape}; floats and bools are not cast"
        )
    toks = tuple(int(t) for t in arr.reshape(-1))
    # An inferred vocabulary (a CallableModel without vocab_size) grows with the tables it sees:
    # before its first call any non-negative id may still be one of its tokens.
    limit = None if getattr(base, "vocab_inferred", False) else int(base.vocab_size)
    bad = [t for t in toks if t < 0 or limit is not None and t >= limit]
    if bad:
        raise ValueError(f"prompt tokens must lie in [0, {limit if limit is not None else 'inf'}), got {bad}")
    if len(toks) >= base.max_len:
        raise ValueError(
            f"prompt of length {len(toks)} leaves no room under max_len={base.max_len}"
        )
    return toks


def prepend(prompt: tuple[int, ...], tokens: np.ndarray, lengths: np.ndarray):
    """``prompt + row`` for every row: ``(int32[B, P + T], int32[B])``."""
    p = len(prompt)
    out = np.empty((tokens.shape[0], p + tokens.shape[1]), np.int32)
    out[:, :p] = np.asarray(prompt, np.int32)
    out[:, p:] = tokens
    return out, np.asarray(lengths, np.int32) + p


class PromptableMixin:
    """Gives a model ``with_prompt`` and ``with_tokenizer``; the model must accept
    ``score_sequences(seqs, skip=...)``."""

    tokenizer = None  # set by with_tokenizer: text in and out (see jaxrescore.models.text)
    # Token strings (token id i reads as vocabulary[i]) when the model carries them (set by
    # load_model from the file, or by the user; see jaxrescore.models.vocabulary).
    vocabulary: tuple[str, ...] | None = None

    def with_prompt(self, tokens: Tokens | str, *, max_new_tokens: int | None = None) -> PromptedModel:
        """The model of continuations of ``tokens`` (see :class:`PromptedModel`): token ids, or
        text when the model has a vocabulary or a tokenizer; ``max_new_tokens``: continuations
        of at most that many tokens, ``eos`` included (as ``generate`` counts them)."""
        return PromptedModel(self, encode_prompt(self, tokens), max_new_tokens=max_new_tokens)

    def with_tokenizer(self, tokenizer: Any) -> Any:
        """A copy of the model that reads and writes text with ``tokenizer`` (any object with
        ``encode(text) -> ids`` and ``decode(ids) -> text``, e.g. a ``tokenizers.Tokenizer``):
        ``with_prompt("...")`` takes text and results over it carry ``texts``."""
        other = copy.copy(self)
        other.tokenizer = check_tokenizer(tokenizer)
        return other


class PromptedModel(PromptableMixin):
    """The continuations of ``prompt`` under ``base``, scored as ``log p(c | prompt)``.

    Attributes:
      base: the unconditioned model (must support ``score_sequences(seqs, skip=...)``).
      prompt: the conditioning tokens, a tuple of ints.
      vocab_size, eos: those of ``base`` (read from it: an inferred vocabulary keeps growing).
      max_len: ``base.max_len - len(prompt)``, or ``max_new_tokens`` when smaller: the longest
        continuation (EOS included). A terminating model's support is then the continuations
        that end with ``eos`` within it, scored as the base scores them (not renormalised).
    """

    def __init__(self, base: AutoregressiveEnumerable, prompt: Tokens, *, max_new_tokens: int | None = None):
        self.base = base
        self.prompt = check_prompt(base, prompt)
        self.eos = base.eos
        self.max_len = int(base.max_len) - len(self.prompt)
        if max_new_tokens is not None:
            self.max_len = min(self.max_len, check_int(max_new_tokens, "max_new_tokens", minimum=1))

    def __repr__(self) -> str:
        return f"PromptedModel(base={self.base!r}, prompt={self.prompt})"

    @property
    def vocab_size(self) -> int:
        return int(self.base.vocab_size)

    @property
    def vocab_inferred(self) -> bool:
        """Whether the base infers its vocabulary from the tables it has seen (it then grows)."""
        return bool(getattr(self.base, "vocab_inferred", False))

    def with_prompt(self, tokens: Tokens | str, *, max_new_tokens: int | None = None) -> PromptedModel:
        """Extend the prompt: conditioning on ``self.prompt + tokens`` (ids, or text), within
        this model's own length cap (and ``max_new_tokens`` when given)."""
        more = check_prompt(self, encode_prompt(self, tokens))
        cap = self.max_len - len(more)
        if max_new_tokens is not None:
            cap = min(cap, check_int(max_new_tokens, "max_new_tokens", minimum=1))
        longer = PromptedModel(self.base, self.prompt + more, max_new_tokens=cap)
        longer.tokenizer = self.tokenizer
        return longer

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]``: ``log p(. | prompt + prefix)``, one call of the base model.

        Args:
          prefixes: int32[B, T] continuation prefixes (left-aligned).
          lengths: int32[B].
        """
        # A base that decodes incrementally starts every row from the prompt's cache, computed
        # once per with_prompt: the cost of a row does not grow with the prompt.
        # A proof's fetched rows come from here: a 16-bit model's stay full forwards.
        session = proof_session(self, max_bytes=0)
        if session is not None:
            return session.next_logprobs(prefixes, lengths)
        prefixes = np.asarray(prefixes, np.int32)
        if prefixes.ndim != 2:
            raise ValueError(f"prefixes must be int32[B, T], got shape {prefixes.shape}")
        toks, lens = prepend(self.prompt, prefixes, np.asarray(lengths, np.int32).reshape(-1))
        return self.base.next_logprobs(toks, lens)

    @property
    def mesh(self) -> Mesh | None:
        """The base model's mesh (None when it has none)."""
        return getattr(self.base, "mesh", None)

    def with_mesh(self, mesh: Mesh | None, *, shard_params: bool = False) -> PromptedModel:
        """The same prompt over ``base.with_mesh(mesh, shard_params=...)`` (see
        :meth:`jaxrescore.models.JaxLM.with_mesh`); the prompt's cache is recomputed on the mesh."""
        with_mesh = getattr(self.base, "with_mesh", None)
        if with_mesh is None:
            raise TypeError(f"{type(self.base).__name__} has no with_mesh")
        return PromptedModel(with_mesh(mesh, shard_params=shard_params), self.prompt)

    @property
    def vocabulary(self):
        """The base model's token strings (None when it carries none)."""
        return getattr(self.base, "vocabulary", None)

    @property
    def score_tolerance(self):
        """The base model's (see :mod:`jaxrescore.models.scores`); None when it declares none."""
        return getattr(self.base, "score_tolerance", None)

    def _on_base(self, seqs, skip):
        """``prompt + c`` rows for the base and the skip that leaves the prompt's steps out."""
        batch = as_sequence_batch(seqs)
        n = batch.size
        extra = np.zeros(n, np.int64) if skip is None else np.asarray(skip, np.int64).reshape(-1)
        if extra.shape != (n,):
            raise ValueError(f"skip must have shape ({n},), got {np.shape(skip)}")
        toks, lens = prepend(self.prompt, batch.tokens, batch.lengths)
        # Rows of length 0 (padding rows) stay empty instead of scoring the prompt's steps.
        lens = np.where(batch.lengths > 0, lens, 0).astype(np.int32)
        return SequenceBatch(toks, lens), (extra + len(self.prompt)).astype(np.int32)

    def score_sequences(self, seqs: Sequences, *, skip: ArrayLike | None = None) -> np.ndarray:
        """``float64[N]``: ``log p(c | prompt)`` of continuations ``c``, one base call.

        Args:
          seqs: a SequenceBatch or a list of token sequences (continuations only).
          skip: optional int32[N]; further leading continuation steps to exclude.
        """
        batch, skip = self._on_base(seqs, skip)
        return self.base.score_sequences(batch, skip=skip)

    @property
    def packs_prompt(self) -> bool:
        """Whether :meth:`score_frontier` computes the prompt once per call (a base with
        ``score_frontier_after``, see :mod:`jaxrescore.models.packed`) rather than
        in every row."""
        return bool(getattr(self.base, "packs_prompt", False))

    def full_positions(self, rows: list) -> int:
        """Token positions a :meth:`score_frontier` of the continuations ``rows`` computes."""
        if self.packs_prompt:
            return int(self.base.packed_positions(len(self.prompt), rows))
        return sum(len(self.prompt) + len(r) for r in rows)

    def score_frontier(self, seqs: Sequences, *, top_m: int, skip: ArrayLike | None = None) -> FrontierScores:
        """The base's ``score_frontier`` of ``prompt + c`` with the prompt's steps skipped:
        scores ``log p(c | prompt)`` and positions counted from the first continuation step.
        A base that packs rows after one prompt (:attr:`packs_prompt`) computes it once."""
        if skip is None and self.packs_prompt:
            return self.base.score_frontier_after(self.prompt, seqs, top_m=top_m)
        batch, skip = self._on_base(seqs, skip)
        return self.base.score_frontier(batch, top_m=top_m, skip=skip)
