"""The ``jaxrescore`` command: demo (table and --json), prefix prompts, bad arguments, enumerate
with saved models, train."""

import json
import os
import subprocess
import sys
from pathlib import Path

import re

import numpy as np
import pytest

from jaxrescore.cli import main
from jaxrescore.data import load_names


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def demo_json():
    """One default demo run (k=25, estimated gap, escalating window), shared by the tests."""
    from jaxrescore.demo.names import run_demo

    return run_demo(progress=False)


def test_demo_default_is_proven_and_equals_exact_search(demo_json):
    out = demo_json
    assert len(out["items"]) == 25
    assert out["proven"] is True, out["proof_reason"]
    lps = [item["target_log_prob"] for item in out["items"]]
    assert lps == sorted(lps, reverse=True)
    assert lps[-1] >= out["frontier_bound"]
    # The bar: proven in at most 8 target calls and fewer sequences than an exact
    # best-first search over the target needs prefix forwards, with the same answer.
    exact = out["exact_best_first"]
    assert exact["same_answer"] is True
    assert out["target_calls"] <= 8 and out["target_sequences"] < exact["forwards"]
    assert out["true_top_k_overlap"] >= 15
    assert [set(i) for i in out["items"]] == [{"text", "target_log_prob", "draft_log_prob", "birth_rank"}] * 25


def test_demo_gap_certified_run(demo_json):
    cert = demo_json["gap_certified"]
    assert cert["certified"] is True, cert["reason"]
    assert cert["same_answer"] is True
    worst = demo_json["items"][-1]["target_log_prob"]
    assert worst >= cert["bound"] + cert["assumed_gap"]
    # The gap estimate must cover the answers it certifies.
    assert worst >= cert["gap_region_lp"] and cert["gap_covers_answers"] is True
    assert cert["gap_calibration_sequences"] > 0 and cert["target_calls"] >= 1


@pytest.mark.slow
def test_demo_json_via_console_module(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.run(
        # --gap: the console module and its JSON are under test here, not the gap estimate (the
        # shared demo run above estimates one)
        [sys.executable, "-m", "jaxrescore", "demo", "--json", "--k", "5", "--window", "256", "--gap", "2.5"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("items", "proven", "frontier_bound", "proof_reason", "rounds", "target_calls",
                "target_sequences", "exact_best_first", "gap_certified"):
        assert key in out
    # the call that scored the window decides the proof: a packed full forward, whose numbers
    # need no check (it also holds the keys and values a search would extend)
    assert out["window"] == 256 and out["target_calls"] == 1 and out["proven"] is True
    assert out["gap_certified"]["window"] == 256
    assert os.listdir(tmp_path / "jaxrescore" / "jax"), "the compilation cache was not enabled"


def test_demo_table(capsys):
    assert main(["demo", "--k", "3", "--window", "64", "--gap", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "birth rank" in text and "proven exact" in text and "given with --gap" in text
    assert "exact best-first search" in text and "certified" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_demo_refuses_to_certify_a_refuted_gap(capsys):
    out = run_json(capsys, "demo", "--json", "--k", "25", "--window", "64", "--gap", "0")
    cert = out["gap_certified"]
    assert cert["excess"] > 0 and cert["certified"] is False and "refuted" in cert["reason"]
    assert out["proven"] is True


def test_demo_prefix(capsys):
    out = run_json(capsys, "demo", "--json", "--k", "5", "--prefix", "ma")
    texts = [i["text"] for i in out["items"]]
    assert len(texts) == 5 and all(t.startswith("ma") for t in texts)
    assert out["proven"] is True and out["exact_best_first"]["same_answer"] is True
    commonest = [n for n, _ in load_names() if n.startswith("ma")][:5]
    assert set(texts) & set(commonest)
    # Log-probs are conditional on the prefix, so higher than the unconditional ones.
    assert out["items"][0]["target_log_prob"] > -4


def test_demo_regex_is_proven_among_the_matching_names(capsys):
    out = run_json(capsys, "demo", "--json", "--k", "5", "--regex", "ma[a-z]*a")
    texts = [i["text"] for i in out["items"]]
    assert len(texts) == 5 and all(re.fullmatch("ma[a-z]*a", t) for t in texts)
    assert out["proven"] is True and out["exact_best_first"]["same_answer"] is True
    assert out["regex"] == "ma[a-z]*a" and out["gap_certified"] is None
    assert main(["demo", "--k", "3", "--regex", "ma[a-z]*a"]) == 0
    assert "matching 'ma[a-z]*a'" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["demo", "--regex", "(ma"], "argument --regex: pattern '(ma' is not a regex"),
        (["demo", "--k", "0"], "argument --k: expected an integer from 1 to 1000"),
        (["demo", "--k", "1000000000"], "argument --k: expected an integer from 1 to 1000"),
        (["enumerate", "--target", "x", "--draft", "y", "--k", "1001"], "argument --k: expected an integer from 1 to 1000"),
        (["demo", "--window", "-3"], "integer >= 0"),
        (["demo", "--gap", "-1"], "finite number >= 0"),
        (["demo", "--gap", "nan"], "finite number >= 0"),
        (["demo", "--prefix", "Ma"], "lowercase letters"),
        (["demo", "--prefix", "abcdefghijklmno"], "at most 14 letters"),
        (["demo", "--bogus"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
        (["enumerate", "--target", "/nonexistent.npz", "--draft", "/nonexistent.npz"], "no model file"),
        (["enumerate", "--target", "x", "--draft", "y", "--prompt", "1,a"], "comma-separated"),
        (["train", "--steps", "0"], "integer >= 3"),
        (["train", "--steps", "2"], "integer >= 3"),
        (["train", "--seed", "-1"], "integer >= 0"),
        (["enumerate", "--target", "x", "--draft", "y", "--bits", "-1"], "bits must be"),
        (["enumerate", "--target", "x"], "one of the arguments --draft --draft-corpus is required"),
        (["enumerate", "--target", "x", "--draft", "y", "--draft-corpus", "z"], "not allowed with"),
        (["enumerate", "--target", "x", "--draft", "y", "--draft-order", "0"], "draft_order must be an integer >= 1"),
        (["enumerate", "--target", "x", "--draft", "y", "--prompt", "1", "--prompt-text", "a"], "not allowed"),
        (["train", "--out", "/"], "is a folder"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_a_file_that_is_not_a_model_exits_2_with_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a model")
    assert main(["demo", "--target", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a jaxrescore model file" in err, err


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from jaxrescore.models.checkpoint import save_model
    from jaxrescore.models.transformer import TransformerConfig, TransformerLM

    folder = tmp_path_factory.mktemp("models")
    cfg = TransformerConfig(vocab_size=4, d_model=8, n_layers=1, n_heads=2, max_len=4, eos=3)
    paths = []
    for name, seed in (("target", 0), ("draft", 1)):
        path = folder / f"{name}.npz"
        save_model(TransformerLM(cfg, seed=seed), path)
        paths.append(str(path))
    return paths


def test_enumerate_own_models_matches_brute_force(capsys, tiny_models):
    from itertools import product

    from jaxrescore.models.checkpoint import load_model

    target_path, draft_path = tiny_models
    out = run_json(
        capsys, "enumerate", "--target", target_path, "--draft", draft_path,
        "--k", "4", "--window", "64", "--gap", "50", "--json",
    )
    support = [s + (3,) for n in range(4) for s in product(range(3), repeat=n)]
    scores = load_model(target_path).score_sequences(support)
    best = [support[i] for i in np.argsort(-scores, kind="stable")[:4]]
    assert [tuple(i["tokens"]) for i in out["items"]] == best
    # All 40 support sequences fit in the pull: the frontier is empty and the proof exact.
    assert out["proven"] is True and out["frontier_bound"] is None
    # Prefixes the draft cut at max_len are outside the target's support too (same max_len), so
    # the pull is exhaustive whatever the gap.
    cert = out["gap_certified"]
    assert cert["certified"] is True and cert["bound"] is None and "exhausted" in cert["reason"]


def test_enumerate_prompt_and_table(capsys, tiny_models):
    target_path, draft_path = tiny_models
    assert main(["enumerate", "--target", target_path, "--draft", draft_path, "--k", "2", "--prompt", "1"]) == 0
    text = capsys.readouterr().out
    assert "proven exact (no assumption): True" in text and "gap-certified" not in text


@pytest.mark.parametrize("k, prefix", [pytest.param(100, "", marks=pytest.mark.slow), (25, "ma")])
def test_proven_names_meet_the_bar(k, prefix):
    """At most 8 target calls, fewer target sequences than best-first needs prefix forwards, and
    the same answer as exact best-first search over the target."""
    from jaxrescore.demo.names import run_demo

    out = run_demo(k=k, prefix=prefix, progress=False, certify=False)
    assert out["proven"] is True, out["proof_reason"]
    exact = out["exact_best_first"]
    assert exact["same_answer"] is True
    assert out["target_calls"] <= 8 and out["target_sequences"] < exact["forwards"]


# ---- issue 14 (CLI) and issue 10 item 12 --------------------------------------------------------


def test_version_and_no_command(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxrescore {metadata.version('jaxrescore')}"
    assert main([]) == 2  # documented: no command lists the commands, exit status 2
    out = capsys.readouterr().out
    assert all(f"    {c}" in out for c in ("demo", "enumerate", "train")) and "nats" in out


LAZY_HELP = """
import sys, types
# The package as a lazy __init__ would leave it: only the path, nothing imported yet.
pkg = types.ModuleType("jaxrescore"); pkg.__path__ = [{path!r}]; sys.modules["jaxrescore"] = pkg
from jaxrescore.cli import main
for argv in (["--help"], ["demo", "--help"], ["enumerate", "--help"], ["train", "--help"], []):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(m for m in ("jax", "jaxlib", "flax", "optax", "numpy") if m in sys.modules)
print("HEAVY", heavy)
"""


def test_the_parser_imports_nothing_heavy():
    """cli.py builds its parser and answers --help without jax, flax, optax or even numpy."""
    import jaxrescore

    code = LAZY_HELP.format(path=os.path.dirname(jaxrescore.__file__))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout[-300:]


def test_help_does_not_import_jax():
    """The real entry point. Needs jaxrescore/__init__.py to import its submodules lazily; until
    it does, importing the package alone pulls in jax and this test is skipped (the test above
    covers cli.py itself)."""
    probe = "import sys, jaxrescore; print('jax' in sys.modules)"
    eager = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if eager.stdout.strip() == "True":
        pytest.skip("jaxrescore/__init__.py imports jax eagerly (see the lazy-import request)")
    code = "import runpy, sys; sys.argv = ['jaxrescore', '--help']\ntry:\n    runpy.run_module('jaxrescore', run_name='__main__')\nexcept SystemExit:\n    pass\nprint('JAX', 'jax' in sys.modules, 'flax' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "JAX False False" in proc.stdout, proc.stdout[-300:] + proc.stderr[-300:]


def test_the_parser_defaults_are_the_demo_defaults():
    from jaxrescore.cli import build_parser
    from jaxrescore.demo import defaults

    parser = build_parser()
    train = parser.parse_args(["train"])
    assert (train.steps, train.seed) == (defaults.TRAIN_STEPS, defaults.TRAIN_SEED)
    own = parser.parse_args(["enumerate", "--target", "t", "--draft-corpus", "c"])
    assert (own.k, own.draft_order) == (defaults.DEFAULT_K, defaults.DEFAULT_CORPUS_ORDER)
    assert defaults.TRAIN_MIN_STEPS == len(defaults.TRAIN_PHASES)


def help_text(*argv) -> str:
    from jaxrescore.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return (sub.choices[argv[0]] if argv else parser).format_help()


def test_train_help_documents_steps_and_seed_with_their_minimums():
    text = " ".join(help_text("train").split())
    assert "--steps N optimisation steps in all, at least 3" in text and "default 7000" in text
    assert "--seed N initialisation and batch-sampling seed, an integer >= 0" in text
    assert "progress bar" in text


def test_no_message_cites_a_file_of_the_source_repository():
    """An installed package has no scripts/ folder: its help must not send anyone there."""
    for argv in ((), ("demo",), ("enumerate",), ("train",)):
        assert "scripts/" not in help_text(*argv), argv


def test_help_says_where_the_compile_cache_lives_and_how_to_turn_it_off(monkeypatch):
    from jaxrescore import cli

    text = " ".join(help_text().split())
    assert "~/.cache/jaxrescore/jax" in text and "JAXRESCORE_COMPILE_CACHE=0 turns the cache off" in text
    monkeypatch.setenv("JAXRESCORE_COMPILE_CACHE", "0")
    assert cli.enable_compilation_cache() is None
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "~/.cache/jaxrescore" in readme and "JAXRESCORE_COMPILE_CACHE=0" in readme


def test_a_text_file_given_as_a_model_is_named_as_such(capsys, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("mary\njohn\n")
    for argv in (["enumerate", "--target", str(names), "--draft", str(names)], ["demo", "--target", str(names)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is a text file" in err and "not a jaxrescore model file" in err, err
        assert "pickle" not in err, err
    binary = tmp_path / "noise.npz"
    binary.write_bytes(bytes(range(256)) * 4)
    assert main(["demo", "--target", str(binary)]) == 2
    err = capsys.readouterr().err
    assert "not an .npz archive" in err and "pickle" not in err, err


def test_train_out_in_a_missing_folder_is_refused_and_creates_nothing(capsys, tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    assert main(["train", "--steps", "3", "--out", str(missing / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and str(missing) in err, err
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_training_shows_one_bar_over_every_phase(tmp_path, capsys):
    """One tqdm bar with a total (so an ETA) over the three learning-rate phases, the running
    loss on it; no per-phase bars."""
    from jaxrescore.demo.train import train_demo_target
    from jaxrescore.models import training

    original = training.tqdm
    path = train_demo_target(tmp_path / "t.npz", steps=6, progress=True)
    assert path.exists() and training.tqdm is original
    err = capsys.readouterr().err
    assert err.count("training the demo target") >= 1 and "train_lm" not in err, err
    assert "6/6" in err and "/6" in err.split("\r")[1] and "loss=" in err, err


def test_demo_streams_the_answer_before_the_comparisons():
    from jaxrescore.demo.names import run_demo
    from jaxrescore.demo.report import format_demo_answer

    events = []
    out = run_demo(
        k=3, window=64, gap=1.0, progress=False,
        on_stage=lambda text: events.append(("stage", text)),
        on_answer=lambda partial: events.append(("answer", partial)),
    )
    kinds = [e[0] if e[0] == "answer" else e[1].split()[0] for e in events]
    assert kinds == ["loading", "building", "answer", "exact", "running"], kinds
    partial = events[2][1]
    assert partial["items"] == out["items"] and "exact_best_first" not in partial
    table = format_demo_answer(partial)
    assert "john" in table and "nats" in table and max(map(len, table.splitlines())) <= 100


def test_status_line_only_when_enabled(capsys):
    from jaxrescore.cli import Status

    quiet = Status(False)
    quiet("working")
    quiet.clear()
    assert capsys.readouterr().err == ""
    loud = Status(True)
    loud("building the index")
    loud.clear()
    err = capsys.readouterr().err
    assert "building the index" in err and err.endswith("\r\033[K")


def test_json_keeps_assumed_and_observed_gap_apart_and_ranks_in_items(capsys):
    out = run_json(capsys, "demo", "--json", "--k", "3", "--window", "64", "--gap", "0.5")
    cert = out["gap_certified"]
    assert cert["assumed_gap"] == 0.5 and cert["gap"] != cert["assumed_gap"] and "excess" in cert
    assert all("birth_rank" in item for item in out["items"])


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    names = folder / "names.tsv"
    names.write_text("".join(f"{n}\t{c}\n" for n, c in load_names()[:3000]))
    ids = folder / "ids.txt"
    ids.write_text("0 1\n2\n\n1,1,0\n0\t3\n")  # the tiny models' vocabulary 0..2, eos 3 appended
    bad = folder / "bad.txt"
    bad.write_text("0 1\nzz\n")
    return names, ids, bad


def test_enumerate_decodes_text_and_fits_an_ngram_draft_from_a_corpus(capsys, corpus_files):
    from jaxrescore.data.names_models import shipped_target_path

    names, _, _ = corpus_files
    target = str(shipped_target_path())
    out = run_json(capsys, "enumerate", "--target", target, "--draft-corpus", str(names),
                   "--draft-order", "4", "--k", "5", "--prompt-text", "ma", "--json")
    texts = [i["text"] for i in out["items"]]
    assert out["proven"] is True and out["vocabulary"] is True
    assert all(t.startswith("ma") for t in texts) and "mary" in texts
    demo_out = run_json(capsys, "demo", "--json", "--k", "5", "--prefix", "ma")
    assert texts == [i["text"] for i in demo_out["items"]]  # the same proven answer, any draft
    assert main(["enumerate", "--target", target, "--draft-corpus", str(names), "--k", "3"]) == 0
    text = capsys.readouterr().out
    assert "john" in text and "nats" in text and max(map(len, text.splitlines())) <= 100


def test_enumerate_corpus_of_token_ids_and_bad_corpus_lines(capsys, tiny_models, corpus_files):
    target_path, _ = tiny_models
    _, ids, bad = corpus_files
    out = run_json(capsys, "enumerate", "--target", target_path, "--draft-corpus", str(ids),
                   "--k", "3", "--json")
    assert out["proven"] is True and out["vocabulary"] is False
    assert all(i["text"] == " ".join(map(str, i["tokens"])) for i in out["items"])
    assert main(["enumerate", "--target", target_path, "--draft-corpus", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.txt:2" in err and "no vocabulary" in err, err
    assert main(["enumerate", "--target", target_path, "--draft-corpus", str(ids),
                 "--prompt-text", "a"]) == 2
    assert "vocabulary" in capsys.readouterr().err


def test_enumerate_models_with_a_vocabulary_print_text(capsys, tmp_path):
    from jaxrescore.models.checkpoint import save_model
    from jaxrescore.models.transformer import TransformerConfig, TransformerLM

    cfg = TransformerConfig(vocab_size=4, d_model=8, n_layers=1, n_heads=2, max_len=4, eos=3)
    words = ["red", "green", "blue", "<end>"]
    for name, seed in (("t", 0), ("d", 1)):
        save_model(TransformerLM(cfg, seed=seed), tmp_path / f"{name}.npz", vocabulary=words)
    out = run_json(capsys, "enumerate", "--target", str(tmp_path / "t.npz"), "--draft",
                   str(tmp_path / "d.npz"), "--k", "4", "--prompt-text", "blue", "--json")
    assert out["prompt"] == [2]
    for item in out["items"]:
        assert item["text"] == " ".join(["blue"] + [words[t] for t in item["tokens"][:-1]])


@pytest.mark.parametrize("target_len, draft_len", [(3, 6), (6, 3)])
def test_enumerate_target_and_draft_of_different_lengths(capsys, tmp_path, target_len, draft_len):
    from jaxrescore.models.checkpoint import save_model
    from jaxrescore.models.transformer import TransformerConfig, TransformerLM

    for name, n, seed in (("t", target_len, 0), ("d", draft_len, 1)):
        cfg = TransformerConfig(vocab_size=4, d_model=8, n_layers=1, n_heads=2, max_len=n, eos=3)
        save_model(TransformerLM(cfg, seed=seed), tmp_path / f"{name}.npz")
    out = run_json(capsys, "enumerate", "--target", str(tmp_path / "t.npz"), "--draft",
                   str(tmp_path / "d.npz"), "--k", "20", "--window", "0", "--gap", "1", "--json")
    assert out["proven"] is True and all(len(i["tokens"]) <= target_len for i in out["items"])
    # k=20 exceeds the short target's support (13 sequences): only those are listed
    assert len(out["items"]) == (13 if target_len == 3 else 20)
    assert all(i["target_log_prob"] > -np.inf for i in out["items"])


def test_a_corrupted_model_file_is_one_line_exit_2(capsys, tmp_path, tiny_models):
    target_path, draft_path = tiny_models
    data = bytearray(open(target_path, "rb").read())
    data[len(data) // 2] ^= 0x55
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    assert main(["enumerate", "--target", str(bad), "--draft", draft_path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flipped.npz" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_train_never_writes_into_the_package_by_default(capsys, tmp_path, monkeypatch):
    from jaxrescore.data.names_models import names_target_config, shipped_target_path
    from jaxrescore.demo.train import check_train_output, default_train_path
    from jaxrescore.models.checkpoint import load_model

    shipped = shipped_target_path()
    before = shipped.read_bytes()
    assert main(["train", "--steps", "3", "--out", str(shipped)]) == 2  # refused before training
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and shipped.read_bytes() == before
    assert check_train_output(shipped, force=True) == shipped  # allowed only when forced

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    path = default_train_path()
    assert path == tmp_path / "data" / "jaxrescore" / "names_target.npz"
    assert shipped.parent not in path.parents
    assert main(["train", "--steps", "3"]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    model = load_model(path)
    assert model.config == names_target_config() and model.vocabulary[:3] == ("a", "b", "c")
    assert shipped.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_train_checks_the_folder_is_writable_first(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["train", "--out", str(locked / "t.npz")]) == 2
        assert "cannot write" in capsys.readouterr().err
    finally:
        locked.chmod(0o700)


def test_train_refuses_an_unwritable_place_before_training(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["train", "--out", str(blocker / "sub" / "t.npz")]) == 2  # parent is a file
    assert "cannot write" in capsys.readouterr().err


def test_an_absurd_k_is_refused_before_any_work():
    """Issue 36 item 6: ``k=10**9`` ran until the index hit its 2 GiB limit; the demo's library
    entry points refuse it at once, naming k and the accepted range (the CLI: see above)."""
    from jaxrescore.demo.args import DemoArgumentError
    from jaxrescore.demo.defaults import MAX_K
    from jaxrescore.demo.names import run_demo

    with pytest.raises(DemoArgumentError, match=r"k must be an integer in \[1, 1001\), got 1000000000"):
        run_demo(k=10**9, progress=False)
    assert MAX_K == 1000


# Runs ``jaxrescore train`` whose save blocks midway (the bytes half-written), so a signal can
# arrive while the temporary file exists.
BLOCKED_SAVE = """
import sys, time
import numpy as np
from jaxrescore import cli, files
from jaxrescore.demo import train

def blocked_savez(f, **arrays):
    f.write(b"half a file")
    print("writing", flush=True)
    time.sleep(120)

def fake_train(out, **kwargs):
    files.write_npz_atomic(str(out), {"w": np.zeros(3)}, prefix=".jaxrescore-model-")
    return out

files.np = type("np", (), {"savez": staticmethod(blocked_savez)})
train.train_demo_target = fake_train
sys.exit(cli.main(["train", "--out", sys.argv[1]]))
"""


@pytest.mark.parametrize("sig, status, word", [(2, 130, "interrupted"), (15, 143, "terminated")])
def test_a_signal_during_a_save_prints_one_line_and_leaves_no_temporary_file(tmp_path, sig, status, word):
    """Issue 36 item 6: Ctrl-C printed a traceback, and a killed save left a hidden ``.tmp``
    beside the destination. Now one line, exit 128 + the signal, and the folder as it was."""
    import signal as signals

    out = tmp_path / "w.npz"
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_SAVE, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signals.signal(signals.SIGINT, signals.SIG_DFL))
    try:
        assert proc.stdout.readline() == "writing\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # mid-save
        proc.send_signal(signals.Signals(sig))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == status, err
    assert err == f"jaxrescore train: {word}\n", err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_while_the_demo_runs_prints_one_line():
    """Issue 36 item 6, the real command (imports and work under way): exit 130, no traceback."""
    import signal as signals
    import time

    # SIGINT as a terminal delivers it (a runner that ignores it would pass that on to the child)
    proc = subprocess.Popen([sys.executable, "-m", "jaxrescore", "demo", "--k", "5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "JAXRESCORE_COMPILE_CACHE": "0"},
                            preexec_fn=lambda: signals.signal(signals.SIGINT, signals.SIG_DFL))
    try:
        time.sleep(3)  # jax imported, the index or the search under way
        proc.send_signal(signals.SIGINT)
        out, err = proc.communicate(timeout=120)  # a compile under way finishes first
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err == "jaxrescore demo: interrupted\n" and "Traceback" not in err, err


def test_an_interrupt_caught_inside_exec_still_exits_with_the_status(tmp_path):
    """The flake behind a CI failure: the demo's Ctrl-C landed in an ``exec`` of source text run
    while jax was imported (a dataclass being built); CPython remembered it although main()
    handled it, and ``python -m`` then died by SIGINT (-2) instead of exiting with 130."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import os, signal, sys\n"
        "from jaxrescore.cli import _forget_handled_interrupt\n"
        "try:\n"
        "    exec('os.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(9): pass')\n"
        "except KeyboardInterrupt:\n"
        "    if sys.argv[1:] == ['forget']:\n"
        "        _forget_handled_interrupt()\n"
        "raise SystemExit(130)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def status(*args):
        return subprocess.run([sys.executable, "-m", "interrupted_in_exec", *args], env=env, timeout=60).returncode

    assert status("forget") == 130
    if sys.version_info[:2] == (3, 11):  # the CPython behaviour the fix is for (shows the test can fail)
        assert status() == -2  # killed by SIGINT


def test_a_swallowed_interrupt_is_redelivered_only_while_the_command_runs():
    """An interrupt swallowed in a finalizer comes back to the main thread; once the command has
    handled one (or returned), a late redelivery must not kill the process after its message."""
    import time
    import types

    from jaxrescore.cli import REDELIVER_S, _Redelivery

    swallowed = types.SimpleNamespace(exc_value=KeyboardInterrupt())
    redelivery = _Redelivery(hook=lambda unraisable: None)
    with pytest.raises(KeyboardInterrupt):
        redelivery.handle(swallowed)
        time.sleep(20 * REDELIVER_S)
    redelivery.handle(swallowed)
    redelivery.disarm()
    time.sleep(5 * REDELIVER_S)  # nothing arrives
    seen = []
    _Redelivery(hook=seen.append).handle(types.SimpleNamespace(exc_value=ValueError("x")))
    assert len(seen) == 1
