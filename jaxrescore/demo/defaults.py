"""The commands' defaults. Imports nothing, so the command line's parser can read them and still
answer ``--help`` without loading numpy or jax."""

TRAIN_SEED = 0
TRAIN_STEPS = 7000
TRAIN_BATCH = 256
TRAIN_PHASES = ((4 / 7, 3e-3), (2 / 7, 1e-3), (1 / 7, 3e-4))
"""Learning-rate phases (fraction of the steps, lr): a short constant-lr run per phase is a cheap
step-decay schedule that ``train_lm``'s constant adamw supports as is."""
TRAIN_MIN_STEPS = len(TRAIN_PHASES)
"""One step per learning-rate phase."""

DEFAULT_K = 25
MAX_K = 1000
"""The most sequences a command answers (``--k``): each is a printed row, and the proof scores
at least ``k + window`` sequences with the target, the best-first comparison expands the target
at least ``k`` times and the draft index holds ``k + window`` sequences. ``jaxrescore demo --k
1000`` took 161 s on the project's shared 2 cores (2,526 target sequences in 4 calls); past this a
run takes far longer than a command-line answer is for (use
:class:`~jaxrescore.rescore.RescoredIndex` directly)."""
DEFAULT_CORPUS_ORDER = 3
"""Order of the n-gram draft ``enumerate --draft-corpus`` fits."""
PROVE_WINDOW = 32
"""Draft candidates beyond k in the proving run's first round (measured on the names models:
fewer rounds than 0, fewer sequences than 64)."""
FIRST_WINDOW = 64
"""First window of the gap-certified query grown until it certifies."""
GAP_REGION_MARGIN = 1.0
GAP_TOP_NAMES = 4096
GAP_SAMPLES = 1024
GAP_MARGIN = 1.0
"""Nats added to the estimated gap before it is assumed."""
