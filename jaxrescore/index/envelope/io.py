"""Saving and loading an AREnvelopeIndex: one versioned ``.npz`` file with a checksum, written atomically.

The file holds a JSON header (format, version, quantizer, the model's vocab_size/eos/max_len, the
calibration settings and a SHA-256 over header and arrays) and the arrays of the envelope (per-depth
bucket histograms and sizes) plus up to ``CHECK_ROWS`` calibration contexts with their next-token
rows. Loading refuses, with a ValueError naming the file and saying why, a file that is unreadable,
truncated, of another format or version, whose checksum does not match, or that was built for a model
with another vocab_size, eos or max_len, or whose stored rows the model no longer reproduces (all
re-evaluated in one model call). The suffix tables are rebuilt from the envelope on load.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from jaxrescore.files import checksum as _checksum
from jaxrescore.files import not_this_kind, write_npz_atomic
from jaxrescore.quantize import Quantizer

FORMAT = "jaxrescore.AREnvelopeIndex"
VERSION = 1
# Stored rows agree if every finite log-prob matches within this (float32 forwards on other hardware).
ROW_ATOL = 1e-4


def save_envelope(ix, path) -> None:
    """Write ``ix`` to ``path``: temp file in the same folder, fsync, then ``os.replace``."""
    path = os.fspath(path)
    L = ix.max_len
    ctx = np.zeros((len(ix._checks), L), np.int32)
    for i, (p, _) in enumerate(ix._checks):
        ctx[i, : p.size] = p
    width = max(r.size for _, r in ix._checks)
    arrays = {
        "body": ix._body, "eos": ix._eosh, "n_body": ix._n_body, "n_eos": ix._n_eos,
        "check_tokens": ctx,
        "check_lengths": np.array([p.size for p, _ in ix._checks], np.int32),
        "check_rows": np.array([np.pad(r, (0, width - r.size), constant_values=-np.inf) for _, r in ix._checks]),
    }
    header = {
        "format": FORMAT, "version": VERSION,
        "quantizer": [ix.quantizer.bin_width_bits, ix.quantizer.oversample],
        "model": {"vocab_size": ix.vocab_size, "eos": ix.eos, "max_len": ix.max_len},
        "n_paths": ix.n_paths, "seed": ix.seed, "max_depth_bits": ix.max_depth_bits,
        "calibrated_on": ix.calibrated_on, "forwards": ix.forwards, "lookahead": ix.lookahead,
    }
    header["checksum"] = _checksum(header, arrays)
    write_npz_atomic(path, {"header": np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays},
                     prefix=".envelope-")


def load_envelope(cls, path, model, *, progress=None, chunk_rows=4096):
    """Rebuild a ``cls`` (AREnvelopeIndex) from ``path`` for ``model`` (see the module docstring)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no AREnvelopeIndex file at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop("header").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise ValueError(
            not_this_kind(path, FORMAT) or f"{path} is not a readable AREnvelopeIndex file (corrupted or truncated): {e}"
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else None
        raise ValueError(not_this_kind(path, FORMAT) or f"{path} is not an AREnvelopeIndex file (format {got!r})")
    if header.get("version") != VERSION:
        raise ValueError(f"{path} has AREnvelopeIndex format version {header.get('version')!r}; this reads {VERSION}")
    if header.pop("checksum", None) != _checksum(header, arrays):
        raise ValueError(f"{path} failed its checksum: the file is corrupted")
    ix = cls.__new__(cls)
    try:
        ix._setup(model, Quantizer(*header["quantizer"]), header["max_depth_bits"], progress, chunk_rows)
        for key, saved in header["model"].items():
            grows = key == "vocab_size" and ix._vocab_inferred and getattr(ix, key) <= saved
            if getattr(ix, key) != saved and not grows:  # an inferred vocabulary may not have grown yet
                raise ValueError(
                    f"{path} was built for a model with {key}={saved!r}, this model has {getattr(ix, key)!r}"
                )
        ix.n_paths, ix.seed, ix.calibrated_on = header["n_paths"], header["seed"], header["calibrated_on"]
        ix.forwards, ix.lookahead = int(header["forwards"]), bool(header["lookahead"])
        ix._body, ix._eosh = arrays["body"], arrays["eos"]
        ix._n_body, ix._n_eos = arrays["n_body"], arrays["n_eos"]
        shape = (ix.max_len, ix._M)
        if ix._body.shape != shape or ix._eosh.shape != shape or ix._n_body.shape != shape[:1]:
            raise KeyError(f"envelope arrays of shape {ix._body.shape}, expected {shape}")
        lens, toks, saved_rows = arrays["check_lengths"], arrays["check_tokens"], arrays["check_rows"]
        ix._checks = [(toks[i, : lens[i]], saved_rows[i]) for i in range(lens.size)]
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path} is an inconsistent AREnvelopeIndex file: {e!r}") from None
    before = ix.forwards
    now = ix._fetch(toks, lens).astype(np.float64)
    ix.forwards = before
    w = min(now.shape[1], saved_rows.shape[1])
    a, b = now[:, :w], saved_rows[:, :w].astype(np.float64)
    same = np.array_equal(np.isfinite(a), np.isfinite(b)) and np.allclose(
        a[np.isfinite(a)], b[np.isfinite(b)], rtol=0, atol=ROW_ATOL)
    if not same:
        raise ValueError(f"{path} was built for a different model: its next-token rows at the stored contexts differ")
    ix._root_row = saved_rows[0]
    ix._build()
    return ix
