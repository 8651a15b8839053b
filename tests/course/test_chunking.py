"""The course's one chunk-length rule (zarrtorch.course.chunking): the shortest chunk that holds the storage's
floor of bytes and passes the ceilings (pieces per reader, buffer memory, with windows the halo's re-read);
below the floor when a ceiling says so; an error naming what to change when no length passes. Lessons 01 and 08
both take their chunk length from it (issue 45: lesson 01 advised a few MiB, lesson 08's calculator 0.09 MiB)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import zarrtorch as zt
from zarrtorch.course import chunking
from zarrtorch.course.chunking import MAX_REREAD, MIN_CHUNK_BYTES, MiB, suggest_chunk_rows

ROOT = Path(__file__).resolve().parents[2]
KiB = 2**10


@pytest.mark.parametrize("storage", ["local", "object"])
@pytest.mark.parametrize("row_bytes", [1, 1000, 40 * KiB, 88 * KiB, 640 * KiB, 3 * MiB])
def test_with_room_to_spare_the_length_is_the_shortest_that_holds_the_floor(storage, row_bytes):
    advice = suggest_chunk_rows(row_bytes, 10**9, storage=storage, memory_bytes=2**50)
    floor = MIN_CHUNK_BYTES[storage]
    assert advice.chunk_bytes >= floor and (advice.rows - 1) * row_bytes < floor
    assert advice.rows == advice.floor_rows and advice.fails() == []
    assert "the shortest chunk of at least" in advice.reason


def test_object_storage_asks_for_longer_chunks_than_a_file_system():
    assert MIN_CHUNK_BYTES["object"] > MIN_CHUNK_BYTES["local"]
    for row_bytes in (1000, 40 * KiB, 640 * KiB):
        local = suggest_chunk_rows(row_bytes, 10**6, memory_bytes=2**40)
        remote = suggest_chunk_rows(row_bytes, 10**6, memory_bytes=2**40, storage="object")
        assert remote.rows >= local.rows


@pytest.mark.parametrize(
    ("rows", "ranks", "workers", "buffer_chunks"), [(1460, 2, 2, 8), (18_980, 16, 4, 8), (500, 1, 0, 4)]
)
def test_the_readers_ceiling_wins_over_the_floor(rows, ranks, workers, buffer_chunks):
    """Too few rows for the floor's chunks: the longest length that still gives every reader buffer_chunks whole
    chunks, which is rows // (readers x buffer_chunks)."""
    readers = ranks * max(1, workers)
    advice = suggest_chunk_rows(
        40 * KiB, rows, ranks=ranks, workers=workers, buffer_chunks=buffer_chunks, storage="object"
    )
    longest = rows // (readers * buffer_chunks)
    assert advice.rows == min(longest, advice.floor_rows)
    if longest < advice.floor_rows:
        assert "readers" in advice.fails(advice.floor_rows) and "readers" in advice.fails(advice.rows + 1)
        assert advice.reason.split(":")[1].strip().startswith("below the 8 MiB")
    assert advice.measures()["whole_pieces"] >= readers * buffer_chunks


def test_the_memory_ceiling_bounds_the_buffer():
    row_bytes, memory = 640 * KiB, 64 * MiB
    advice = suggest_chunk_rows(row_bytes, 10**6, buffer_chunks=8, memory_bytes=memory, storage="object")
    assert advice.buffer_chunks * advice.chunk_bytes <= memory
    assert "memory" in advice.fails(advice.rows + 1) and advice.rows < advice.floor_rows
    assert "buffer of 8 chunks hold more than 64 MiB" in advice.reason


def test_a_buffer_of_one_row_that_does_not_fit_is_refused_with_what_to_change():
    with pytest.raises(ValueError, match="no chunk length fits.*more than 1 MiB.*more memory_bytes"):
        suggest_chunk_rows(1 * MiB, 1000, buffer_chunks=8, memory_bytes=1 * MiB)


def test_fewer_rows_than_the_floor_holds_still_gives_every_reader_its_chunks():
    advice = suggest_chunk_rows(1000, 100, workers=2)  # 100 kB of rows in all
    assert advice.floor_rows == 100 and advice.rows == 100 // (2 * 8)
    assert suggest_chunk_rows(1000, 100, buffer_chunks=0).rows == 100  # no buffer: one piece per reader is enough


WINDOWS = zt.Windows(history=2, lead=4)  # a span of 6 rows: a halo of 5


def test_with_windows_the_pieces_are_the_packages_blocks_and_the_halo_counts():
    rows = 2924  # two years of 6-hourly steps, as lesson 08's training period
    advice = suggest_chunk_rows(88 * KiB, rows, workers=2, windows=WINDOWS)
    starts = rows - (WINDOWS.span - 1)
    m = advice.measures()
    assert advice.samples == starts and m["piece_rows"] == WINDOWS.block_rows(advice.rows, starts=starts)
    assert m["whole_pieces"] >= 2 * 8 and m["reread"] <= MAX_REREAD
    assert m["reread"] == math.ceil(5 / advice.rows) * advice.rows / m["piece_rows"]
    assert "blocks" in advice.reason


def test_with_windows_the_default_blocks_keep_the_halo_small_and_the_readers_decide():
    """Chunks of 22.5 KiB: the package's default blocks hold 20 times the chunks the halo reaches into, so the
    halo's share never breaks the ceiling; at the floor (47 rows) the blocks are too few for 2 readers x 8, and
    the rule goes below the floor. Blocks of 3 chunks set by hand (the default at the floor when blocks counted
    the halo in rows: a third of each read twice) meet the halo's ceiling at every length, and the rule says so."""
    advice = suggest_chunk_rows(22_528, 2924, workers=2, windows=WINDOWS)
    assert advice.floor_rows == 47 and advice.fails(47) == ["readers"]
    assert advice.rows < 47 and advice.fails() == [] and advice.measures()["reread"] <= 1 / 20
    assert not any("reread" in advice.fails(c) for c in range(1, 48))
    with pytest.raises(ValueError, match="halo reach into more than 25% of the block"):
        suggest_chunk_rows(22_528, 2924, workers=2, windows=zt.Windows(history=2, lead=4, block_chunks=3))


def test_with_windows_too_many_readers_for_the_period_is_refused_and_shorter_blocks_fix_it():
    with pytest.raises(ValueError, match=r"fewer than 8 blocks.*Windows\(block_chunks=\.\.\.\)"):
        suggest_chunk_rows(88 * KiB, 2924, ranks=2, workers=2, windows=WINDOWS)
    shorter = zt.Windows(history=2, lead=4, block_chunks=6)
    advice = suggest_chunk_rows(88 * KiB, 2924, ranks=2, workers=2, windows=shorter)
    assert advice.fails() == [] and advice.measures()["piece_rows"] == 6 * advice.rows


def test_windows_longer_than_the_period_are_refused():
    with pytest.raises(ValueError, match="no window"):
        suggest_chunk_rows(1000, 5, windows=WINDOWS)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"storage": "s3"}, "storage='s3'"),
        ({"ranks": 0}, "ranks=0"),
        ({"workers": 1.5}, "workers=1.5"),
        ({"memory_bytes": 0}, "memory_bytes=0"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        suggest_chunk_rows(1000, 1000, **kwargs)


def test_a_length_is_judged_the_same_way_whatever_was_advised():
    """The advice keeps its job: any other length (the store's own) is checked by the same ceilings."""
    advice = suggest_chunk_rows(40 * KiB, 18_980, workers=2)
    assert advice.fails(64) == [] and advice.fails(18_980 // 16 + 1) == ["readers"]
    with pytest.raises(ValueError, match="at least 1"):
        advice.measures(0)


def _code(notebook: str) -> str:
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("notebook", ["01_prepare_first_axis_chunks.ipynb", "08_your_own_data.ipynb"])
def test_lessons_01_and_08_take_their_chunk_length_from_the_one_rule(notebook):
    code = _code(notebook)
    assert "suggest_chunk_rows(" in code, f"{notebook} does not call zarrtorch.course.chunking.suggest_chunk_rows"
    assert "calculator" not in code  # the lesson's own chunk calculator (issue 45) is gone
    assert chunking.suggest_chunk_rows is suggest_chunk_rows
