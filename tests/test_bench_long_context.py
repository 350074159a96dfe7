"""The long-context benchmark's --quick run (benchmarks/bench_long_context.py): random GPT-2
checkpoints written in the Hugging Face layout load, every cached row costs one token position
and holds its own positions (never the prompt's), and cached rows match full forwards."""

from __future__ import annotations

import os
import re
import sys

import pytest

pytest.importorskip("safetensors")
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import bench_long_context  # noqa: E402


@pytest.mark.slow
def test_quick_run():
    text = bench_long_context.run(quick=True)
    assert text.startswith("## Pretrained-shaped models at long context")
    part1 = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row[0].strip() for row in part1] == ["4", "64", "100"]
    assert {row[4].strip() for row in part1} == {"1"}  # one token position per cached row
    # bytes per row: the rows' own positions, not the prompt's (8 while rows may be long; 32, the
    # power of two covering the longest, once the 100-token prompt leaves 28 tokens)
    per_row = [int(row[6].strip().split()[0].replace(",", "")) for row in part1]
    assert per_row[0] == per_row[1] and per_row[2] == 4 * per_row[0], per_row
    worst = float(re.search(r"full forward to (\S+) \(float32 noise\)", text).group(1))
    assert worst < 1e-4
    assert "| target (gpt2 shape) |" in text and "| draft (distilgpt2 shape) |" in text
