"""``jaxrescore train``: retrain the names demo's target from scratch on the shipped names and
save it, to a user path checked before minutes of training."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

from jaxrescore._checks import check_int
from jaxrescore.data.names_models import (
    TARGET_FILE,
    names_corpus,
    names_target_config,
    names_vocabulary,
    shipped_target_path,
)
from jaxrescore.demo.args import DemoArgumentError, check_flag, worded
from jaxrescore.demo.defaults import TRAIN_BATCH, TRAIN_MIN_STEPS, TRAIN_PHASES, TRAIN_SEED, TRAIN_STEPS
from jaxrescore.models import TransformerLM, save_model, train_lm
from jaxrescore.models import training


def default_train_path() -> Path:
    """Where ``jaxrescore train`` writes by default: ``$XDG_DATA_HOME/jaxrescore/names_target.npz``
    (``~/.local/share/jaxrescore/names_target.npz`` without XDG_DATA_HOME), a user path, never
    inside the installed package."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "jaxrescore" / TARGET_FILE


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_train_output(out: str | os.PathLike | None, *, force: bool = False) -> Path:
    """The path :func:`train_demo_target` will write, checked BEFORE any training (minutes of it):
    not a folder, in a folder that exists (only the default path's folder is created: a typo in
    a path given explicitly should not leave a tree of new folders behind) and that is writable
    (probed with a temporary file, removed at once), and not the weights shipped inside the
    package unless ``force`` (overwriting them changes what ``jaxrescore demo`` runs for everyone
    using this installation). DemoArgumentError naming the path otherwise.

    Args:
      out: the file to write; None: :func:`default_train_path` (its folder created if missing).
      force: allow ``out`` to be the shipped weights file.
    """
    force = check_flag(force, "force")
    path = default_train_path() if out is None else Path(out).expanduser()
    if path.is_dir():
        raise DemoArgumentError(f"out {str(path)!r} is a folder; give a file path such as {str(path / TARGET_FILE)!r}")
    if _same_file(path, shipped_target_path()) and not force:
        raise DemoArgumentError(
            f"out {str(path)!r} is the target shipped inside the package; retraining would replace "
            "what `jaxrescore demo` runs for every user of this installation. Pass --force (force=True) "
            "to overwrite it, or write elsewhere"
        )
    folder = path.parent
    if out is not None and not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DemoArgumentError(
            f"cannot write {str(path)!r}: the folder {str(folder)!r} {what} (create it first; only "
            "the default path's folder is created)"
        )
    try:
        if out is None:
            folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".jaxrescore-probe-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise DemoArgumentError(f"cannot write {str(path)!r}: {err.strerror or err}") from None
    return path


def check_train_arguments(out: str | os.PathLike | None, *, steps: int, seed: int, force: bool) -> Path:
    """The arguments of :func:`train_demo_target` checked before any training: ``steps`` an
    integer >= one per learning-rate phase, ``seed`` an integer >= 0, then the output path
    (:func:`check_train_output`), which is returned."""
    worded(check_int, steps, "steps", minimum=TRAIN_MIN_STEPS)
    worded(check_int, seed, "seed", minimum=0)
    return check_train_output(out, force=force)


def train_demo_target(
    out: str | os.PathLike | None = None,
    *,
    steps: int = TRAIN_STEPS,
    seed: int = TRAIN_SEED,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Train the demo target from scratch and save it (``save_model`` format, with the names
    vocabulary); returns the path. The arguments are checked first (:func:`check_train_arguments`).

    Batches sample names in proportion to birth count, so the model learns the distribution of
    first names of people born in the US 1880-2017. Deterministic for a given ``seed`` and
    ``steps`` on one platform.

    Args:
      out: where to write (default: :func:`default_train_path`, a user path outside the package).
      steps: optimisation steps in all (batch 256, adamw, step-decayed learning rate).
      seed: initialisation and batch-sampling seed.
      progress: show one tqdm bar over all the steps (every learning-rate phase), with the
        time left and the running loss.
      force: allow ``out`` to be the weights shipped inside the package (the source
        repository's ``scripts/train_demo.py`` regenerates them so).
    """
    path = check_train_arguments(out, steps=steps, seed=seed, force=force)
    steps, seed = int(steps), int(seed)
    progress = check_flag(progress, "progress")
    seqs, counts = names_corpus()
    model = TransformerLM(names_target_config(), seed=seed)
    done = 0
    with _one_bar(steps, progress) as shown:
        for phase, (share, lr) in enumerate(TRAIN_PHASES):
            n = steps - done if phase == len(TRAIN_PHASES) - 1 else max(1, int(share * steps))
            train_lm(
                model, seqs, weights=counts, steps=n, batch_size=TRAIN_BATCH, lr=lr,
                seed=seed + phase, progress=shown,
            )
            done += n
    save_model(model, path, vocabulary=names_vocabulary())
    return path


class _Steps:
    """What ``train_lm`` takes for its per-call tqdm bar: iterates over its steps while moving the
    one overall bar, and shows the running loss there."""

    def __init__(self, bar, iterable):
        self.bar, self.iterable = bar, iterable

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.bar.update(1)

    def set_postfix(self, **kwargs):
        self.bar.set_postfix(**kwargs)


@contextlib.contextmanager
def _one_bar(total: int, progress: bool):
    """One tqdm bar over every phase's steps (time left included) while the phases train: the
    bar ``train_lm`` would open per call is swapped for a view of this one. Yields the
    ``progress`` flag to pass to ``train_lm`` (True only when the swap is in place)."""
    if not progress or not hasattr(training, "tqdm"):
        yield progress
        return
    with tqdm(total=total, desc="training the demo target", unit="step") as bar:
        original = training.tqdm
        training.tqdm = lambda iterable, **_: _Steps(bar, iterable)
        try:
            yield True
        finally:
            training.tqdm = original
