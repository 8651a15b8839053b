"""One workshop schedule (issue 26, item 5): lesson 00, the README and the slides show the same day.

The three tables (lesson 00's "Schedule of the workshop day" cell, the README's "Workshop schedule" section,
the deck's "The day" slide) are parsed into (start, end, notebook) rows and must be equal; the block names may
be worded differently. The day must list every notebook in ``notebooks/`` (00-08, A1 and A2), in one unbroken
sequence of times; each lesson's block must be at least the time the lesson itself states ("about N minutes"
in its first cell), and as long as the duration the README's outline gives it (at least as long for 00,
whose block also holds the welcome).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
ROW = re.compile(r"^\|\s*(\d\d:\d\d)\s*-\s*(\d\d:\d\d)\s*\|([^|]*)\|\s*([^|]*?)\s*\|\s*$")


def rows(markdown: str) -> list[tuple[str, str, str]]:
    """(start, end, notebook) for each row of the first schedule table in ``markdown``; '' for breaks."""
    out = []
    for line in markdown.splitlines():
        m = ROW.match(line.strip())
        if m:
            out.append((m.group(1), m.group(2), m.group(4)))
        elif out:
            break  # the table ended
    return out


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = re.search(r"^#{1,2} ", text[start + len(heading) :], re.M)
    return text[start : start + len(heading) + (nxt.start() if nxt else len(text))]


def notebook_markdown(name: str) -> list[str]:
    cells = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def schedules() -> dict[str, list[tuple[str, str, str]]]:
    lesson00 = [cell for cell in notebook_markdown("00_index.ipynb") if cell.startswith("## Schedule")]
    assert len(lesson00) == 1, "lesson 00 should have one '## Schedule ...' cell"
    readme = section((ROOT / "README.md").read_text(encoding="utf-8"), "## Workshop schedule")
    deck = section((ROOT / "slides" / "workshop.md").read_text(encoding="utf-8"), "## The day")
    found = {"lesson 00": rows(lesson00[0]), "README": rows(readme), "slides": rows(deck)}
    for where, table in found.items():
        assert len(table) >= 10, f"no schedule table found in {where}: {table}"
    return found


def minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return 60 * int(h) + int(m)


def slots() -> dict[str, int]:
    """Minutes of each notebook's block, from the README's schedule."""
    return {nb: minutes(end) - minutes(start) for start, end, nb in schedules()["README"] if nb}


def test_lesson_00_readme_and_slides_show_one_schedule():
    found = schedules()
    reference = found["README"]
    for where, table in found.items():
        assert table == reference, f"{where}'s schedule differs from the README's:\n{table}\n{reference}"


def test_the_day_lists_every_notebook_once_in_unbroken_time():
    table = schedules()["README"]
    listed = [nb for _, _, nb in table if nb]
    present = sorted(p.name.split("_")[0] for p in NOTEBOOKS.glob("*.ipynb"))
    assert sorted(listed) == present, f"the schedule lists {listed}; notebooks/ holds {present}"
    assert {"07", "08", "A1", "A2"} <= set(listed)
    for (_, end, _), (start, _, _) in zip(table, table[1:], strict=False):
        assert end == start, f"a gap or an overlap between {end} and {start}: {table}"
    assert all(minutes(end) > minutes(start) for start, end, _ in table), table


def test_each_block_holds_its_lesson():
    stated = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        first = notebook_markdown(path.name)[0]
        m = re.search(r"\*\*Time\*\*:?\s*about (\d+) minutes", first)
        if m:
            stated[path.name.split("_")[0]] = int(m.group(1))
    assert len(stated) >= 10, f"lessons stating their time: {stated}"  # 01-08, A1 and A2
    have = slots()
    short = {nb: (have[nb], t) for nb, t in stated.items() if have.get(nb, 0) < t}
    assert not short, f"blocks shorter than the lesson says it takes (block, lesson minutes): {short}"


def test_blocks_match_the_readme_outline_durations():
    outline = section((ROOT / "README.md").read_text(encoding="utf-8"), "## Course outline")
    durations = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^\| \[`(\w\w)_[^`]*`\].*\| (\d+) min \|$", outline, re.M)
    }
    assert len(durations) >= 8, durations
    have = slots()
    for nb, duration in durations.items():
        if nb == "00":
            assert have[nb] >= duration, (nb, have[nb], duration)
        else:
            assert have[nb] == duration, f"{nb}: {have[nb]} min in the schedule, {duration} min in the outline"
