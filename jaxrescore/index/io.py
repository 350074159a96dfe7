"""Saving and loading a SeekIndex: one versioned ``.npz`` file with a checksum, written atomically.

The file holds a JSON header (format, version, quantizer, the model's vocab_size/eos/max_len, the
build state and a SHA-256 over every array) and the arrays of the prefix tree plus the kept
next-token rows, so a loaded index deepens without re-running forwards. Loading refuses, with a
ValueError saying why, a file that is unreadable, truncated, of another format or version, whose
checksum does not match, or that was built for a model with a different vocabulary, eos or max_len,
a different first next-token table, or different tables at up to ``CHECK_ROWS`` stored prefixes
spread over the depths (re-evaluated in one model call). A model that differs only at prefixes
outside that sample still loads: the check is a sample, not a proof.

Versions: this writes version 4 and reads 4, 3 and 2. Version 4 adds the sparse rows of a wide
vocabulary (``sparse_ids``, ``sparse_ptr``, ``sparse_tok``, ``sparse_val``, ``sparse_rest``: see
:mod:`jaxrescore.index.rows`) beside the whole rows (``row_ids``, ``rows``), and the header's
``row_storage`` (older files load as ``"auto"``). In version 3 the header's ``dropped`` (the
``dropped_upper`` bound) is an exact int below 2**63 or the repr of a float upper bound (``inf``
included), so a ``branch_cap`` index over a wide, long model saves (Python cannot print an int past
4,300 digits). A version-2 file gets its frontier recomputed from its kept rows and is refused if it
holds a negative bucket (its bucket arithmetic could overflow on log-probs far below -1e17).

Limits: a file whose arrays take more than ``max_bytes`` (uncompressed sizes, read from the zip
directory) or whose tree has more than ``max_nodes`` nodes raises IndexLimitError before its
arrays are read, or before the index is assembled.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from jaxrescore.files import checksum as _checksum
from jaxrescore.files import write_npz_atomic
from jaxrescore.quantize import Quantizer
from jaxrescore.sequences import bucket_size

FORMAT = "jaxrescore.SeekIndex"
# 2: max_len cuts kept apart from branch_cap drops. 3: "dropped" is an int below 2**63 or a float
# upper bound (it had no size limit and could not be written past 4,300 digits); bucket arithmetic
# that saturates instead of overflowing (see quantize.py), so a version-2 file is re-checked on load.
VERSION = 4
PREVIOUS = 2  # still read (and re-checked)
WHOLE_ROWS = 3  # still read: whole rows only
# Root rows agree if every finite log-prob matches within this (float32 forwards on other hardware).
ROOT_ATOL = 1e-4
# Stored next-token rows re-checked against the model on load.
CHECK_ROWS = 64


def _model_meta(model) -> dict:
    return {"vocab_size": int(model.vocab_size), "eos": model.eos, "max_len": int(model.max_len)}


def save_index(index, path) -> None:
    """Write ``index`` to ``path`` (temp file in the same folder, then ``os.replace``)."""
    path = os.fspath(path)
    nodes = index._nodes.export()
    index._consolidate_rows()
    dense = [c for c in index._chunks if not c.sparse]
    sparse = [c for c in index._chunks if c.sparse]
    arrays = {f"node_{k}": v for k, v in nodes.items()}
    arrays["row_ids"] = dense[0].ids if dense else np.zeros(0, np.int64)
    arrays["rows"] = dense[0].dense if dense else np.zeros((0, 0), np.float32)
    if sparse:
        c = sparse[0]
        arrays.update(sparse_ids=c.ids, sparse_ptr=c.ptr, sparse_tok=c.tok, sparse_val=c.val, sparse_rest=c.rest)
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
        "dropped": _dropped_text(index._dropped),
        "forwards": index.forwards,
        "builds": index.builds,
        "row_storage": index.row_storage,
    }
    header["checksum"] = _checksum(header, arrays)
    write_npz_atomic(path, {"header": np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays},
                     prefix=".seekindex-")


def _dropped_text(dropped: int | float) -> str:
    """``dropped`` as header text: an exact int (below 2**63) or a float's repr ('inf' included)."""
    return str(dropped) if isinstance(dropped, int) else repr(float(dropped))


def _dropped_value(text) -> int | float:
    """The inverse of :func:`_dropped_text`; a version-2 int of any size becomes an upper bound."""
    from jaxrescore.index.seek import _as_upper

    # TypeError: load_index reports it as an inconsistent file
    if not isinstance(text, str):
        raise TypeError(f"dropped must be text, got {text!r}")
    if text.isdigit():
        return _as_upper(int(text))
    try:
        value = float(text)
    except ValueError:
        raise TypeError(f"dropped must be an int or a float, got {text!r}") from None
    if not value >= 0:
        raise TypeError(f"dropped must be >= 0, got {text!r}")
    return value


def _read(path: str, max_bytes: int | None = None) -> tuple[dict, dict]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no SeekIndex file at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if max_bytes is not None:
                _check_size(path, z, max_bytes)
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop("header").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        if isinstance(e, _limit_error()):
            raise
        raise ValueError(f"{path} is not a readable SeekIndex file (corrupted or truncated): {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a SeekIndex file (format {header.get('format')!r})")
    reads = (PREVIOUS, WHOLE_ROWS, VERSION)
    if header.get("version") not in reads:
        raise ValueError(
            f"{path} has SeekIndex format version {header.get('version')!r}; this reads versions "
            f"{', '.join(map(str, reads))}"
        )
    stored = header.pop("checksum", None)
    if stored != _checksum(header, arrays):
        raise ValueError(f"{path} failed its checksum: the file is corrupted")
    return header, arrays


def _limit_error():
    from jaxrescore.index.seek import IndexLimitError

    return IndexLimitError


def _check_size(path: str, z, max_bytes: int) -> None:
    """Refuse, before reading any array, a file whose arrays alone exceed ``max_bytes``."""
    size = sum(info.file_size for info in z.zip.infolist())
    if size > max_bytes:
        raise _limit_error()(
            f"SeekIndex.load({path!r}): its arrays take {size:,} bytes, over max_bytes={max_bytes:,}; "
            "nothing was read. Pass a larger max_bytes to load it."
        )


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


def load_index(cls, path, model, *, progress=None, chunk_rows=4096, max_nodes=None, max_bytes=None,
               decode_cache_bytes=None):
    """Rebuild a ``cls`` (SeekIndex) instance from ``path`` for ``model`` (see ``SeekIndex.load``)."""
    from jaxrescore.index.seek import _limit_arg, _Nodes, default_max_bytes

    path = os.fspath(path)
    max_nodes = _limit_arg(max_nodes, "max_nodes")
    max_bytes = _limit_arg(max_bytes, "max_bytes")
    max_bytes = default_max_bytes() if max_bytes is None else max_bytes
    header, arrays = _read(path, max_bytes)
    try:
        quantizer = Quantizer(*header["quantizer"])
        _check_model(path, header, arrays["root_row"], model)
        index = cls.__new__(cls)
        index._setup(model, quantizer, header["branch_cap"], header["max_depth_bits"], progress, chunk_rows,
                     max_nodes=max_nodes, max_bytes=max_bytes, decode_cache_bytes=decode_cache_bytes,
                     row_storage=header.get("row_storage", "auto"))  # version 3 and older: "auto"
        index._nodes = _Nodes({k[5:]: v for k, v in arrays.items() if k.startswith("node_")})
        if max_nodes is not None and index._nodes.n > max_nodes:
            raise _limit_error()(
                f"SeekIndex.load({path!r}): it holds {index._nodes.n:,} prefix-tree nodes, over "
                f"max_nodes={max_nodes:,}. Pass a larger max_nodes to load it."
            )
        from jaxrescore.index.rows import RowChunk

        chunks = [RowChunk(arrays["row_ids"].astype(np.int64), dense=arrays["rows"].astype(np.float32))]
        if "sparse_ids" in arrays:
            chunks.append(RowChunk(
                arrays["sparse_ids"].astype(np.int64), ptr=arrays["sparse_ptr"].astype(np.int64),
                tok=arrays["sparse_tok"].astype(np.int32), val=arrays["sparse_val"].astype(np.float32),
                rest=arrays["sparse_rest"].astype(np.float32),
            ))
            if chunks[1].ptr.shape != (chunks[1].size + 1,) or int(chunks[1].ptr[-1]) != chunks[1].tok.size:
                raise IndexError("sparse rows with inconsistent offsets")
        index._chunks = [c for c in chunks if c.size]
        index._n_rows = int(sum(c.size for c in index._chunks))
        index._width = max([c.width for c in index._chunks], default=0)
        index._root_row = arrays["root_row"] if arrays["root_row"].size else None
        index._budget = int(header["budget"])
        index._frontier_min = int(header["frontier_min"])
        index._cut_min = int(header["cut_min"])
        index._length_cut_min = int(header["length_cut_min"])
        index._dropped = _dropped_value(header["dropped"])
        index.forwards = int(header["forwards"])
        index.builds = int(header["builds"])
        _check_buckets(path, header, index)
        index._rank()
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path} is an inconsistent SeekIndex file: {e!r}") from None
    _check_sampled_rows(path, index, model)
    return index


def _check_buckets(path: str, header: dict, index) -> None:
    """Bucket values in range; a version-2 file gets its frontier recomputed from the kept rows.

    Version 2 summed unsaturated step buckets: a step below about -1e18 nats overflowed int64 (a
    negative bucket: refused, as its order is wrong) and one near -1e17 nats could pass for "no
    bucket", hiding a child beyond the budget (recomputing the frontier restores it)."""
    from jaxrescore.quantize import NO_BUCKET

    fb = index._nodes.fb
    values = [index._frontier_min, index._cut_min, index._length_cut_min]
    if (fb.size and (fb.min() < 0 or fb.max() > max(index._budget, 0))) or min(values) < 0 or max(values) > NO_BUCKET:
        raise ValueError(
            f"{path} holds bucket values out of range (a negative or oversized fine bucket): it was written "
            "by a version whose bucket arithmetic overflowed on log-probs far below -1e17, or it is damaged; "
            "rebuild the index"
        )
    if index._budget > index._max_budget:
        raise ValueError(f"{path} is an inconsistent SeekIndex file: budget beyond its max_depth_bits")
    if header["version"] == PREVIOUS:
        if index._dropped and index._cut_min >= NO_BUCKET:
            raise ValueError(
                f"{path} reports branch_cap drops without their bucket (a version-2 overflow); rebuild the index"
            )
        index._frontier_min = index._frontier_from_rows()


def _check_sampled_rows(path: str, index, model) -> None:
    """Re-ask ``model`` for up to ``CHECK_ROWS`` stored next-token rows, spread over the build order
    (so over depths), in one call: a draft that merely agrees at the root is refused too."""
    for chunk in index._chunks:
        _check_chunk(path, index, model, chunk)


def _check_chunk(path: str, index, model, chunk) -> None:
    ids = chunk.ids
    if ids.size == 0:
        return
    pick = np.unique(np.linspace(0, ids.size - 1, min(CHECK_ROWS, ids.size)).astype(np.int64))
    if chunk.sparse:  # the kept cells, at their tokens
        mask = np.zeros(ids.size, bool)
        mask[pick] = True
        part = chunk.select(mask)
        r, tok, val = part.all_cells()
        rows = np.full((pick.size, max(part.width, 1)), -np.inf, np.float32)
        rows[r, tok] = val
    else:
        rows = chunk.dense[pick]
    toks, lens = index.decode(ids[pick])
    prefixes = np.zeros((bucket_size(pick.size), bucket_size(max(toks.shape[1], 1))), np.int32)
    prefixes[: pick.size, : toks.shape[1]] = toks
    lengths = np.zeros(prefixes.shape[0], np.int32)
    lengths[: pick.size] = lens
    now = np.asarray(model.next_logprobs(prefixes, lengths), np.float64)[: pick.size]
    saved = rows.astype(np.float64)
    width = min(now.shape[1], saved.shape[1])
    kept = np.isfinite(saved[:, :width])  # cut cells were stored as -inf; compare the rest
    if not np.allclose(now[:, :width][kept], saved[:, :width][kept], rtol=0, atol=ROOT_ATOL):
        raise ValueError(f"{path} was built for a different model: its stored next-token tables differ")
