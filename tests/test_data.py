"""The shipped names corpus and its character codec."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrescore.data import ALPHABET, EOS, MAX_NAME_LEN, VOCAB_SIZE, decode, encode, load_names, name_ranks


def test_names_are_clean_sorted_and_real():
    names = load_names()
    assert len(names) > 40_000
    assert len({n for n, _ in names}) == len(names)
    assert all(n and set(n) <= set(ALPHABET) for n, _ in names)
    assert max(len(n) for n, _ in names) == MAX_NAME_LEN
    counts = [c for _, c in names]
    assert counts == sorted(counts, reverse=True)
    assert min(counts) >= 50
    top = {n for n, _ in names[:10]}
    assert {"james", "john", "mary"} <= top


def test_min_count_filters_and_validates():
    assert all(c >= 10_000 for _, c in load_names(10_000))
    assert len(load_names(10_000)) < len(load_names())
    with pytest.raises(ValueError, match="min_count"):  # the one integer rule (jaxrescore._checks)
        load_names("5")
    assert load_names(10_000.0) == load_names(10_000)


def test_load_names_returns_a_fresh_list():
    a = load_names()
    a.clear()
    assert load_names()


def test_name_ranks():
    ranks = name_ranks()
    names = load_names()
    assert ranks[names[0][0]] == 1
    assert ranks[names[-1][0]] == len(names)


def test_codec_constants_and_examples():
    assert (EOS, VOCAB_SIZE) == (26, 27)
    assert encode("abz") == (0, 1, 25, EOS)
    assert encode("abz", eos=False) == (0, 1, 25)
    assert decode((0, 1, 25, EOS)) == "abz"
    assert decode(()) == ""


@given(st.text(alphabet=ALPHABET, max_size=20))
def test_codec_round_trip(name):
    assert decode(encode(name)) == name
    assert decode(encode(name, eos=False)) == name


@pytest.mark.parametrize("bad", ["Mary", "jo-ann", "é", " "])
def test_encode_rejects_non_lowercase(bad):
    with pytest.raises(ValueError, match="outside lowercase a-z"):
        encode(bad)


@pytest.mark.parametrize("bad", [(EOS, 0), (27,), (-1,)])
def test_decode_rejects_bad_tokens(bad):
    with pytest.raises(ValueError, match="not character ids"):
        decode(bad)


def test_read_corpus_names_the_path_and_line(tmp_path):
    from jaxrescore.data.corpus import read_corpus
    from jaxrescore.data.names_models import names_target

    target = names_target()
    good = tmp_path / "names.tsv"
    good.write_text("mary\t3\n\njohn\n")
    seqs, weights = read_corpus(good, target)
    assert seqs == [encode("mary"), encode("john")] and weights.tolist() == [3.0, 1.0]
    for text, fragment in (("Mary\n", "names.tsv:1"), ("mary\t-1\n", "count '-1'"), ("mary\t0\n", "no sequence")):
        good.write_text(text)
        with pytest.raises(ValueError, match=fragment):
            read_corpus(good, target)
    with pytest.raises(FileNotFoundError, match="no corpus file"):
        read_corpus(tmp_path / "missing.txt", target)
