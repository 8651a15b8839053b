"""One workshop day: lesson 00, the README and the slides show the schedule of ``zarrtorch.course.lessons.DAY``.

The three tables (lesson 00's "Schedule of the workshop day" cell, the README's "Workshop schedule" section,
the deck's "The day" slide) are parsed into (start, end, notebook) rows and must equal :data:`DAY`; the block
names may be worded differently. The day runs 09:00-17:30 in one unbroken sequence of blocks; every notebook in
``notebooks/`` is either on the day's path or in the block after it, which the README and lesson 00 list too;
each lesson's block is at least the time the lesson states ("about N minutes" in its first cell) and the
duration the README's outline gives it. Lesson 00 names the notebooks after the day by file name and points
at the reference pages in ``docs/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from zarrtorch.course.lessons import AFTER_THE_DAY, DAY, optional_notebooks, slot_minutes

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
ROW = re.compile(r"^\|\s*(\d\d:\d\d)\s*-\s*(\d\d:\d\d)\s*\|([^|]*)\|\s*([^|]*?)\s*\|\s*$")
EXPECTED = [(b.start, b.end, b.notebook) for b in DAY]


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
    return {"lesson 00": rows(lesson00[0]), "README": rows(readme), "slides": rows(deck)}


def test_lesson_00_readme_and_slides_show_the_day():
    for where, table in schedules().items():
        assert table == EXPECTED, f"{where}'s schedule differs from zarrtorch.course.lessons.DAY:\n{table}"


def test_the_day_fits_9_to_17_30_without_gaps():
    assert DAY[0].start == "09:00" and DAY[-1].end == "17:30"
    for before, after in zip(DAY, DAY[1:], strict=False):
        assert before.end == after.start, f"a gap or an overlap between {before} and {after}"
    assert all(b.minutes > 0 for b in DAY)
    breaks = [b for b in DAY if not b.notebook and b.what in ("break", "lunch")]
    assert len(breaks) == 3, "two breaks and lunch"


def test_every_notebook_is_on_the_path_or_after_the_day():
    on_path = [b.notebook for b in DAY if b.notebook]
    after = [n for n, _, _ in AFTER_THE_DAY]
    present = sorted(p.name.split("_")[0] for p in NOTEBOOKS.glob("*.ipynb"))
    assert sorted(on_path + after) == present, f"path {on_path} + after the day {after}; notebooks/ holds {present}"
    readme_after = section((ROOT / "README.md").read_text(encoding="utf-8"), "## After the day")
    lesson00 = "\n".join(notebook_markdown("00_index.ipynb"))
    for number, _, minutes in AFTER_THE_DAY:
        assert re.search(rf"\b{number}\b.*\b{minutes} min", readme_after), (
            f"{number} in the README's block after the day"
        )
    for path in optional_notebooks(ROOT):
        assert path.name in lesson00, f"lesson 00 names the notebook {path.name} (after the day) by its file name"
    assert "../docs/README.md" in lesson00, "lesson 00 points at the reference pages (docs/README.md)"


def test_each_block_holds_its_lesson():
    stated = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        first = notebook_markdown(path.name)[0]
        m = re.search(r"\*\*Time\*\*:?\s*about (\d+) minutes", first)
        if m:
            stated[path.name.split("_")[0]] = int(m.group(1))
    assert set(stated) >= {b.notebook for b in DAY if b.notebook} - {"00"}, f"lessons stating their time: {stated}"
    short = {nb: (slot_minutes(nb), t) for nb, t in stated.items() if slot_minutes(nb) < t}
    assert not short, f"blocks shorter than the lesson says it takes (block, lesson minutes): {short}"


def test_blocks_match_the_readme_outline_durations():
    outline = section((ROOT / "README.md").read_text(encoding="utf-8"), "## Course outline")
    durations = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^\| \[`(\w\w)_[^`]*`\].*\| (\d+) min \|$", outline, re.M)
    }
    assert set(durations) == {b.notebook for b in DAY if b.notebook} | {n for n, _, _ in AFTER_THE_DAY}, durations
    for nb, duration in durations.items():
        assert slot_minutes(nb) == duration, f"{nb}: {slot_minutes(nb)} min in the schedule, {duration} in the outline"
