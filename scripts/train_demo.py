"""Retrain the names demo's target transformer and overwrite the shipped weights.

    python scripts/train_demo.py [--steps 7000] [--seed 0] [--out jaxrescore/data/names_target.npz]

The same code as ``jaxrescore train`` (:func:`jaxrescore.demo.train_demo_target`).
"""

import sys

from jaxrescore.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["train", *sys.argv[1:]]))
