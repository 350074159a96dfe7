"""Text in and out (vocabularies, tokenizers, string-token functions), ``jaxrescore.top_k`` over
one prompt or many, and results that print like a tool."""

import json
import math

import numpy as np
import pytest

import jaxrescore as jr
from brute import TableModel, as_model
from jaxrescore import CallableModel, RescoredIndex, SeekIndex
from jaxrescore.models.text import codec_of

WORDS = ["<eos>", "the", "dog", "cat", "ran", "sat"]


def word_models():
    """A word-level eos target and draft over WORDS (a tiny random table each)."""
    target = as_model(TableModel(len(WORDS), 4, 3, eos=0, temperature=1.5))
    draft = as_model(TableModel(len(WORDS), 4, 4, eos=0, temperature=1.5))
    target.vocabulary = tuple(WORDS)
    return target, draft


def test_vocabulary_text_round_trip_and_texts_after_the_prompt():
    target, draft = word_models()
    codec = codec_of(target)
    assert codec.encode("the dog") == (1, 2) and codec.decode((1, 2, 0)) == "the dog"
    with pytest.raises(ValueError, match="'cow'"):
        codec.encode("the cow")
    r = RescoredIndex(SeekIndex(draft.with_prompt((1,))), target.with_prompt("the")).top_k(4, prove=True)
    assert r.proven is True and len(r.texts) == 4
    assert r.texts == [codec.decode((1,) + seq) for seq, _ in r.items]
    assert all(t.startswith("the") and "<eos>" not in t for t in r.texts)


def test_a_models_vocabulary_is_checked_once_and_a_bad_one_every_time(monkeypatch):
    """A query's texts need its target's codec: a model's vocabulary (a tuple of strings) is
    checked once, then its codec reused; a vocabulary that is not is checked (and refused) at each
    use."""
    from jaxrescore.models import text, vocabulary

    checks = []
    check = vocabulary.check_vocabulary
    monkeypatch.setattr(text, "check_vocabulary", lambda *a: checks.append(a) or check(*a))
    words = tuple(w + "_once" for w in WORDS)  # a tuple no other test has made a codec of
    first = text.vocabulary_codec(words, len(words), 0)
    assert text.vocabulary_codec(tuple(words), len(words), 0) is first and len(checks) == 1
    assert first.decode((1, 2, 0)) == "the_once dog_once"
    for bad in ((["a"], ["b"]), ("a", "a"), ("a",)):
        for _ in range(2):
            with pytest.raises(ValueError, match="vocabulary"):
                text.vocabulary_codec(bad, 2, None)
    assert len(checks) == 7


def test_a_tokenizers_tokenizer_reads_and_writes_the_text():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)} | {"[UNK]": 6}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    target, draft = word_models()
    target.vocabulary = None
    assert codec_of(target) is None
    t = target.with_tokenizer(tok)
    assert codec_of(target) is None and codec_of(t) is not None  # a copy carries it
    r = jr.top_k(t, draft, 3, prompt="the dog")
    assert r.proven is True and r.texts == [tok.decode([1, 2] + list(seq[:-1])) for seq, _ in r.items]
    with pytest.raises(TypeError, match="encode"):
        target.with_tokenizer(object())


def test_text_prompt_without_a_codec_is_a_clear_error():
    target, draft = word_models()
    target.vocabulary = None
    with pytest.raises(ValueError, match="vocabulary or a tokenizer"):
        target.with_prompt("the dog")
    with pytest.raises(ValueError, match="vocabulary or a tokenizer"):
        jr.top_k(target, draft, 2, prompt="the")


def test_top_k_over_a_list_of_prompts_equals_one_query_each():
    target, draft = word_models()
    prompts = ["the", "the dog", [3], ()]
    many = jr.top_k(target, draft, 3, prompt=prompts, rerank_window=8)
    one = [jr.top_k(target, draft, 3, prompt=p, rerank_window=8) for p in prompts]
    assert [r.items for r in many] == [r.items for r in one]
    assert [r.texts for r in many] == [r.texts for r in one]
    assert all(r.proven is True for r in many)
    plain = RescoredIndex(SeekIndex(draft), target, rerank_window=8).top_k(3, prove=True)
    assert jr.top_k(target, draft, 3, rerank_window=8).items == plain.items


def test_top_k_refuses_what_it_cannot_do():
    target, draft = word_models()
    index = SeekIndex(draft)
    assert jr.top_k(target, index, 2).proven is True
    with pytest.raises(ValueError, match="draft MODEL"):
        jr.top_k(target, index, 2, prompt="the")
    with pytest.raises(TypeError, match="draft must be"):
        jr.top_k(target, 3, 2)
    with pytest.raises(TypeError, match="not a mix"):
        jr.top_k(target, draft, 2, prompt=["the", 1])


def test_results_print_short_lines_a_table_html_and_json():
    target, draft = word_models()
    r = jr.top_k(target, draft, 25, prompt="the")
    line = repr(r)
    assert len(line) < 160 and "proven=True" in line and "\n" not in line
    table = str(r)
    assert table.splitlines()[0].startswith("25 items; proven=True") and "the" in table
    assert len(table.splitlines()) == 1 + 1 + 20 + 1  # verdicts, header, 20 rows, "... 5 more"
    assert "<table>" in r._repr_html_()
    back = json.loads(r.to_json())
    assert back["texts"] == r.texts and back["proven"] is True
    assert [tuple(s) for s, _ in back["items"]] == [s for s, _ in r.items]
    everything = RescoredIndex(SeekIndex(draft), target).top_k(10_000, prove=True)
    assert json.loads(everything.to_json())["frontier_bound"] == "-inf"


def test_printed_tables_number_ranks_from_one_and_the_fields_from_zero():
    """Issue 36 item 7: ``print(result)`` numbered ranks from 0 while the demo and the command
    start at 1. Every printed table (text and HTML) counts both ranks from 1; ``draft_ranks``
    and the JSON keep the index's 0-based ranks."""
    target, draft = word_models()
    r = RescoredIndex(SeekIndex(draft), target, rerank_window=8).top_k(3)
    assert all(rank is not None for rank in r.draft_ranks)
    rows = str(r).splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["1", "2", "3"]
    assert [row.split()[3] for row in rows] == [str(rank + 1) for rank in r.draft_ranks]
    html = r._repr_html_()
    assert "<tr><td>1</td>" in html and "<tr><td>0</td>" not in html
    assert json.loads(r.to_json())["draft_ranks"] == list(r.draft_ranks)
    assert len(repr(RescoredIndex(SeekIndex(draft), target))) < 200


@pytest.mark.parametrize("given", ["tokens", "inferred"])
def test_a_function_that_speaks_strings_is_wrapped_unchanged(given):
    """The reference library's form: tables of (string, log_prob), ``eos="$"``."""
    tables = {(): {"a": 0.5, "b": 0.3, "$": 0.2}, ("a",): {"a": 0.1, "b": 0.7, "$": 0.2}}

    def fn(prefix):
        assert all(isinstance(t, str) for t in prefix)
        return [(t, math.log(p)) for t, p in tables.get(prefix[-1:], tables[()]).items()]

    kwargs = {"tokens": ["$", "a", "b"]} if given == "tokens" else {}
    target = CallableModel(fn, eos="$", max_len=3, **kwargs)
    draft = CallableModel(fn, eos="$", max_len=3, **kwargs)
    r = RescoredIndex(SeekIndex(draft), target).top_k(3, prove=True)
    assert r.proven is True and r.texts == ["", "a", "ab"]  # 0.2, 0.5 * 0.2, 0.5 * 0.7 * 0.2
    assert target.vocabulary == ("$", "a", "b") and target.eos == 0
    assert math.isclose(r.items[2][1], math.log(0.5 * 0.7 * 0.2), rel_tol=1e-6)


def test_string_token_errors_name_the_token():
    with pytest.raises(ValueError, match="eos='#' is not one of the tokens"):
        CallableModel(lambda p: [], tokens=["$", "a"], eos="#", max_len=3)
    with pytest.raises(ValueError, match="per-prefix"):
        CallableModel(lambda p, n: None, tokens=["$", "a"], eos="$", max_len=3, batched=True, vocab_size=2)
    m = CallableModel(lambda p: [("z", 0.0)], tokens=["$", "a"], eos="$", max_len=3)
    with pytest.raises(ValueError, match="'z', which is not in tokens"):
        m.next_logprobs(np.zeros((1, 1), np.int32), np.zeros(1, np.int32))
    ints = CallableModel(lambda p: [("a", 0.0)], max_len=3)
    with pytest.raises(ValueError, match="tokens="):
        ints.next_logprobs(np.zeros((1, 1), np.int32), np.zeros(1, np.int32))
    inferred = CallableModel(lambda p: [("a", -0.7), ("b", -0.7), ("", -5.0)], eos="$", max_len=3)
    with pytest.raises(ValueError, match="non-empty"):
        inferred.next_logprobs(np.zeros((1, 1), np.int32), np.zeros(1, np.int32))
    assert inferred.vocabulary == ("$",) and inferred.vocab_size == 1  # the failed call left it as it was


def test_readme_one_call_snippet_runs_and_proves():
    import contextlib
    import io
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "jaxrescore.top_k(" in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "True ['mary', 'matthew', 'margaret']" and lines[1].startswith("True ['jo")


def test_indexes_print_short_lines():
    _, draft = word_models()
    for index in (jr.AREnvelopeIndex(draft), SeekIndex(draft)):
        line = repr(index)
        assert len(line) < 200 and "\n" not in line and type(index).__name__ in line


def test_the_shipped_names_target_stores_its_vocabulary():
    from jaxrescore.data.names_models import names_vocabulary, shipped_target_path
    from jaxrescore.models.checkpoint import load_model

    assert load_model(shipped_target_path()).vocabulary == names_vocabulary()


def test_load_model_refuses_a_text_file_in_words(tmp_path):
    from jaxrescore.models.checkpoint import ModelFileError, load_model

    path = tmp_path / "corpus.txt"
    path.write_text("the dog ran\n")
    with pytest.raises(ModelFileError, match="does not start like one") as err:
        load_model(path)
    assert "pickle" not in str(err.value)
