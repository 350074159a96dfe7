"""The library's files (model files, SeekIndex and AREnvelopeIndex files): one checksum, one
atomic write and one way of telling them apart for all of them.

A file is an ``.npz`` whose header (a JSON dict stored beside the arrays) carries the SHA-256 of
itself and of every array. It is written to a hidden temporary file in the destination's folder
(``.PREFIX<random>.tmp``), flushed to disk, then renamed over the destination, so a reader sees
the old file or the new one, never a half-written one. The file gets the mode of any new file
(``0o666`` less the umask), not the owner-only mode of :func:`tempfile.mkstemp`.

A write that fails or is interrupted (an exception, Ctrl-C; the ``jaxrescore`` command also turns
SIGTERM into a clean exit) removes its temporary file. A process killed outright (SIGKILL, the
machine going down) cannot: its ``.PREFIX*.tmp`` stays beside the destination, never in its place,
and may be deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import zipfile

import numpy as np

# Where each kind of file keeps its JSON header, and what its "format" entry says: the readers
# use it to name a file of another kind instead of calling it corrupted.
HEADERS = ("header", "__meta__")
KINDS = {
    "jaxrescore-model": ("a saved model", "jaxrescore.load_model"),
    "jaxrescore.SeekIndex": ("a SeekIndex file", "SeekIndex.load"),
    "jaxrescore.AREnvelopeIndex": ("an AREnvelopeIndex file", "AREnvelopeIndex.load"),
}


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
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            # 0o666: the umask applies, as to any new file (mkstemp would make it 0o600)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
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


def file_kind(path: str) -> tuple[str, str] | None:
    """What the library file at ``path`` is and what loads it, e.g. ``("a saved model",
    "jaxrescore.load_model")``, from the ``format`` its header declares; None when it is no
    readable library file (not a zip archive, no header, a format this version does not know)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            member = next((f"{h}.npy" for h in HEADERS if f"{h}.npy" in names), None)
            if member is None:
                return None
            with z.open(member) as f:
                raw = np.lib.format.read_array(f, allow_pickle=False)
        text = raw.tobytes().decode() if raw.dtype == np.uint8 else str(raw[()])
        fmt = json.loads(text).get("format")
    except (OSError, ValueError, KeyError, EOFError, AttributeError, zipfile.BadZipFile, UnicodeDecodeError):
        return None
    return KINDS.get(fmt) if isinstance(fmt, str) else None


def not_this_kind(path: str, wanted: str) -> str | None:
    """``"PATH is a saved model, not a SeekIndex file: load it with jaxrescore.load_model"``
    when ``path`` is a library file of another kind than ``wanted`` (its ``format``), else None."""
    kind = file_kind(path)
    if kind is None or kind == KINDS.get(wanted):
        return None
    what, loader = kind
    return f"{path} is {what}, not {KINDS[wanted][0]}: load it with {loader}"
