"""``jaxrescore enumerate``: the proven top-k of a user's own saved target, found through their
own draft (a saved model, or an n-gram fitted on a corpus file), plus the gap-certified query when
a gap is given."""

from __future__ import annotations

import os
import time
from typing import Callable

from jaxrescore._checks import check_float, check_int
from jaxrescore.data.corpus import read_corpus
from jaxrescore.demo.args import DemoArgumentError, check_flag, check_query, load_model_file, worded
from jaxrescore.demo.defaults import DEFAULT_CORPUS_ORDER, DEFAULT_K
from jaxrescore.demo.runs import certified_top_k, draft_index, finite_or_none, proven_top_k, same_answer
from jaxrescore.models import NGramLM
from jaxrescore.models.vocabulary import decode_tokens, encode_text


def _fit_corpus_draft(path: str | os.PathLike, target, order: int) -> NGramLM:
    """An n-gram draft of ``order`` fitted on the corpus file ``path`` (read by
    :func:`~jaxrescore.data.corpus.read_corpus`), in the target's support and vocabulary; the
    weights are normalised to mean 1, as ``names_draft`` does."""
    seqs, weights = worded(read_corpus, path, target)
    try:
        draft = NGramLM.fit(
            seqs, order=order, vocab_size=target.vocab_size, eos=target.eos, max_len=target.max_len,
            weights=weights * (len(weights) / weights.sum()),
        )
    except ValueError as err:
        raise DemoArgumentError(f"corpus {str(path)!r}: {err}") from None
    draft.vocabulary = getattr(target, "vocabulary", None)
    return draft


def _vocabulary(target, draft):
    """The token strings to print with: the target's, else the draft's (None: print ids)."""
    tv, dv = getattr(target, "vocabulary", None), getattr(draft, "vocabulary", None)
    if tv is not None and dv is not None and tv != dv:
        raise DemoArgumentError("target and draft carry different vocabularies; they must agree token by token")
    return tv if tv is not None else dv


def _prompt_tokens(prompt, prompt_text, vocabulary, eos) -> tuple[int, ...]:
    """The prompt's token ids, given as ids or as text read with ``vocabulary``."""
    if prompt_text is None:
        return tuple(prompt)
    if prompt:
        raise DemoArgumentError("give the prompt as token ids or as text, not both")
    if vocabulary is None:
        raise DemoArgumentError("prompt text needs models that carry a vocabulary; give token ids instead")
    try:
        return encode_text(prompt_text, vocabulary, None if eos is None else eos)[: None if eos is None else -1]
    except ValueError as err:
        raise DemoArgumentError(f"prompt text: {err}") from None


def run_enumerate(
    *,
    target_path: str | os.PathLike,
    draft_path: str | os.PathLike | None = None,
    draft_corpus: str | os.PathLike | None = None,
    draft_order: int = DEFAULT_CORPUS_ORDER,
    k: int = DEFAULT_K,
    window: int | None = None,
    gap: float | None = None,
    prompt: tuple[int, ...] = (),
    prompt_text: str | None = None,
    bits: float | None = None,
    progress: bool = True,
    on_stage: Callable[[str], None] | None = None,
    on_answer: Callable[[dict], None] | None = None,
) -> dict:
    """The proven top-``k`` of a user's own saved target, found through their own draft, plus the
    gap-certified query when ``gap`` is given.

    Args:
      target_path: the target's model file (any :func:`~jaxrescore.models.save_model` file).
      draft_path: the draft's model file; or
      draft_corpus, draft_order: a text corpus (see :func:`~jaxrescore.data.corpus.read_corpus`) to fit an n-gram draft
        of that order on. Exactly one of ``draft_path`` and ``draft_corpus``.
      k, window: as in :func:`~jaxrescore.demo.names.run_demo`.
      gap: assumed max ``target - draft``; None = no gap-certified query (the proof needs none).
      prompt: token ids to condition both models on; or ``prompt_text``, read with the models'
        vocabulary.
      bits: optional depth budget of the draft index to build up front.
      progress, on_stage, on_answer: as in :func:`~jaxrescore.demo.names.run_demo`.

    Returns:
      A JSON-ready dict: ``items`` (``tokens``: the continuation's ids, ``text``: prompt and
      continuation decoded with the models' vocabulary, or the ids when they carry none,
      ``target_log_prob``, ``draft_log_prob``), the proof keys of :func:`~jaxrescore.demo.names.run_demo`,
      ``gap_certified`` (or None), ``draft_forwards``, ``vocabulary`` (whether text was
      decoded; fewer than ``k`` items only when ``k`` exceeds the target's support, which is
      never returned past), ``seconds`` and the arguments.
    """
    k, window, gap = check_query(k, window, gap)
    draft_order = worded(check_int, draft_order, "draft_order", minimum=1)
    bits = worded(check_float, bits, "bits", minimum=0.0, allow_none=True)
    progress = check_flag(progress, "progress")
    if (draft_path is None) == (draft_corpus is None):
        raise DemoArgumentError("give exactly one draft: a saved model (--draft) or a corpus (--draft-corpus)")
    stage = on_stage or (lambda text: None)
    start = time.perf_counter()
    stage("loading the models")
    target = load_model_file(target_path)
    if draft_corpus is not None:
        stage(f"fitting a {draft_order}-gram draft on {draft_corpus}")
        draft = _fit_corpus_draft(draft_corpus, target, draft_order)
    else:
        draft = load_model_file(draft_path)
    if (target.vocab_size, target.eos) != (draft.vocab_size, draft.eos):
        raise DemoArgumentError(
            f"target (vocab_size={target.vocab_size}, eos={target.eos}) and draft "
            f"(vocab_size={draft.vocab_size}, eos={draft.eos}) must share vocab_size and eos"
        )
    vocabulary = _vocabulary(target, draft)
    prompt = _prompt_tokens(prompt, prompt_text, vocabulary, target.eos)
    if prompt:
        try:
            target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
        except ValueError as err:
            raise DemoArgumentError(f"prompt: {err}") from None
    stage(f"building the draft index and proving the top {k}")
    index = draft_index(draft, progress)
    if bits is not None:
        index.ensure_bits(bits)
    proof = proven_top_k(index, target, k, window)
    result = proof.pop("result")

    def text(seq):
        full = tuple(prompt) + tuple(seq)
        return decode_tokens(full, vocabulary, target.eos) if vocabulary else " ".join(map(str, full))

    out = {
        "items": [
            {"tokens": list(seq), "text": text(seq), "target_log_prob": lp,
             "draft_log_prob": finite_or_none(dlp)}
            for (seq, lp), dlp in zip(result.items, result.draft_log_probs)
        ],
        **proof,
        "vocabulary": vocabulary is not None,
        "k": k,
        "prompt": list(prompt),
    }
    if on_answer is not None:
        on_answer(dict(out))
    certified = None
    if gap is not None:
        stage("running the gap-certified query")
        certified = certified_top_k(index, target, k, window, gap)
        other = certified.pop("result")
        certified.update(
            gap_source="given with --gap",
            same_answer=same_answer([s for s, _ in other.items], [s for s, _ in result.items]),
        )
    out.update(gap_certified=certified, draft_forwards=int(index.forwards), seconds=time.perf_counter() - start)
    return out
