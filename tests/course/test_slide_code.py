"""Every code block of the workshop deck runs, or is checked against what it quotes (issue 26, item 5).

The deck's fenced blocks (``slides/workshop.md``), by language:

- ``python``: run, in deck order, each in a namespace of its own (one interpreter for all: a block that uses a
  name it does not import or define fails as it would alone; an interpreter each cost seconds of imports), in a
  temporary folder laid out as the deck
  assumes: the blocks say ``data/small/`` (the course's default size), and there ``data/small/archive.zarr`` is
  a link to the tiny archive, so that the first block (lesson 01's ``prepare_zarr``) writes
  ``data/small/train.zarr`` from it and the later blocks read that. A line ``print(...)  # -> X`` states what it
  prints: the test compares the printed line with ``X``.
- ``bash``: the Slurm template's excerpt cannot run here (no Slurm). It is a placeholder filled by
  ``slides/figures.py`` from ``slurm/generic_multinode.sbatch``: the test checks that every ``#SBATCH`` line it
  shows is the template's, and that every flag its ``srun ... python -m zarrtorch train`` line passes is one
  ``python -m zarrtorch train --help`` lists (``tests/course/test_slurm_jobs.py`` runs the template itself
  with srun stand-ins).
- ``text``: an output, not code: it must be a placeholder the build computes (the layout check's message).

Shell commands quoted inline (``make X``, ``python -m zarrtorch CMD --flag``, ``torchrun --flag``) are checked
for the make target, the command and each flag, not run. Two more claims of the deck are checked against the
package: the memory formula on its memory slide against ``worker_memory_bytes`` (from disk and by URL, where
requests in flight differ from ``decode_threads + 1``), and gloo's error messages it quotes against the
outputs committed in the notebooks.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from zarrtorch import cli

ROOT = Path(__file__).resolve().parents[2]
DECK = ROOT / "slides" / "workshop.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
CLAIM = re.compile(r"^\s*print\(.*\)\s+# -> (.+)$")

pytestmark = pytest.mark.slow  # the python blocks train a model and stream the data: about a minute on 2 cores


def blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in FENCE.findall(DECK.read_text(encoding="utf-8"))]


def python_blocks() -> list[str]:
    return [body for lang, body in blocks() if lang == "python"]


def test_every_block_has_a_known_language():
    found = blocks()
    assert len(found) >= 7, found  # 01, 04, 05-06, 07, A1, the layout check, the Slurm excerpt
    languages = {lang for lang, _ in found}
    assert languages <= {"python", "bash", "text"}, f"a block this test does not know how to check: {languages}"
    for lang, body in found:
        if lang == "text":
            assert PLACEHOLDER.search(body), f"a text block that the build does not compute: {body!r}"
        if lang == "python":
            assert not PLACEHOLDER.search(body), f"a python block with a placeholder cannot run as shown: {body!r}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder laid out as the deck assumes: data/small/archive.zarr is the tiny archive (a link)."""
    from zarrtorch.course import paths
    from zarrtorch.course.synthetic import ensure_data

    ensure_data("tiny")
    work = tmp_path_factory.mktemp("slide-code")
    (work / "data" / "small").mkdir(parents=True)
    (work / "data" / "small" / "archive.zarr").symlink_to(paths.archive_path("tiny"), target_is_directory=True)
    return work


# runs the blocks of the JSON list argv[1], in order, each in a fresh namespace as a script's __main__, printing
# the line argv[2] after each block's output; stops at the first that raises, its traceback on stderr
RUN_BLOCKS = """
import json, sys, traceback
for number, source in enumerate(json.load(open(sys.argv[1])), 1):
    try:
        exec(compile(source, f"<deck block {number}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(number)
    finally:
        sys.stdout.flush()
    print(sys.argv[2], flush=True)
"""
BLOCK_END = "--- zarrtorch deck block ended ---"


def test_python_blocks_run_in_deck_order(workdir):
    sources = python_blocks()
    assert sources[0].find("prepare_zarr(") >= 0, "the first python block should write the training store"
    env = {**os.environ, "ZARRTORCH_SIZE": "tiny", "PYTHONWARNINGS": "ignore"}
    listed = workdir / "blocks.json"
    listed.write_text(json.dumps(sources))
    result = subprocess.run(
        [sys.executable, "-c", RUN_BLOCKS, str(listed), BLOCK_END],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    outputs = result.stdout.split(BLOCK_END + "\n")
    if result.returncode != 0:
        number = result.returncode
        pytest.fail(
            f"python block {number} of the deck failed:\n{sources[number - 1]}\n--- stderr ---\n{result.stderr[-3000:]}"
        )
    assert len(outputs) == len(sources) + 1 and not outputs[-1].strip(), result.stdout[-3000:]
    for number, (source, output) in enumerate(zip(sources, outputs, strict=False), 1):
        claims = [m.group(1).strip() for line in source.splitlines() if (m := CLAIM.match(line))]
        printed = [line.strip() for line in output.splitlines() if line.strip()]
        for claim in claims:
            assert claim in printed, f"block {number} says it prints {claim!r}; it printed {printed}"
    assert (workdir / "data" / "small" / "train.zarr" / "zarr.json").exists()


def test_slurm_excerpt_is_the_template_and_its_flags_exist():
    sys.path.insert(0, str(ROOT / "slides"))
    try:
        import figures
    finally:
        sys.path.remove(str(ROOT / "slides"))
    bash = [body for lang, body in blocks() if lang == "bash"]
    assert [PLACEHOLDER.findall(b) for b in bash] == [["slurm_excerpt"]], bash
    facts = figures.slurm_facts()
    template = (ROOT / facts["slurm_template"]).read_text().splitlines()
    excerpt = facts["slurm_excerpt"].splitlines()
    sbatch = [line for line in excerpt if line.startswith("#SBATCH")]
    assert sbatch and all(line in template for line in sbatch), sbatch
    command = " ".join(line.rstrip("\\").strip() for line in excerpt[excerpt.index("...") + 1 :])
    assert command.startswith("srun ") and "-m zarrtorch train" in command, command
    flags = set(re.findall(r"(?<!\S)(--[a-z][a-z-]*)", command.split("-m zarrtorch train", 1)[1]))
    help_text = zarrtorch_help("train")
    missing = sorted(f for f in flags if f not in help_text)
    assert flags and not missing, f"the slide's srun line passes flags train does not take: {missing}"


@functools.cache
def zarrtorch_help(command: str) -> str:
    """What ``python -m zarrtorch COMMAND --help`` prints, from the same entry point, in this process (a process
    per command would import torch each time)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        cli.main([command, "--help"])
    assert exited.value.code in (0, None), f"python -m zarrtorch {command} --help exited {exited.value.code}"
    return out.getvalue()


def test_inline_commands_exist():
    text = DECK.read_text(encoding="utf-8")
    inline = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    made = {m.group(1) for code in inline for m in re.finditer(r"\bmake ([a-z][a-z-]*)", code)}
    made |= set(re.findall(r"<code>make ([a-z][a-z-]*)</code>", text))
    assert made and made <= targets, f"make targets the deck names that the Makefile lacks: {made - targets}"

    commands = [code for code in inline if "-m zarrtorch " in code]
    assert len(commands) >= 3, commands
    for code in commands:
        name, *rest = code.split("-m zarrtorch ", 1)[1].split()
        flags = [word.split("=")[0] for word in rest if word.startswith("--")]
        help_text = zarrtorch_help(name)
        missing = [f for f in flags if f not in help_text]
        assert not missing, f"`{code}`: python -m zarrtorch {name} has no {missing}"
    torchrun = [code for code in inline if code.startswith("torchrun ")]
    torchrun_help = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    for code in torchrun:
        for flag in (word.split("=")[0] for word in code.split() if word.startswith("--")):
            assert flag in torchrun_help, f"`{code}`: torchrun has no {flag}"


def test_memory_formula_is_the_loaders():
    """The formula the memory slide shows, evaluated with a dataset's own numbers, equals
    ``worker_memory_bytes``: from disk and by URL (where the chunks read ahead are not ``decode_threads + 1``:
    a formula written with decode threads instead fails there)."""
    text = DECK.read_text(encoding="utf-8")
    formulas = re.findall(r"`\(([^`]+)\) x chunk bytes`", text)
    assert len(formulas) == 1, formulas
    expression = formulas[0]
    assert set(re.findall(r"[a-z_]+", expression)) <= {"buffer_chunks", "chunks_read_ahead", "decode_threads"}

    from zarrtorch import ReadPlan, ZarrIterableDataset
    from zarrtorch.course.servers import HttpStoreServer

    sys.path.insert(0, str(ROOT / "slides"))
    try:
        import figures
    finally:
        sys.path.remove(str(ROOT / "slides"))
    checked = []
    with tempfile.TemporaryDirectory() as tmp:
        path = figures._metadata_store(Path(tmp), 16_384, 32, (128, 256))
        with HttpStoreServer(tmp) as server:
            for source in (str(path), f"{server.url}/{path.name}"):
                for buffer_chunks in (2, 8, 32):
                    for threads in (1, 2, 7):
                        ds = ZarrIterableDataset(
                            source,
                            buffer_chunks=buffer_chunks,
                            variables=["fields", "target"],
                            read=figures.METADATA_ONLY,  # no chunk written
                        )
                        names = {
                            "buffer_chunks": buffer_chunks,
                            "chunks_read_ahead": ReadPlan.of(ds, 0, decode_threads=threads).chunks_ahead,
                            "decode_threads": threads,
                        }
                        held = eval(expression, {"__builtins__": {}}, names)  # noqa: S307 (the slide's arithmetic)
                        assert held * ds.chunk_rows * ds.row_bytes == ds.worker_memory_bytes(threads), (
                            source,
                            names,
                        )
                        checked.append(names["chunks_read_ahead"] != threads + 1)
    assert any(checked), "no case where requests in flight differ from decode_threads + 1: the URL case is missing"


def test_quoted_gloo_errors_are_in_the_notebooks_outputs():
    text = DECK.read_text(encoding="utf-8")
    quoted = re.findall(r'"(Connection [^"]+)"', text)
    assert quoted, "the deck quotes no gloo error"
    outputs = ""
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            for out in cell.get("outputs", []):
                outputs += "".join(out.get("text", "")) + json.dumps(out.get("data", {}))
    # which side notices a dead peer first decides between "closed" and "reset": the deck quotes both, and each
    # re-execution of the notebooks may show either, so every quote must be one of them and one must be shown
    unknown = [q for q in quoted if not re.fullmatch(r"Connection (closed|reset) by peer", q)]
    assert not unknown, f"gloo messages the deck quotes that gloo does not print: {unknown}"
    assert any(q in outputs for q in quoted), f"none of the gloo messages the deck quotes is in an output: {quoted}"
