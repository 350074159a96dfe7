"""How big a decoding session's calls and caches are: few shapes (few compiles) and a byte budget.

See :mod:`jaxrescore.models.decoding` for the session that reads them.
"""

from __future__ import annotations

import os

# Smallest power-of-two length of a row cache and of the context.
MIN_CACHE_LEN = 8
# Few shapes, few compiles: every distinct (rows, fed tokens, cache length, context length) of a
# call is a program to compile, 1.5-4 s each for a 30-layer model on CPU, against a few
# milliseconds per extra position computed. Fed widths are powers of FOUR (1, 4, 16, ...), row
# caches and contexts grow by factors of four (8, 32, 128, ...) up to the longest row the model
# allows, and one-token calls pad to at least ONE_TOKEN_ROWS rows (a call of one position per row
# streams every weight whatever its row count: padding rows there cost almost nothing). On the
# real SmolLM2-135M chat proof (BENCHMARKS.md, "A real pretrained LM") the distinct decoding
# programs went from 71 to 44 with these rules, and to fewer with the two below.
WIDTH_GROWTH = 4
ONE_TOKEN_ROWS = 8
# ... a multi-token call pads to at least this many positions (rows times width), and a model
# whose rows (and one padded block after them) fit SHORT_ROWS_CACHE positions keeps its row
# caches at the power of two covering its longest row (twice that for a wide block).
BLOCK_POSITIONS = 16
SHORT_ROWS_CACHE = 64


def coarse_size(n: int, minimum: int = 1) -> int:
    """The smallest ``minimum * WIDTH_GROWTH**j`` >= ``n`` (``minimum`` a power of two)."""
    size = max(int(minimum), 1)
    while size < n:
        size *= WIDTH_GROWTH
    return size


# The environment variable that sets the default cache budget (bytes), for callers that build
# their sessions themselves (a rescoring search, a prompted model's greedy completion).
CACHE_BYTES_ENV = "JAXRESCORE_DECODE_CACHE_BYTES"


def default_cache_bytes() -> int:
    """The default ``max_bytes`` of a session: ``$JAXRESCORE_DECODE_CACHE_BYTES`` when set, else
    1 GiB, or a sixteenth of physical memory if less (at least 64 MiB)."""
    env = os.environ.get(CACHE_BYTES_ENV)
    if env:
        try:
            return max(int(float(env)), 0)
        except ValueError:
            raise ValueError(f"{CACHE_BYTES_ENV} must be a number of bytes, got {env!r}") from None
    return memory_share(1 << 30, 16)


def shared_cache_bytes(queries: int) -> int:
    """The budget of ONE session serving several queries' rows (several prompts on one base
    model): the loop of single queries it replaces holds one query's caches at a time, each
    session with the default budget; the shared one holds every query's, with as many budgets
    (up to a quarter of the machine's memory)."""
    return memory_share(queries * default_cache_bytes(), 4)


def memory_share(cap: int, part: int) -> int:
    """``cap`` bytes, or ``1/part`` of the machine's physical memory when that is less (at least
    64 MiB); ``cap`` where the memory cannot be read."""
    try:
        phys = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return cap
    return int(min(cap, max(phys // part, 64 << 20)))
