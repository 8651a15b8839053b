"""The reference pages (``docs/``, issue 45): an index that lists every page, and links that lead somewhere.

``docs/README.md`` is the index: every page in ``docs/`` has a row there, and every row's page exists (an HTML
comment is not a row: pages still to come wait there). Every relative link in the pages, and every link from a
notebook to a page in ``docs/``, points at a file of the repository.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def index_problems(folder: Path) -> list[str]:
    """What is wrong with ``folder``'s index (``README.md``): pages it does not list, listed pages that do not exist."""
    index = COMMENT.sub("", (folder / "README.md").read_text(encoding="utf-8"))
    listed = {m for m in LINK.findall(index) if "/" not in m and m.endswith(".md")}
    pages = {p.name for p in folder.glob("*.md") if p.name != "README.md"}
    return [f"{name}: not in the index" for name in sorted(pages - listed)] + [
        f"{name}: listed, but no such page" for name in sorted(listed - pages)
    ]


def broken_links(text: str, base: Path) -> list[str]:
    """Relative links in ``text`` (markdown) that name no file or folder under ``base``."""
    out = []
    for target in LINK.findall(COMMENT.sub("", text)):
        path = target.split("#", 1)[0]
        if not path or re.match(r"^[a-z]+:", path):
            continue  # an anchor on the same page, or a URL
        if not (base / path).exists():
            out.append(target)
    return out


def test_the_index_lists_every_page_and_only_pages_that_exist():
    assert (DOCS / "peers.md").exists()
    assert index_problems(DOCS) == []


def test_the_index_check_notices_a_page_left_out_and_a_row_without_a_page(tmp_path):
    (tmp_path / "README.md").write_text("| [`a.md`](a.md) | a |\n<!-- | [`c.md`](c.md) | coming | -->\n")
    (tmp_path / "a.md").write_text("# a\n")
    assert index_problems(tmp_path) == []
    (tmp_path / "b.md").write_text("# b\n")
    (tmp_path / "a.md").unlink()
    assert index_problems(tmp_path) == ["b.md: not in the index", "a.md: listed, but no such page"]


def test_links_in_the_reference_pages_lead_to_files():
    found = {p.name: broken_links(p.read_text(encoding="utf-8"), DOCS) for p in sorted(DOCS.glob("*.md"))}
    assert not {k: v for k, v in found.items() if v}, found
    assert broken_links("[x](missing.md) [y](#here) [z](https://example.org) [w](peers.md#the-table)", DOCS) == [
        "missing.md"
    ]


def test_notebooks_link_to_reference_pages_that_exist():
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        bad = [t for t in broken_links(text, path.parent) if "docs/" in t]
        if bad:
            found[path.name] = bad
    assert not found, f"links to pages that are not in docs/: {found}"
