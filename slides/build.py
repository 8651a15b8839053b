"""Build the workshop deck: ``slides/workshop.md`` -> ``slides/build/index.html`` (reveal.js, fully offline).

    make slides                                   # = .venv/bin/python slides/build.py
    .venv/bin/python slides/build.py --out DIR    # build elsewhere (the tests build into a temporary folder)

1. copies the vendored reveal.js (``slides/vendor/reveal.js``, nothing is fetched, no CDN) into the output;
2. runs ``slides/figures.py``: every figure is computed by zarrtorch from the generated data, and every
   number on the slides is measured or computed there (``values.json`` in the output lists them all);
3. fills the ``{{name}}`` placeholders of the Markdown with those values (an unknown name is an error,
   never a blank) and embeds the Markdown in ``index.html``, where reveal.js's Markdown plugin renders it.

Open ``slides/build/index.html`` directly in a browser (or serve the folder: ``python -m http.server -d
slides/build``). Press ``s`` for the speaker notes, ``o`` for the overview, ``?`` for the keys.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "vendor" / "reveal.js"
SOURCE = HERE / "workshop.md"
DEFAULT_OUT = HERE / "build"

SLIDE_SEPARATOR = r"^\r?\n---\r?\n$"
VERTICAL_SEPARATOR = r"^\r?\n--\r?\n$"
NOTES_SEPARATOR = r"^Note:"
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="reveal.js/dist/reset.css">
<link rel="stylesheet" href="reveal.js/dist/reveal.css">
<link rel="stylesheet" href="reveal.js/dist/theme/white.css">
<link rel="stylesheet" href="reveal.js/plugin/highlight/monokai.css">
<style>
.reveal {{ font-size: 30px; }}
.reveal h1 {{ font-size: 2.1em; }}
.reveal h2 {{ font-size: 1.45em; margin-bottom: 0.5em; }}
.reveal h3 {{ font-size: 1.15em; }}
.reveal section img {{ margin: 0.2em auto; border: 0; box-shadow: none; max-height: 430px; }}
.reveal pre {{ font-size: 0.6em; width: 100%; box-shadow: none; }}
.reveal pre code {{ max-height: 460px; padding: 0.6em; }}
.reveal table {{ font-size: 0.72em; }}
.reveal table th, .reveal table td {{ padding: 0.25em 0.6em; }}
.reveal ul, .reveal ol {{ display: block; margin-left: 1.2em; }}
.reveal li {{ margin: 0.15em 0; }}
.reveal :not(pre) > code {{ font-size: 0.85em; }}
.reveal .small {{ font-size: 0.65em; color: #555; }}
.reveal .source {{ font-size: 0.5em; color: #666; margin-top: 0.6em; }}
.reveal .cols {{ display: flex; gap: 1.2em; align-items: flex-start; text-align: left; }}
.reveal .cols > div {{ flex: 1; }}
.reveal blockquote {{ width: 90%; font-size: 0.85em; box-shadow: none; background: #f4f6fa;
  border-left: 6px solid #1f77b4; padding: 0.4em 0.8em; }}
</style>
</head>
<body>
<div class="reveal">
<div class="slides">
<section data-markdown data-separator="{sep}" data-separator-vertical="{vsep}" data-separator-notes="{notes}">
<textarea data-template>
{markdown}
</textarea>
</section>
</div>
</div>
<script src="reveal.js/dist/reveal.js"></script>
<script src="reveal.js/plugin/markdown/markdown.js"></script>
<script src="reveal.js/plugin/highlight/highlight.js"></script>
<script src="reveal.js/plugin/notes/notes.js"></script>
<script>
Reveal.initialize({{
  hash: true,
  width: 1280,
  height: 720,
  margin: 0.04,
  slideNumber: "c/t",
  transition: "none",
  plugins: [RevealMarkdown, RevealHighlight, RevealNotes]
}});
</script>
</body>
</html>
"""


def fill(markdown: str, values: dict) -> str:
    """Replace every ``{{name}}``; raise listing every name that has no value (no silent blanks)."""
    missing = sorted({m for m in PLACEHOLDER.findall(markdown) if m not in values})
    if missing:
        raise KeyError(
            f"slides/workshop.md uses placeholders with no measured value: {', '.join(missing)} "
            "(add them to slides/figures.py)"
        )
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), markdown)


def count_slides(markdown: str) -> int:
    """Slides as reveal's Markdown plugin splits them (horizontal and vertical separators)."""
    return len(re.split(r"\r?\n(?:---|--)\r?\n", markdown.strip()))


def title_of(markdown: str) -> str:
    for line in markdown.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return "zarrtorch workshop"


def build(out: Path = DEFAULT_OUT, *, bench_json: Path | None = None, log=print) -> dict:
    """Build the deck into ``out``; returns a summary (paths, slide count, seconds)."""
    t0 = time.perf_counter()
    out = Path(out)
    if not (VENDOR / "dist" / "reveal.js").exists():
        raise FileNotFoundError(f"{VENDOR} is missing: the deck needs its vendored reveal.js (see VENDORED.md there)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(VENDOR, out / "reveal.js")

    sys.path.insert(0, str(HERE))
    try:
        import figures
    finally:
        sys.path.remove(str(HERE))
    values = figures.make_all(out / "figures", bench_json=bench_json or figures.BENCH_JSON, log=log)
    markdown = fill(SOURCE.read_text(encoding="utf-8"), values)
    for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", markdown):
        if "://" in ref or not (out / ref).is_file():
            raise FileNotFoundError(f"the deck shows {ref!r}, which the build did not produce in {out}")
    (out / "workshop.md").write_text(markdown, encoding="utf-8")
    (out / "values.json").write_text(json.dumps(values, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    page = PAGE.format(
        title=html.escape(title_of(markdown)),
        sep=SLIDE_SEPARATOR,
        vsep=VERTICAL_SEPARATOR,
        notes=NOTES_SEPARATOR,
        markdown=html.escape(markdown, quote=False),
    )
    (out / "index.html").write_text(page, encoding="utf-8")
    seconds = time.perf_counter() - t0
    summary = {
        "index": str(out / "index.html"),
        "slides": count_slides(markdown),
        "figures": values["figures"],
        "seconds": round(seconds, 1),
    }
    log(
        f"[slides] {summary['slides']} slides, {len(values['figures'])} figures -> {out / 'index.html'} "
        f"({seconds:.1f} s)"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default slides/build)")
    p.add_argument(
        "--bench",
        type=Path,
        default=None,
        help="make bench's results to show (default benchmarks/results/latest.json if it exists)",
    )
    a = p.parse_args(argv)
    build(a.out, bench_json=a.bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
