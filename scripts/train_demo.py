"""Retrain the names demo's target transformer and overwrite the shipped weights.

    python scripts/train_demo.py [--steps 7000] [--seed 0]

The same code as ``jaxrescore train`` (:func:`jaxrescore.demo.train.train_demo_target`), writing to
``jaxrescore/data/names_target.npz`` with ``--force`` (``jaxrescore train`` alone never writes
into the package). Pass ``--out PATH`` to write elsewhere instead.
"""

import sys

from jaxrescore.cli import main
from jaxrescore.data.names_models import shipped_target_path

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", str(shipped_target_path()), "--force"]
    raise SystemExit(main(["train", *args]))
