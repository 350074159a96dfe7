"""Saving and loading a SeekIndex: one versioned ``.npz`` file with a checksum, written atomically.

The file holds a JSON header (format, version, quantizer, the model's vocab_size/eos/max_len, the
build state and a SHA-256 over every array) and the arrays of the prefix tree plus the kept
next-token rows, so a loaded index deepens without re-running forwards. Loading refuses, with a
ValueError saying why, a file that is unreadable, truncated, of another format or version, whose
checksum does not match, or that was built for a model with a different vocabulary, eos or max_len,
a different first next-token table, or different tables at up to ``CHECK_ROWS`` stored prefixes
spread over the depths (re-evaluated in one model call). A model that differs only at prefixes
outside that sample still loads: the check is a sample, not a proof.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile

import numpy as np

from jaxrescore.quantize import Quantizer
from jaxrescore.sequences import bucket_size

FORMAT = "jaxrescore.SeekIndex"
VERSION = 2  # 2: max_len cuts kept apart from branch_cap drops
# Root rows agree if every finite log-prob matches within this (float32 forwards on other hardware).
ROOT_ATOL = 1e-4
# Stored next-token rows re-checked against the model on load.
CHECK_ROWS = 64


def _checksum(header: dict, arrays: dict) -> str:
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _model_meta(model) -> dict:
    return {"vocab_size": int(model.vocab_size), "eos": model.eos, "max_len": int(model.max_len)}


def save_index(index, path) -> None:
    """Write ``index`` to ``path`` (temp file in the same folder, then ``os.replace``)."""
    path = os.fspath(path)
    nodes = index._nodes.export()
    width = max([r.shape[1] for r in index._rows], default=0)
    padded = [np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-np.inf) for r in index._rows]
    rows = np.concatenate(padded) if padded else np.zeros((0, 0), np.float32)
    arrays = {f"node_{k}": v for k, v in nodes.items()}
    arrays["row_ids"] = np.concatenate(index._row_ids) if index._row_ids else np.zeros(0, np.int64)
    arrays["rows"] = rows
    arrays["root_row"] = index._root_row if index._root_row is not None else np.zeros(0, np.float32)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "quantizer": [index.quantizer.bin_width_bits, index.quantizer.oversample],
        "model": _model_meta(index.model),
        "branch_cap": index.branch_cap,
        "max_depth_bits": index.max_depth_bits,
        "budget": index._budget,
        "frontier_min": index._frontier_min,
        "cut_min": index._cut_min,
        "length_cut_min": index._length_cut_min,
        "dropped": str(index._dropped),  # may exceed 2**63
        "forwards": index.forwards,
        "builds": index.builds,
    }
    header["checksum"] = _checksum(header, arrays)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".seekindex-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _read(path: str) -> tuple[dict, dict]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no SeekIndex file at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop("header").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable SeekIndex file (corrupted or truncated): {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a SeekIndex file (format {header.get('format')!r})")
    if header.get("version") != VERSION:
        raise ValueError(f"{path} has SeekIndex format version {header.get('version')!r}; this reads {VERSION}")
    stored = header.pop("checksum", None)
    if stored != _checksum(header, arrays):
        raise ValueError(f"{path} failed its checksum: the file is corrupted")
    return header, arrays


def _check_model(path: str, header: dict, root_row: np.ndarray, model) -> None:
    saved = header["model"]
    meta = _model_meta(model)
    for key in ("eos", "max_len"):
        if saved[key] != meta[key]:
            raise ValueError(f"{path} was built for a model with {key}={saved[key]!r}, this model has {meta[key]!r}")
    inferred = getattr(model, "vocab_inferred", False)
    if meta["vocab_size"] != saved["vocab_size"] and not (inferred and meta["vocab_size"] < saved["vocab_size"]):
        raise ValueError(
            f"{path} was built for a model with vocab_size={saved['vocab_size']}, this model has "
            f"{meta['vocab_size']}"
        )
    if root_row.size == 0:
        return
    now = np.asarray(model.next_logprobs(np.zeros((8, 8), np.int32), np.zeros(8, np.int32)))[0]
    width = max(now.size, root_row.size)
    a = np.full(width, -np.inf)
    b = np.full(width, -np.inf)
    a[: root_row.size] = root_row
    b[: now.size] = now
    same_support = np.array_equal(np.isfinite(a), np.isfinite(b))
    if not same_support or not np.allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=0, atol=ROOT_ATOL):
        raise ValueError(f"{path} was built for a different model: the first next-token table differs")


def load_index(cls, path, model, *, progress=None, chunk_rows=4096):
    """Rebuild a ``cls`` (SeekIndex) instance from ``path`` for ``model``."""
    from jaxrescore.index.seek import _Nodes

    path = os.fspath(path)
    header, arrays = _read(path)
    try:
        quantizer = Quantizer(*header["quantizer"])
        _check_model(path, header, arrays["root_row"], model)
        index = cls.__new__(cls)
        index._setup(model, quantizer, header["branch_cap"], header["max_depth_bits"], progress, chunk_rows)
        index._nodes = _Nodes({k[5:]: v for k, v in arrays.items() if k.startswith("node_")})
        index._row_ids = [arrays["row_ids"].astype(np.int64)]
        index._rows = [arrays["rows"].astype(np.float32)]
        index._root_row = arrays["root_row"] if arrays["root_row"].size else None
        index._budget = int(header["budget"])
        index._frontier_min = int(header["frontier_min"])
        index._cut_min = int(header["cut_min"])
        index._length_cut_min = int(header["length_cut_min"])
        index._dropped = int(header["dropped"])
        index.forwards = int(header["forwards"])
        index.builds = int(header["builds"])
        index._rank()
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path} is an inconsistent SeekIndex file: {e!r}") from None
    _check_sampled_rows(path, index, model)
    return index


def _check_sampled_rows(path: str, index, model) -> None:
    """Re-ask ``model`` for up to ``CHECK_ROWS`` stored next-token rows, spread over the build order
    (so over depths), in one call: a draft that merely agrees at the root is refused too."""
    ids, rows = index._row_ids[0], index._rows[0]
    if ids.size == 0:
        return
    pick = np.unique(np.linspace(0, ids.size - 1, min(CHECK_ROWS, ids.size)).astype(np.int64))
    toks, lens = index.decode(ids[pick])
    prefixes = np.zeros((bucket_size(pick.size), bucket_size(max(toks.shape[1], 1))), np.int32)
    prefixes[: pick.size, : toks.shape[1]] = toks
    lengths = np.zeros(prefixes.shape[0], np.int32)
    lengths[: pick.size] = lens
    now = np.asarray(model.next_logprobs(prefixes, lengths), np.float64)[: pick.size]
    saved = rows[pick].astype(np.float64)
    width = min(now.shape[1], saved.shape[1])
    kept = np.isfinite(saved[:, :width])  # cut cells were stored as -inf; compare the rest
    if not np.allclose(now[:, :width][kept], saved[:, :width][kept], rtol=0, atol=ROOT_ATOL):
        raise ValueError(f"{path} was built for a different model: its stored next-token tables differ")
