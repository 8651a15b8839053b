"""The reference pages lessons 02 and 03 link to (docs/partition.md, docs/windows.md) say what the package does
bit for bit: their code blocks compare a hand-written version with the package and must keep passing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/partition.md", "docs/windows.md"]
FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((ROOT / page).read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES)
def test_the_page_has_code_that_checks_itself(page):
    blocks = python_blocks(page)
    assert len(blocks) >= 2 and all("assert" in b for b in blocks), f"{page}: {len(blocks)} python block(s)"


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_of_the_page_runs(page, monkeypatch):
    monkeypatch.setenv("ZARRTORCH_SIZE", "tiny")
    for i, block in enumerate(python_blocks(page)):
        exec(compile(block, f"{page}[block {i}]", "exec"), {"__name__": f"page_block_{i}"})
