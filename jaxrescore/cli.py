"""The ``jaxrescore`` command: ``demo`` (the main job), ``enumerate`` and ``train``.

Argument parsing and printing only; the work lives in :mod:`jaxrescore.demo`, which checks the
values (argparse here only turns text into numbers). Conventions:

- ``jaxrescore --help`` and ``--version`` answer without importing jax or flax (the parser
  imports nothing heavy; the work is imported once a command runs);
- ``jaxrescore`` with no command lists the commands on stdout and exits with status 2 (it did
  no work: a script that forgot the command notices);
- bad arguments, unreadable or invalid model/corpus files and bad output paths get ONE line on
  stderr and exit status 2; a library error while running gets one line and status 1
  (``JAXRESCORE_TRACEBACK=1`` shows the traceback instead);
- Ctrl-C prints one line and exits with status 130, SIGTERM with 143 (128 + the signal, as a
  shell reports it), no traceback; a file being written is removed, not left half-done;
- ``--k`` above ``MAX_K`` is refused before any work (see :data:`jaxrescore.demo.defaults.MAX_K`);
- on a terminal, stderr shows what each long stage is doing (and the draft index's progress
  bar); the answer table is printed as soon as it is proven, the comparisons after it;
- output fits 100 columns; log-probs are natural logs, in nats.
"""

from __future__ import annotations

import _thread
import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from jaxrescore._version import package_version
from jaxrescore.demo.defaults import (
    DEFAULT_CORPUS_ORDER,
    DEFAULT_K,
    MAX_K,
    TRAIN_BATCH,
    TRAIN_MIN_STEPS,
    TRAIN_SEED,
    TRAIN_STEPS,
)

USAGE_ERROR = 2
RUN_ERROR = 1
INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports it
TERMINATED = 128 + signal.SIGTERM  # 143
REDELIVER_S = 0.1  # a swallowed interrupt is delivered again this much later (see _Redelivery)
NO_CACHE_ENV = "JAXRESCORE_COMPILE_CACHE"


class UsageError(Exception):
    """A bad command-line argument; reported as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block on error; one line is easier to read and to grep.
    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message}")


def _token_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers (the models check they are token ids)."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids like 3,1,4, got {text!r}"
        ) from None


def _k(text: str) -> int:
    """An argparse type: ``--k``, an integer from 1 to MAX_K (refused before minutes of work)."""
    try:
        k = int(text)
    except ValueError:
        k = None
    if k is None or not 1 <= k <= MAX_K:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 1 to {MAX_K} (each sequence is a printed row and costs target "
            f"forwards; for more, use jaxrescore.RescoredIndex), got {text!r}"
        )
    return k


def _regex(text: str) -> str:
    """``--regex``: a pattern jaxrescore.constraints.Regex compiles (checked before any work)."""
    from jaxrescore.constraints import Regex

    try:
        Regex(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _add_query_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=_k, default=DEFAULT_K, help=f"how many sequences, 1 to {MAX_K} (default {DEFAULT_K})")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="extra draft candidates rescored by the target in a query's first round (default: 32 "
        "for the proven search; for the gap-certified query a 64-wide first query grown until it "
        "certifies)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


EPILOG = (
    "Log-probs are natural logs, in nats. Without a command: lists the commands, exit status 2. "
    "Exit status 2: bad arguments or files; 1: an error while running; 130: interrupted (Ctrl-C); "
    "143: terminated (SIGTERM). Run 'jaxrescore COMMAND "
    "--help' for a command's options. Compiled programs are cached in "
    "$XDG_CACHE_HOME/jaxrescore/jax (~/.cache/jaxrescore/jax), so a second run starts faster; "
    f"{NO_CACHE_ENV}=0 turns the cache off, JAX_COMPILATION_CACHE_DIR=DIR puts it elsewhere."
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (imports nothing heavy, so ``--help`` is fast)."""
    parser = _Parser(
        prog="jaxrescore",
        description="Speculative enumeration in JAX: a cheap draft model orders the candidates, "
        "the target scores them, and the answer is proven exact.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"jaxrescore {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "demo",
        help="top-k US first names: a character n-gram draft, the shipped transformer target",
        description="The most probable US first names under a small character transformer (the "
        "target), found through a character n-gram (the draft) and PROVEN exact; beside it, the "
        "cost of an exact best-first search over the target and the gap-certified query.",
        epilog=EPILOG,
    )
    _add_query_args(p)
    p.add_argument(
        "--gap",
        type=float,
        default=None,
        help="assumed max target - draft log-prob gap in nats for the gap-certified query "
        "(default: the max observed on common names and target samples the target rates near or "
        "above the answers, plus a 1-nat margin; an assumption, not a proof)",
    )
    p.add_argument("--prefix", default="", help="only names starting with this (lowercase a-z)")
    p.add_argument(
        "--regex", type=_regex, default=None,
        help="only names (after --prefix) fully matching this regular expression, e.g. 'ma[a-z]*a': "
        "proven among those names (no gap-certified query then)",
    )
    p.add_argument(
        "--target", type=Path, default=None,
        help="target weights (default: shipped; e.g. the file 'jaxrescore train' wrote)",
    )

    p = sub.add_parser(
        "enumerate",
        help="proven top-k of your own saved target, through your own draft",
        description="Speculative exact search with your models: a target saved with "
        "jaxrescore.models.save_model (TransformerLM, its int8 twin or an NGramLM), and a draft "
        "that is either another saved model or an n-gram fitted here on a corpus file. Sequences "
        "print as text when the models carry a vocabulary (save_model(..., vocabulary=...)), "
        "else as token ids.",
        epilog=EPILOG,
    )
    p.add_argument("--target", type=Path, required=True, help="saved target model")
    draft = p.add_mutually_exclusive_group(required=True)
    draft.add_argument("--draft", type=Path, help="saved draft model")
    draft.add_argument(
        "--draft-corpus", type=Path, metavar="FILE",
        help="fit an n-gram draft on this text file: one sequence per line, optionally "
        "TAB and a count; text read with the target's vocabulary, else token ids",
    )
    p.add_argument(
        "--draft-order", type=int, default=DEFAULT_CORPUS_ORDER, metavar="N",
        help=f"order of the n-gram fitted with --draft-corpus (default {DEFAULT_CORPUS_ORDER})",
    )
    _add_query_args(p)
    p.add_argument(
        "--gap", type=float, default=None,
        help="assumed max target - draft gap (nats) for a gap-certified query too; none = proof only"
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", type=_token_list, default=(), help="prompt token ids, e.g. 3,1,4")
    prompt.add_argument("--prompt-text", default=None, help="prompt as text (models with a vocabulary)")
    p.add_argument("--bits", type=float, default=None, help="draft index depth budget in bits")

    p = sub.add_parser(
        "train",
        help="retrain the demo's target transformer on the shipped names",
        description=f"Retrain the demo target from scratch: {TRAIN_STEPS} adamw steps of "
        f"{TRAIN_BATCH} names sampled by birth count in three learning-rate phases, about 9 minutes on 2 CPU cores, with one "
        "progress bar and its time left on a terminal. The output path is checked before training "
        "starts. Use the result with 'jaxrescore demo --target PATH'.",
        epilog=EPILOG,
    )
    p.add_argument(
        "--out", type=Path, default=None,
        help="where to write the weights, in a folder that exists (default: "
        "$XDG_DATA_HOME/jaxrescore/names_target.npz, i.e. "
        "~/.local/share/jaxrescore/names_target.npz, its folder created; never inside the "
        "installed package)",
    )
    p.add_argument(
        "--force", action="store_true",
        help="allow --out to be the weights shipped inside the package (replaces the demo's target)",
    )
    p.add_argument(
        "--steps", type=int, default=TRAIN_STEPS, metavar="N",
        help=f"optimisation steps in all, at least {TRAIN_MIN_STEPS} (one per learning-rate phase; "
        f"default {TRAIN_STEPS})",
    )
    p.add_argument(
        "--seed", type=int, default=TRAIN_SEED, metavar="N",
        help=f"initialisation and batch-sampling seed, an integer >= 0 (default {TRAIN_SEED}; the "
        "same steps and seed give the same weights on one platform)",
    )
    return parser


def enable_compilation_cache() -> str | None:
    """Persist compiled XLA programs across runs in a user cache dir
    (:func:`jaxrescore.compilation_cache.default_cache_dir`): start-up drops from compile-bound
    seconds to load-bound fractions on the second run. Respects a cache dir the user already
    configured (``JAX_COMPILATION_CACHE_DIR``); ``JAXRESCORE_COMPILE_CACHE=0`` turns it off. The
    directory in use, or None."""
    if os.environ.get(NO_CACHE_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    from jaxrescore.compilation_cache import enable_compilation_cache as enable

    return enable()  # a read-only home only costs compile time (None)


class Status:
    """One status line on stderr saying what a long run is doing; silent unless ``enabled`` (a
    terminal: no stray lines in pipes and logs)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.shown = False

    def __call__(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\033[Kjaxrescore: {text}...")
            sys.stderr.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False


def _run(args, status: Status) -> int:
    from jaxrescore.demo import enumerate as enumerate_command
    from jaxrescore.demo import names, report, train

    as_json = getattr(args, "json", False)

    def show_answer(fmt):
        def shown(partial: dict) -> None:
            status.clear()
            print(fmt(partial), flush=True)

        return None if as_json else shown

    if args.command == "train":
        path = train.check_train_arguments(  # before minutes of training
            args.out, steps=args.steps, seed=args.seed, force=args.force
        )
        if status.enabled:
            print(f"jaxrescore: training the demo target for {args.steps} steps, then writing {path}",
                  file=sys.stderr)
        path = train.train_demo_target(
            out=path, steps=args.steps, seed=args.seed, progress=status.enabled, force=args.force
        )
        print(f"wrote {path}\nuse it with: jaxrescore demo --target {path}")
        return 0
    if args.command == "demo":
        result = names.run_demo(
            k=args.k, window=args.window, gap=args.gap, prefix=args.prefix, regex=args.regex, target_path=args.target,
            progress=status.enabled, on_stage=status, on_answer=show_answer(report.format_demo_answer),
        )
        details = report.format_demo_details
    else:
        result = enumerate_command.run_enumerate(
            target_path=args.target, draft_path=args.draft, draft_corpus=args.draft_corpus,
            draft_order=args.draft_order, k=args.k, window=args.window, gap=args.gap,
            prompt=args.prompt, prompt_text=args.prompt_text, bits=args.bits,
            progress=status.enabled, on_stage=status,
            on_answer=show_answer(report.format_enumerate_answer),
        )
        details = report.format_enumerate_details
    status.clear()
    print(json.dumps(result) if as_json else details(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxrescore`` console script and ``python -m jaxrescore``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return USAGE_ERROR
    if args.command is None:
        parser.print_help()
        return USAGE_ERROR
    # Stage messages and bars only where someone watches them: not into a pipe or a log file.
    status = Status(sys.stderr.isatty())
    # SIGTERM unwinds like Ctrl-C (a save under way removes its temporary file); signal handlers
    # can only be set from the main thread (a caller running main() in another keeps the default)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    hook = sys.unraisablehook
    redelivery = _Redelivery(hook)
    sys.unraisablehook = redelivery.handle
    try:
        from jaxrescore.demo.args import DemoArgumentError

        enable_compilation_cache()
        try:
            return _run(args, status)
        except (DemoArgumentError, FileNotFoundError, IsADirectoryError) as err:
            status.clear()
            print(f"jaxrescore {args.command}: error: {_one_line(err)}", file=sys.stderr)
            return USAGE_ERROR
        except (ValueError, TypeError, OSError) as err:
            status.clear()
            if os.environ.get("JAXRESCORE_TRACEBACK"):
                raise
            print(f"jaxrescore {args.command}: error: {type(err).__name__}: {_one_line(err)}", file=sys.stderr)
            return RUN_ERROR
    except (KeyboardInterrupt, _Terminated) as err:
        redelivery.disarm()  # handled: a redelivery still pending would kill the process after it
        status.clear()
        what = "interrupted" if isinstance(err, KeyboardInterrupt) else "terminated"
        print(f"jaxrescore {args.command}: {what}", file=sys.stderr)
        _forget_handled_interrupt()
        return INTERRUPTED if isinstance(err, KeyboardInterrupt) else TERMINATED
    finally:
        redelivery.disarm()
        sys.unraisablehook = hook
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _forget_handled_interrupt() -> None:
    """CPython (3.11-3.13) remembers a KeyboardInterrupt that escaped an ``exec`` of source text
    (dataclasses and NamedTuples build their methods that way while jax is imported) even when
    it was caught afterwards; under ``python -m`` the process then kills itself with SIGINT at
    exit instead of returning our status. Each ``exec`` of text first clears that memory, so an
    empty one makes the handled interrupt's status the one the process exits with."""
    exec("")  # noqa: S102 - an empty program, run for its side effect described above


class _Terminated(BaseException):
    """SIGTERM, raised where the main thread is, so ``finally`` blocks and cleanups run."""


def _terminate(signum, frame):
    raise _Terminated()


class _Redelivery:
    """An unraisable-exception hook: Python swallows (and prints as "Exception ignored") an
    exception raised inside a garbage-collection callback or a finalizer, and jax runs one on
    every collection, so a Ctrl-C landing there would neither stop the command nor stay quiet.
    Such an interrupt is delivered again a moment later, to land elsewhere (from a thread that
    this hook does not wait for: a wait here could itself be interrupted); anything else goes
    to ``hook``. Once the command has handled an interrupt or returned, nothing more is
    delivered: a late one would escape ``main`` and kill the process with the signal."""

    def __init__(self, hook):
        self._hook = hook
        self._lock = threading.Lock()
        self._armed = True

    def handle(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _thread.start_new_thread(self._deliver_later, (signal.SIGINT,))
        elif isinstance(unraisable.exc_value, _Terminated):
            _thread.start_new_thread(self._deliver_later, (signal.SIGTERM,))
        else:
            self._hook(unraisable)

    def disarm(self) -> None:
        with self._lock:
            self._armed = False

    def _deliver_later(self, signum: int) -> None:
        time.sleep(REDELIVER_S)
        with self._lock:
            if self._armed:
                _thread.interrupt_main(signum)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())
