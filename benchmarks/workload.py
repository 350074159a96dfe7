"""The models of a word-level benchmark workload (``wide.py``, ``text.py``): how they are set up,
trained, cached and measured. A workload supplies its :class:`Data` (vocabulary and training
sentences); everything here is the same for every workload.

Everything is deterministic: the target is trained with :func:`jaxrescore.train_lm` from fixed
seeds, the student distilled with :func:`jaxrescore.distill` from fixed seeds, the n-gram is
count-based. Trained weights are cached as ``<workload>_target.npz`` and
``<workload>_student.npz`` (``save_model``, with the vocabulary) and regenerated when missing.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Data(NamedTuple):
    """What a workload's models are made from.

    Attributes:
      words: the vocabulary, ``words[i]`` is token ``i``.
      eos: the token ending every sentence.
      max_len: the models' support: sentences of up to ``max_len`` tokens, ``eos`` included.
      train: the training sentences, token tuples ending in ``eos``.
    """

    words: tuple
    eos: int
    max_len: int
    train: tuple


@dataclass(frozen=True)
class Setup:
    """How a workload's models are made (each workload has a ``FULL`` and a ``QUICK``).

    Attributes:
      workload: the cache files' prefix: ``<workload>_<role>[_<name>].npz``.
      name: ``"full"`` or ``"quick"``.
      corpus_size: training sentences (the workload says which; None: all it has).
      d_model, n_layers, n_heads, steps, batch_size, lr: the target and its ``train_lm`` run
        (adamw, linear warm-up over 5% of the steps, then cosine decay to lr / 20).
      draft_order: the n-gram draft's order.
      student_d_model, student_layers, student_heads, distill_steps, distill_lr: the distilled
        student draft and its ``distill`` run (same schedule shape).
      seed: initialisation and batch-sampling seed of the target (the student uses seed + 1).
      dropout: the target's dropout rate while training (the student trains without).
    """

    workload: str
    name: str
    corpus_size: int | None
    d_model: int
    n_layers: int
    n_heads: int
    steps: int
    batch_size: int
    lr: float
    draft_order: int
    student_d_model: int
    student_layers: int
    student_heads: int
    distill_steps: int
    distill_lr: float
    seed: int = 0
    dropout: float = 0.0

    def path(self, folder: str, role: str) -> str:
        """The cache file of ``role`` (``"target"`` or ``"student"``) in ``folder``."""
        suffix = "" if self.name == "full" else f"_{self.name}"
        return os.path.join(folder, f"{self.workload}_{role}{suffix}.npz")


def _config(data: Data, d_model: int, n_layers: int, n_heads: int, dropout: float = 0.0):
    from jaxrescore.models import TransformerConfig

    return TransformerConfig(vocab_size=len(data.words), d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                             max_len=data.max_len, eos=data.eos, dropout=dropout)


def target_config(setup: Setup, data: Data):
    return _config(data, setup.d_model, setup.n_layers, setup.n_heads, setup.dropout)


def student_config(setup: Setup, data: Data):
    return _config(data, setup.student_d_model, setup.student_layers, setup.student_heads)


def _schedule(lr: float, steps: int):
    import optax

    return optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr / 20)


def train_target(setup: Setup, data: Data, *, progress: bool = False):
    """A freshly trained word-level TransformerLM (fixed seeds): ``(model, seconds)``."""
    from jaxrescore import train_lm
    from jaxrescore.models import TransformerLM

    model = TransformerLM(target_config(setup, data), seed=setup.seed)
    start = time.perf_counter()
    train_lm(model, list(data.train), steps=setup.steps, batch_size=setup.batch_size,
             lr=_schedule(setup.lr, setup.steps), seed=setup.seed, progress=progress)
    return model, time.perf_counter() - start


def distill_student(setup: Setup, data: Data, target, *, progress: bool = False):
    """A smaller TransformerLM distilled from ``target`` on the training sentences (KL at every
    position, fixed seeds): ``(model, seconds)``."""
    from jaxrescore import distill
    from jaxrescore.models import TransformerLM

    student = TransformerLM(student_config(setup, data), seed=setup.seed + 1)
    start = time.perf_counter()
    distill(student, target, list(data.train), steps=setup.distill_steps, batch_size=setup.batch_size,
            lr=_schedule(setup.distill_lr, setup.distill_steps), seed=setup.seed + 1, progress=progress)
    return student, time.perf_counter() - start


def _load(setup: Setup, data: Data, path: str, config):
    from jaxrescore.models import load_model

    model = load_model(path)
    if getattr(model, "config", None) != config or tuple(model.vocabulary or ()) != tuple(data.words):
        raise ValueError(f"{path} holds a {model!r}, not the {setup.workload} workload's model; delete it to retrain")
    return model


def load_or_train(setup: Setup, data: Data, folder: str | None, *, progress: bool = False):
    """``(target, student, seconds)``: the cached models in ``folder`` when present, else trained
    now (the target with ``train_lm``, then the student distilled from it) and saved there
    (``folder=None``: trained, not saved). ``seconds`` maps ``"target"``/``"student"`` to the
    training time spent in this call (absent when loaded). A retrained target always gets a
    freshly distilled student."""
    from jaxrescore.models import save_model

    seconds = {}
    paths = {role: None if folder is None else setup.path(folder, role) for role in ("target", "student")}
    if paths["target"] is not None and os.path.exists(paths["target"]):
        target = _load(setup, data, paths["target"], target_config(setup, data))
    else:
        target, seconds["target"] = train_target(setup, data, progress=progress)
    if "target" not in seconds and paths["student"] is not None and os.path.exists(paths["student"]):
        student = _load(setup, data, paths["student"], student_config(setup, data))
    else:
        student, seconds["student"] = distill_student(setup, data, target, progress=progress)
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        for role, model in (("target", target), ("student", student)):
            if role in seconds:
                save_model(model, paths[role], vocabulary=data.words)
    return target, student, seconds


def fit_draft(setup: Setup, data: Data):
    """The n-gram draft: interpolated Kneser-Ney over words, fitted on the training sentences."""
    from jaxrescore.models import NGramLM

    return NGramLM.fit(list(data.train), order=setup.draft_order, vocab_size=len(data.words), eos=data.eos,
                       max_len=data.max_len)


def nll_per_token(models: dict, held) -> dict:
    """Mean per-token NLL (nats, ``eos`` included) of each model on the sentences ``held``."""
    tokens = sum(len(s) for s in held)
    return {name: -float(np.sum(model.score_sequences(list(held)))) / tokens for name, model in models.items()}


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_determinism(setup: Setup, data: Data) -> bool:
    """Train the target and distil the student twice; print and compare the saved files' SHA-256."""
    import tempfile

    from jaxrescore.models import save_model

    digests = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(2):
            target, t_seconds = train_target(setup, data)
            student, s_seconds = distill_student(setup, data, target)
            pair = []
            for role, model in (("target", target), ("student", student)):
                path = os.path.join(tmp, f"{role}{run}.npz")
                save_model(model, path, vocabulary=data.words)
                pair.append(file_digest(path))
            digests.append(tuple(pair))
            print(f"run {run}: target {t_seconds:.1f} s sha256 {pair[0][:16]}..., student {s_seconds:.1f} s "
                  f"sha256 {pair[1][:16]}...")
    same = digests[0] == digests[1]
    print("byte-identical" if same else "DIFFERENT")
    return same


def main(argv, description: str, setups: dict, data_of, heldout_nll) -> int:
    """A workload's command line: train (or load) its models into ``--out`` and print their
    held-out NLLs, or ``--check-determinism``. ``setups``: ``{"full": FULL, "quick": QUICK}``;
    ``data_of(setup)``: its :class:`Data`; ``heldout_nll(models)``: NLL per token by name."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=".", help="folder of the cached model files")
    ap.add_argument("--quick", action="store_true", help="the tiny --quick setup")
    ap.add_argument("--check-determinism", action="store_true",
                    help="train twice into temporary files and compare their bytes")
    args = ap.parse_args(argv)
    setup = setups["quick" if args.quick else "full"]
    data = data_of(setup)
    if args.check_determinism:
        return 0 if check_determinism(setup, data) else 1
    target, student, seconds = load_or_train(setup, data, args.out, progress=True)
    for role, model in (("target", target), ("student", student)):
        how = f"trained in {seconds[role]:.1f} s" if role in seconds else "loaded"
        print(f"{role} {model!r}, {model.n_params:,} parameters, {how}, {setup.path(args.out, role)}")
    draft = fit_draft(setup, data)
    print(f"n-gram draft {draft!r}")
    print("held-out NLL per token (nats):", heldout_nll({"target": target, "student": student, "n-gram": draft}))
    return 0
