"""A WIDER workload than the names demo: word-level sentences from a fixed probabilistic grammar,
a word-level transformer target trained on them, and two drafts: an n-gram fitted on the same
corpus and a smaller transformer distilled from the target.

The language (the *source*): toy English sentences over a vocabulary of 309 words,

    SUBJ [ADV] VERB OBJ PREP POSS PLACE TIME <eos>
    SUBJ = DET ADJ? NOUN (that VERB OBJ)?      OBJ = DET ADJ? NOUN

with agreements that reach further back than an n-gram sees: the main verb agrees in number with
the subject noun across an optional relative clause; ``POSS`` (its / their / his / her) agrees in
number, class and gender with the subject noun, 5-12 words back; the verb is drawn from the
subject's class (animals eat food and chase animals, people cook food, feed animals, meet people)
with a per-noun preference; the object noun from the verb's class with a per-verb preference; the
closing time word (today, again, ...) with a per-verb preference. Every list is Zipfian (the
first word commonest). All tables come from a fixed seed, so the language is the same everywhere.

Everything here is deterministic: the corpus is drawn with a fixed seed; the models are made as
``workload.py`` says (byte-identical weights on one machine: the benchmark checks that with
``python3 benchmarks/wide.py --check-determinism``), cached as ``wide_target.npz`` and
``wide_student.npz``.

    python3 benchmarks/wide.py --out DIR        # train (or load) and print held-out NLLs
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import workload  # noqa: E402
from workload import Setup  # noqa: E402

# ---- the lexicon --------------------------------------------------------------------------------

ANIMALS = [
    ("dog", "dogs"), ("cat", "cats"), ("horse", "horses"), ("cow", "cows"), ("bird", "birds"),
    ("fox", "foxes"), ("wolf", "wolves"), ("bear", "bears"), ("rabbit", "rabbits"), ("mouse", "mice"),
    ("goat", "goats"), ("lamb", "lambs"), ("duck", "ducks"), ("owl", "owls"), ("lion", "lions"),
    ("tiger", "tigers"), ("hen", "hens"), ("frog", "frogs"), ("snake", "snakes"), ("pig", "pigs"),
    ("puppy", "puppies"), ("kitten", "kittens"), ("crow", "crows"), ("badger", "badgers"),
]
# (singular, plural, gender of the singular: "his" or "her")
PEOPLE = [
    ("man", "men", "his"), ("woman", "women", "her"), ("boy", "boys", "his"), ("girl", "girls", "her"),
    ("king", "kings", "his"), ("queen", "queens", "her"), ("father", "fathers", "his"),
    ("mother", "mothers", "her"), ("brother", "brothers", "his"), ("sister", "sisters", "her"),
    ("uncle", "uncles", "his"), ("aunt", "aunts", "her"), ("prince", "princes", "his"),
    ("princess", "princesses", "her"), ("son", "sons", "his"), ("daughter", "daughters", "her"),
    ("husband", "husbands", "his"), ("wife", "wives", "her"), ("monk", "monks", "his"),
    ("nun", "nuns", "her"), ("grandfather", "grandfathers", "his"), ("grandmother", "grandmothers", "her"),
    ("lord", "lords", "his"), ("lady", "ladies", "her"),
]
FOODS = [
    ("apple", "apples"), ("bread", "breads"), ("cake", "cakes"), ("egg", "eggs"), ("bone", "bones"),
    ("nut", "nuts"), ("seed", "seeds"), ("carrot", "carrots"), ("cookie", "cookies"), ("pie", "pies"),
    ("plum", "plums"), ("grape", "grapes"), ("pear", "pears"), ("melon", "melons"), ("lemon", "lemons"),
    ("onion", "onions"), ("potato", "potatoes"), ("tomato", "tomatoes"), ("cherry", "cherries"),
    ("berry", "berries"), ("peach", "peaches"), ("bean", "beans"), ("turnip", "turnips"), ("fig", "figs"),
]
CLASSES = {"animal": ANIMALS, "person": PEOPLE, "food": FOODS}
PLACES = [
    "house", "garden", "park", "forest", "field", "barn", "kitchen", "river", "lake", "village",
    "city", "school", "market", "castle", "church", "meadow", "yard", "hill", "road", "cave",
]
# Transitive verbs by relation (subject class -> object class): (3rd singular, plural).
RELATIONS = {
    ("animal", "food"): [("eats", "eat"), ("chews", "chew"), ("finds", "find"), ("smells", "smell"),
                         ("hides", "hide"), ("steals", "steal"), ("wants", "want"), ("likes", "like")],
    ("animal", "animal"): [("chases", "chase"), ("bites", "bite"), ("follows", "follow"), ("watches", "watch"),
                           ("fears", "fear"), ("attacks", "attack"), ("ignores", "ignore"), ("licks", "lick")],
    ("person", "food"): [("buys", "buy"), ("cooks", "cook"), ("sells", "sell"), ("bakes", "bake"),
                         ("slices", "slice"), ("peels", "peel"), ("carries", "carry"), ("picks", "pick")],
    ("person", "animal"): [("feeds", "feed"), ("walks", "walk"), ("pets", "pet"), ("rides", "ride"),
                           ("brushes", "brush"), ("trains", "train"), ("hunts", "hunt"), ("catches", "catch")],
    ("person", "person"): [("meets", "meet"), ("helps", "help"), ("calls", "call"), ("visits", "visit"),
                           ("thanks", "thank"), ("loves", "love"), ("teaches", "teach"), ("greets", "greet")],
}
# P(relation | subject class), in RELATIONS order within each class.
RELATION_WEIGHTS = {"animal": [0.6, 0.4], "person": [0.4, 0.3, 0.3]}
ADJECTIVES = {
    "animal": ["brown", "wild", "hungry", "furry", "spotted", "sleepy", "fierce", "tame"],
    "person": ["tall", "kind", "brave", "clever", "rich", "poor", "wise", "angry"],
    "food": ["fresh", "ripe", "sweet", "sour", "green", "red", "warm", "stale"],
}
DET_SING = ["the", "a", "every", "this", "my", "one"]
DET_PLUR = ["the", "some", "many", "these", "two", "few"]
ADVERBS = ["often", "never", "always", "rarely", "sometimes", "quietly", "slowly", "gladly"]
PREPS = ["in", "near", "behind", "under", "beside", "inside", "outside", "around"]
TIMES = ["today", "again", "tonight", "yesterday", "daily", "now", "soon", "early"]
POSSESSIVES = ["its", "their", "his", "her"]
EOS_WORD = "<eos>"

P_SINGULAR = 0.6  # a noun phrase's number
P_ADJ = 0.3  # an adjective before a noun
P_RC = 0.25  # a relative clause after the subject
P_ADV = 0.2  # an adverb before the main verb
ZIPF = 1.5  # every list: p(i) proportional to 1 / (i + 1) ** ZIPF
PREFERENCE = 0.8  # scale of the fixed random log-preferences (noun->verb, verb->noun, ...)
LANGUAGE_SEED = 20240612

MAX_LEN = 20  # the models' support: sentences of up to 20 tokens, <eos> included (the grammar's longest is 18)
PROMPTS = ("the dog", "a tall woman", "the kings")
"""The benchmark's prompts (2-3 words): a singular animal, a singular person with an adjective,
plural people; their likeliest continuations are 8-9 words."""
HARD_PROMPT = "some cats that"
"""The expensive prompt: plural animals inside a relative clause, so every continuation is 11-15
words (the clause, then the main clause agreeing with "cats" across it); measured at k = 25 only."""


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** ZIPF
    return p / p.sum()


@dataclass(frozen=True)
class Language:
    """The source's vocabulary and probability tables (see the module docstring).

    Attributes:
      words: the vocabulary, ``words[i]`` is token ``i``; ``<eos>`` is the last (``eos``).
      ids: ``{word: token id}``.
      nouns: ``(class, index)`` of every subject noun (animals then people), the rows of
        ``verb_given_subject``.
      verbs: ``(relation, index)`` of every verb, the rows of the verb-conditioned tables.
      verb_given_subject: float64[n_subjects, n_verbs], p(verb | subject noun).
      object_given_verb: float64[n_verbs, 24], p(object noun | verb) within the verb's object class.
      time_given_verb: float64[n_verbs, len(TIMES)].
      place_given_prep: float64[len(PREPS), len(PLACES)].
    """

    words: tuple
    ids: dict
    nouns: tuple
    verbs: tuple
    verb_given_subject: np.ndarray
    object_given_verb: np.ndarray
    time_given_verb: np.ndarray
    place_given_prep: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    @property
    def eos(self) -> int:
        return len(self.words) - 1

    def encode(self, text: str, *, eos: bool = False) -> tuple[int, ...]:
        """Token ids of space-separated ``text`` (KeyError naming an unknown word)."""
        try:
            ids = tuple(self.ids[w] for w in text.split())
        except KeyError as err:
            raise KeyError(f"{err.args[0]!r} is not a word of the wide workload's vocabulary") from None
        return ids + ((self.eos,) if eos else ())

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)


@functools.lru_cache(maxsize=1)
def language() -> Language:
    """The fixed language (tables drawn from ``LANGUAGE_SEED``)."""
    words: list[str] = []
    for name, nouns in CLASSES.items():
        for entry in nouns:
            words += [entry[0], entry[1]]
    words += PLACES
    for verbs in RELATIONS.values():
        for sing, plur in verbs:
            words += [sing, plur]
    for adjs in ADJECTIVES.values():
        words += adjs
    words += list(dict.fromkeys(DET_SING + DET_PLUR)) + ADVERBS + PREPS + TIMES + POSSESSIVES + ["that", EOS_WORD]
    if len(set(words)) != len(words):
        raise AssertionError("the wide lexicon repeats a word")
    rng = np.random.default_rng(LANGUAGE_SEED)
    nouns = tuple(("animal", i) for i in range(len(ANIMALS))) + tuple(("person", i) for i in range(len(PEOPLE)))
    verbs = tuple((rel, i) for rel, vs in RELATIONS.items() for i in range(len(vs)))
    # p(verb | subject): relation weight x Zipf within the relation x a per-noun preference.
    vgs = np.zeros((len(nouns), len(verbs)))
    for r, (cls, _) in enumerate(nouns):
        rels = [rel for rel in RELATIONS if rel[0] == cls]
        for rel, w in zip(rels, RELATION_WEIGHTS[cls]):
            cols = [j for j, (vr, _) in enumerate(verbs) if vr == rel]
            p = _zipf(len(cols)) * np.exp(PREFERENCE * rng.standard_normal(len(cols)))
            vgs[r, cols] = w * p / p.sum()
    ogv = np.zeros((len(verbs), len(FOODS)))
    for j in range(len(verbs)):
        p = _zipf(len(FOODS)) * np.exp(PREFERENCE * rng.standard_normal(len(FOODS)))
        ogv[j] = p / p.sum()
    tgv = _zipf(len(TIMES))[None, :] * np.exp(PREFERENCE * rng.standard_normal((len(verbs), len(TIMES))))
    pgp = _zipf(len(PLACES))[None, :] * np.exp(PREFERENCE * rng.standard_normal((len(PREPS), len(PLACES))))
    return Language(
        words=tuple(words),
        ids={w: i for i, w in enumerate(words)},
        nouns=nouns,
        verbs=verbs,
        verb_given_subject=vgs,
        object_given_verb=ogv,
        time_given_verb=tgv / tgv.sum(axis=1, keepdims=True),
        place_given_prep=pgp / pgp.sum(axis=1, keepdims=True),
    )


# ---- sampling the corpus (vectorised: every sentence's choices drawn at once) -------------------


def _draw(rng, probs: np.ndarray, n: int | None = None) -> np.ndarray:
    """Inverse-CDF draws: from one distribution ``probs[K]`` (``n`` draws) or one per row of
    ``probs[N, K]``."""
    cdf = np.cumsum(probs, axis=-1)
    if probs.ndim == 1:
        return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), probs.size - 1)
    u = rng.random(probs.shape[0]) * cdf[:, -1]
    return np.minimum((cdf <= u[:, None]).sum(axis=1), probs.shape[1] - 1)


def subject_probs() -> np.ndarray:
    """float64[48]: p(subject noun) over animals then people (half each, Zipfian within)."""
    return np.concatenate([_zipf(len(ANIMALS)), _zipf(len(PEOPLE))]) / 2


def _noun_word(cls: str, idx: int, singular: bool) -> str:
    entry = CLASSES[cls][idx]
    return entry[0] if singular else entry[1]


def sample_corpus(n: int, seed: int) -> list[tuple[int, ...]]:
    """``n`` sentences drawn from the source with ``seed``, as token tuples ending in ``<eos>``."""
    lang = language()
    rng = np.random.default_rng(seed)
    ids = lang.ids

    def np_phrase(cls_of_rows, singular, count):
        """Tokens of DET ADJ? NOUN for rows whose noun class is ``cls_of_rows`` and noun index
        ``count``: a list of per-row token lists."""
        det_s, det_p = _draw(rng, _zipf(len(DET_SING)), n), _draw(rng, _zipf(len(DET_PLUR)), n)
        adj = _draw(rng, _zipf(len(ADJECTIVES["food"])), n)
        has_adj = rng.random(n) < P_ADJ
        out = []
        for i in range(n):
            toks = [ids[DET_SING[det_s[i]] if singular[i] else DET_PLUR[det_p[i]]]]
            if has_adj[i]:
                toks.append(ids[ADJECTIVES[cls_of_rows[i]][adj[i]]])
            toks.append(ids[_noun_word(cls_of_rows[i], count[i], singular[i])])
            out.append(toks)
        return out

    # Subject: class, noun, number.
    subj = _draw(rng, subject_probs(), n)
    subj_cls = [lang.nouns[s][0] for s in subj]
    subj_idx = [lang.nouns[s][1] for s in subj]
    subj_sing = rng.random(n) < P_SINGULAR
    subject = np_phrase(subj_cls, subj_sing, subj_idx)

    def verb_and_object():
        verb = _draw(rng, lang.verb_given_subject[subj], None)
        obj = _draw(rng, lang.object_given_verb[verb], None)
        obj_cls = [lang.verbs[v][0][1] for v in verb]
        obj_sing = rng.random(n) < P_SINGULAR
        return verb, np_phrase(obj_cls, obj_sing, obj)

    rc_verb, rc_obj = verb_and_object()
    has_rc = rng.random(n) < P_RC
    adv = _draw(rng, _zipf(len(ADVERBS)), n)
    has_adv = rng.random(n) < P_ADV
    verb, obj = verb_and_object()
    prep = _draw(rng, _zipf(len(PREPS)), n)
    place = _draw(rng, lang.place_given_prep[prep], None)
    when = _draw(rng, lang.time_given_verb[verb], None)

    def verb_word(v, singular):
        rel, i = lang.verbs[v]
        return ids[RELATIONS[rel][i][0 if singular else 1]]

    out = []
    for i in range(n):
        toks = list(subject[i])
        if has_rc[i]:
            toks += [ids["that"], verb_word(rc_verb[i], subj_sing[i])] + rc_obj[i]
        if has_adv[i]:
            toks.append(ids[ADVERBS[adv[i]]])
        toks.append(verb_word(verb[i], subj_sing[i]))
        toks += obj[i]
        toks += [ids[PREPS[prep[i]]], ids[possessive(subj_cls[i], subj_idx[i], subj_sing[i])], ids[PLACES[place[i]]]]
        toks += [ids[TIMES[when[i]]], lang.eos]
        out.append(tuple(toks))
    return out


def possessive(cls: str, idx: int, singular: bool) -> str:
    """The possessive agreeing with a subject noun: their / its / his / her."""
    if not singular:
        return "their"
    return PEOPLE[idx][2] if cls == "person" else "its"


# ---- the source's own log-prob (a parser: every sentence of the language has one derivation) ----


def source_logprob(seq) -> float:
    """The source's exact log-prob of a token sequence (``<eos>`` included); ``-inf`` for a
    sequence the grammar cannot produce. The derivation is unique: each word names its role."""
    lang = language()
    words = [lang.words[int(t)] for t in seq]
    pos = 0
    lp = 0.0

    def take():
        nonlocal pos
        if pos >= len(words):
            raise _NoParse
        pos += 1
        return words[pos - 1]

    def noun_phrase(classes):
        """DET ADJ? NOUN, the noun in one of ``classes``: ``(log-prob, class, index, singular)``
        (the noun's own probability is left to the caller)."""
        det = take()
        word = take()
        adj_lp = np.log(1 - P_ADJ)
        cls_adj = [c for c in classes if word in ADJECTIVES[c]]
        if cls_adj:
            adj_lp = np.log(P_ADJ) + np.log(_zipf(len(ADJECTIVES[cls_adj[0]]))[ADJECTIVES[cls_adj[0]].index(word)])
            classes = cls_adj
            word = take()
        for cls in classes:
            for i, entry in enumerate(CLASSES[cls]):
                for singular, form in ((True, entry[0]), (False, entry[1])):
                    if form == word:
                        dets = DET_SING if singular else DET_PLUR
                        if det not in dets:
                            raise _NoParse
                        num = np.log(P_SINGULAR if singular else 1 - P_SINGULAR)
                        return num + np.log(_zipf(len(dets))[dets.index(det)]) + adj_lp, cls, i, singular
        raise _NoParse

    def verb_object(subject_row, singular):
        word = take()
        for j, (rel, i) in enumerate(lang.verbs):
            if RELATIONS[rel][i][0 if singular else 1] == word:
                p_verb = lang.verb_given_subject[subject_row, j]
                if p_verb == 0:
                    raise _NoParse
                lp_np, cls, k, _ = noun_phrase([rel[1]])
                return j, np.log(p_verb) + lp_np + np.log(lang.object_given_verb[j, k])
        raise _NoParse

    try:
        lp_np, cls, idx, singular = noun_phrase(["animal", "person"])
        row = lang.nouns.index((cls, idx))
        lp += lp_np + np.log(subject_probs()[row])
        if pos < len(words) and words[pos] == "that":
            take()
            _, lp_vo = verb_object(row, singular)
            lp += np.log(P_RC) + lp_vo
        else:
            lp += np.log(1 - P_RC)
        if pos < len(words) and words[pos] in ADVERBS:
            lp += np.log(P_ADV) + np.log(_zipf(len(ADVERBS))[ADVERBS.index(take())])
        else:
            lp += np.log(1 - P_ADV)
        verb, lp_vo = verb_object(row, singular)
        lp += lp_vo
        prep, poss, place, when = take(), take(), take(), take()
        if prep not in PREPS or place not in PLACES or when not in TIMES or poss != possessive(cls, idx, singular):
            raise _NoParse
        p = PREPS.index(prep)
        lp += np.log(_zipf(len(PREPS))[p]) + np.log(lang.place_given_prep[p, PLACES.index(place)])
        lp += np.log(lang.time_given_verb[verb, TIMES.index(when)])
        if take() != EOS_WORD or pos != len(words):
            raise _NoParse
    except _NoParse:
        return -np.inf
    return float(lp)


class _NoParse(Exception):
    pass


# ---- models -------------------------------------------------------------------------------------

CORPUS_SEED = 1
HELDOUT_SEED = 2

# The n-gram order: held-out NLL per token of orders 2, 3, 4, 5 on this corpus is 2.340, 2.151,
# 2.156, 2.149 nats; 3 is the smallest order within 0.002 nats of the best (fewest table rows).
FULL = Setup("wide", "full", corpus_size=60_000, d_model=64, n_layers=2, n_heads=4, steps=1200, batch_size=128,
             lr=3e-3, draft_order=3, student_d_model=32, student_layers=1, student_heads=2, distill_steps=600,
             distill_lr=1e-2)
QUICK = Setup("wide", "quick", corpus_size=6_000, d_model=32, n_layers=1, n_heads=2, steps=400, batch_size=64,
              lr=1e-2, draft_order=3, student_d_model=32, student_layers=1, student_heads=2, distill_steps=150,
              distill_lr=1e-2)


@functools.lru_cache(maxsize=4)
def corpus(size: int, seed: int = CORPUS_SEED) -> tuple:
    """The deterministic training corpus: ``size`` sentences drawn with ``seed``."""
    return tuple(sample_corpus(size, seed))


def data(setup: Setup) -> workload.Data:
    """What ``setup``'s models are made from: the language's words and ``corpus(setup.corpus_size)``."""
    lang = language()
    return workload.Data(words=lang.words, eos=lang.eos, max_len=MAX_LEN, train=corpus(setup.corpus_size))


def load_or_train(setup: Setup, folder: str | None, *, progress: bool = False):
    """:func:`workload.load_or_train` on this workload: ``(target, student, seconds)``."""
    return workload.load_or_train(setup, data(setup), folder, progress=progress)


def fit_draft(setup: Setup):
    """The n-gram draft: interpolated Kneser-Ney over words, fitted on the same corpus."""
    return workload.fit_draft(setup, data(setup))


def heldout_nll(models: dict, n: int = 2000) -> dict:
    """Mean per-token NLL (nats, ``<eos>`` included) on ``n`` held-out sentences, per model
    (``"source"``: the grammar's own)."""
    held = sample_corpus(n, HELDOUT_SEED)
    tokens = sum(len(s) for s in held)
    return {"source": -sum(source_logprob(s) for s in held) / tokens, **workload.nll_per_token(models, held)}


def main(argv=None) -> int:
    return workload.main(argv, __doc__.splitlines()[0], {"full": FULL, "quick": QUICK}, data, heldout_nll)


if __name__ == "__main__":
    sys.exit(main())
