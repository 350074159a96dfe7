"""The library's files (model files, SeekIndex and AREnvelopeIndex files): one checksum and one
atomic write for all of them.

A file is an ``.npz`` whose header (a JSON dict stored beside the arrays) carries the SHA-256 of
itself and of every array. It is written to a temporary file in the destination's folder, flushed
to disk, then renamed over the destination, so a reader sees the old file or the new one, never a
half-written one, and a failed write leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import numpy as np


def checksum(header: dict, arrays: dict) -> str:
    """SHA-256 of ``header`` (its ``"checksum"`` entry left out) and of every array's name, dtype,
    shape and bytes, in name order."""
    h = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "checksum"}, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_npz_atomic(path: str, arrays: dict, *, prefix: str) -> None:
    """``np.savez(path, **arrays)`` through a temporary file (``prefix``) in ``path``'s folder,
    fsynced before ``os.replace``; the temporary file is removed if anything fails."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
