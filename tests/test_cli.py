"""The ``jaxrescore`` command: demo (table and --json), prefix prompts, bad arguments, enumerate
with saved models, train."""

import json
import os
import subprocess
import sys

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
    from jaxrescore.demo import run_demo

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


def test_demo_json_via_console_module(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrescore", "demo", "--json", "--k", "5", "--window", "256"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("items", "proven", "frontier_bound", "proof_reason", "rounds", "target_calls",
                "target_sequences", "exact_best_first", "gap_certified"):
        assert key in out
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


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["demo", "--k", "0"], "positive integer"),
        (["demo", "--window", "-3"], "integer >= 0"),
        (["demo", "--gap", "-1"], "finite number >= 0"),
        (["demo", "--gap", "nan"], "finite number >= 0"),
        (["demo", "--prefix", "Ma"], "lowercase letters"),
        (["demo", "--prefix", "abcdefghijklmno"], "at most 14 letters"),
        (["demo", "--bogus"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["enumerate", "--target", "/nonexistent.npz", "--draft", "/nonexistent.npz"], "no model file"),
        (["enumerate", "--target", "x", "--draft", "y", "--prompt", "1,a"], "comma-separated"),
        (["train", "--steps", "0"], "positive integer"),
        (["enumerate", "--target", "x", "--draft", "y", "--bits", "-1"], "bits must be"),
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


def test_train_writes_a_loadable_target(tmp_path, capsys):
    from jaxrescore.demo import target_config
    from jaxrescore.models.checkpoint import load_model

    out = tmp_path / "t.npz"
    assert main(["train", "--steps", "3", "--out", str(out)]) == 0
    assert load_model(out).config == target_config()


@pytest.mark.parametrize("k, prefix", [(100, ""), (25, "ma")])
def test_proven_names_meet_the_bar(k, prefix):
    """At most 8 target calls, fewer target sequences than best-first needs prefix forwards, and
    the same answer as exact best-first search over the target."""
    from jaxrescore.demo import run_demo

    out = run_demo(k=k, prefix=prefix, progress=False, certify=False)
    assert out["proven"] is True, out["proof_reason"]
    exact = out["exact_best_first"]
    assert exact["same_answer"] is True
    assert out["target_calls"] <= 8 and out["target_sequences"] < exact["forwards"]
