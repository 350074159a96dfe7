"""Saving and loading a SeekIndex's settings and state: one versioned ``.npz`` file with a checksum,
written atomically.

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
:mod:`jaxrescore.index.seek.rows`) beside the whole rows (``row_ids``, ``rows``), and the header's
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

from jaxrescore._checks import check_int
from jaxrescore.files import checksum as _checksum
from jaxrescore.files import not_this_kind, write_npz_atomic
from jaxrescore.index.seek.build import frontier_from_rows
from jaxrescore.index.seek.counts import as_upper
from jaxrescore.index.seek.limits import IndexLimitError
from jaxrescore.index.seek.order import rank
from jaxrescore.index.seek.rows import RowChunk, consolidate
from jaxrescore.index.seek.settings import SeekSettings, check_max_bytes, make_settings, max_budget
from jaxrescore.index.seek.state import SeekState, empty_state, export_nodes, nodes_from_columns, with_chunks
from jaxrescore.index.seek.tree import decode
from jaxrescore.quantize import NO_BUCKET, Quantizer
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


def save_state(cfg: SeekSettings, state: SeekState, path) -> None:
    """Write an index's settings and state to ``path`` (temp file in the same folder, then
    ``os.replace``)."""
    path = os.fspath(path)
    nodes = export_nodes(state.nodes)
    chunks = consolidate(state.chunks)
    dense = [c for c in chunks if not c.sparse]
    sparse = [c for c in chunks if c.sparse]
    arrays = {f"node_{k}": v for k, v in nodes.items()}
    arrays["row_ids"] = dense[0].ids if dense else np.zeros(0, np.int64)
    arrays["rows"] = dense[0].dense if dense else np.zeros((0, 0), np.float32)
    if sparse:
        c = sparse[0]
        arrays.update(sparse_ids=c.ids, sparse_ptr=c.ptr, sparse_tok=c.tok, sparse_val=c.val, sparse_rest=c.rest)
    arrays["root_row"] = state.root_row if state.root_row is not None else np.zeros(0, np.float32)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "quantizer": [cfg.quantizer.bin_width_bits, cfg.quantizer.oversample],
        "model": _model_meta(cfg.model),
        "branch_cap": cfg.branch_cap,
        "max_depth_bits": cfg.max_depth_bits,
        "budget": state.budget,
        "frontier_min": state.frontier_min,
        "cut_min": state.cut_min,
        "length_cut_min": state.length_cut_min,
        "dropped": _dropped_text(state.dropped),
        "forwards": state.forwards,
        "builds": state.builds,
        "row_storage": cfg.row_storage,
    }
    header["checksum"] = _checksum(header, arrays)
    write_npz_atomic(path, {"header": np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays},
                     prefix=".seekindex-")


def _dropped_text(dropped: int | float) -> str:
    """``dropped`` as header text: an exact int (below 2**63) or a float's repr ('inf' included)."""
    return str(dropped) if isinstance(dropped, int) else repr(float(dropped))


def _dropped_value(text) -> int | float:
    """The inverse of :func:`_dropped_text`; a version-2 int of any size becomes an upper bound."""
    # TypeError: load_state reports it as an inconsistent file
    if not isinstance(text, str):
        raise TypeError(f"dropped must be text, got {text!r}")
    if text.isdigit():
        return as_upper(int(text))
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
        if isinstance(e, IndexLimitError):
            raise
        raise ValueError(
            not_this_kind(path, FORMAT) or f"{path} is not a readable SeekIndex file (corrupted or truncated): {e}"
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else None
        raise ValueError(not_this_kind(path, FORMAT) or f"{path} is not a SeekIndex file (format {got!r})")
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


def _check_size(path: str, z, max_bytes: int) -> None:
    """Refuse, before reading any array, a file whose arrays alone exceed ``max_bytes``."""
    size = sum(info.file_size for info in z.zip.infolist())
    if size > max_bytes:
        raise IndexLimitError(
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


def load_state(path, model, *, progress=None, chunk_rows=4096, max_nodes=None, max_bytes=None,
               decode_cache_bytes=None) -> tuple[SeekSettings, SeekState]:
    """The settings and state saved at ``path``, for ``model`` (see ``SeekIndex.load``)."""
    path = os.fspath(path)
    max_nodes = check_int(max_nodes, "max_nodes", minimum=1, allow_none=True)
    max_bytes = check_max_bytes(max_bytes)
    header, arrays = _read(path, max_bytes)
    try:
        quantizer = Quantizer(*header["quantizer"])
        _check_model(path, header, arrays["root_row"], model)
        cfg = make_settings(model, quantizer, branch_cap=header["branch_cap"], max_depth_bits=header["max_depth_bits"],
                            progress=progress, chunk_rows=chunk_rows, max_nodes=max_nodes, max_bytes=max_bytes,
                            decode_cache_bytes=decode_cache_bytes,
                            row_storage=header.get("row_storage", "auto"))  # version 3 and older: "auto"
        nodes = nodes_from_columns({k[5:]: v for k, v in arrays.items() if k.startswith("node_")})
        if max_nodes is not None and nodes.n > max_nodes:
            raise IndexLimitError(
                f"SeekIndex.load({path!r}): it holds {nodes.n:,} prefix-tree nodes, over "
                f"max_nodes={max_nodes:,}. Pass a larger max_nodes to load it."
            )
        chunks = [RowChunk(arrays["row_ids"].astype(np.int64), dense=arrays["rows"].astype(np.float32))]
        if "sparse_ids" in arrays:
            chunks.append(RowChunk(
                arrays["sparse_ids"].astype(np.int64), ptr=arrays["sparse_ptr"].astype(np.int64),
                tok=arrays["sparse_tok"].astype(np.int32), val=arrays["sparse_val"].astype(np.float32),
                rest=arrays["sparse_rest"].astype(np.float32),
            ))
            if chunks[1].ptr.shape != (chunks[1].size + 1,) or int(chunks[1].ptr[-1]) != chunks[1].tok.size:
                raise IndexError("sparse rows with inconsistent offsets")
        state = with_chunks(empty_state(), chunks)._replace(
            nodes=nodes,
            root_row=arrays["root_row"] if arrays["root_row"].size else None,
            budget=int(header["budget"]),
            frontier_min=int(header["frontier_min"]),
            cut_min=int(header["cut_min"]),
            length_cut_min=int(header["length_cut_min"]),
            dropped=_dropped_value(header["dropped"]),
            forwards=int(header["forwards"]),
            builds=int(header["builds"]),
        )
        state = rank(_checked_buckets(path, header, cfg, state))
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path} is an inconsistent SeekIndex file: {e!r}") from None
    _check_sampled_rows(path, state, model)
    return cfg, state


def _checked_buckets(path: str, header: dict, cfg: SeekSettings, state: SeekState) -> SeekState:
    """Bucket values in range; a version-2 file gets its frontier recomputed from the kept rows.

    Version 2 summed unsaturated step buckets: a step below about -1e18 nats overflowed int64 (a
    negative bucket: refused, as its order is wrong) and one near -1e17 nats could pass for "no
    bucket", hiding a child beyond the budget (recomputing the frontier restores it)."""
    fb = state.nodes.fb
    values = [state.frontier_min, state.cut_min, state.length_cut_min]
    if (fb.size and (fb.min() < 0 or fb.max() > max(state.budget, 0))) or min(values) < 0 or max(values) > NO_BUCKET:
        raise ValueError(
            f"{path} holds bucket values out of range (a negative or oversized fine bucket): it was written "
            "by a version whose bucket arithmetic overflowed on log-probs far below -1e17, or it is damaged; "
            "rebuild the index"
        )
    if state.budget > max_budget(cfg):
        raise ValueError(f"{path} is an inconsistent SeekIndex file: budget beyond its max_depth_bits")
    if header["version"] == PREVIOUS:
        if state.dropped and state.cut_min >= NO_BUCKET:
            raise ValueError(
                f"{path} reports branch_cap drops without their bucket (a version-2 overflow); rebuild the index"
            )
        state = state._replace(frontier_min=frontier_from_rows(cfg, state))
    return state


def _check_sampled_rows(path: str, state: SeekState, model) -> None:
    """Re-ask ``model`` for up to ``CHECK_ROWS`` stored next-token rows, spread over the build order
    (so over depths), in one call: a draft that merely agrees at the root is refused too."""
    for chunk in state.chunks:
        _check_chunk(path, state, model, chunk)


def _check_chunk(path: str, state: SeekState, model, chunk) -> None:
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
    toks, lens = decode(state.nodes, ids[pick])
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
