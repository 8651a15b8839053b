"""The lab a learner opens (issue 26, item 8): ``make lab``'s JupyterLab, driven in headless Chromium.

The fixture starts JupyterLab as ``make lab`` does (``python -m jupyter lab`` from the repository's venv, the
notebooks folder as its root), but on 127.0.0.1, a free port, a random token and no browser of its own, with
``ZARRTORCH_SIZE=tiny``; its settings and workspaces live in a temporary folder, with autosave off, so that
running a cell never writes a notebook of the checkout. ``--LabApp.expose_app_in_browser`` gives the page a
``window.jupyterapp`` handle (what JupyterLab's own UI tests use) to wait on the notebook model; cells are run
with the keys a learner presses (Shift+Enter, through the DevTools protocol).

- ``test_lesson_00_environment_check_runs_in_the_zarrtorch_kernel``: lesson 00 opens in the ``zarrtorch``
  kernel (the one every notebook names), and its cells, run from the top down to the environment check's
  cells, print every requirement ``ok``, the tiny data ``ready`` and ``tiny`` as the size in use, with no error.
- ``test_exercise_cells_shown_and_solution_cells_show_only_their_load_line``: in every lesson (01-07, 08, A1)
  each ``exercise``-tagged cell shows its code, and each ``solution``-tagged cell shows its one line,
  ``# %load solutions/NN_exk.py``, and nothing else: the solution is in a file, not in the page.
- ``test_uncommented_load_line_loads_the_solution_into_its_cell``: in the first lesson, a learner deletes the
  ``# `` of the first solution cell and presses Shift+Enter: IPython's ``%load`` reads
  ``notebooks/solutions/NN_ex1.py`` and JupyterLab puts its text into the cell, under the (commented) load line.

The browser is Debian's chromium, launched as ``test_slides.py`` launches it; without one the tests skip,
saying so (``make test`` installs it with ``scripts/install_browser.sh``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_slides import launch_chromium

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "zarrtorch"

pytestmark = pytest.mark.slow  # JupyterLab, a kernel per lesson and a browser: 20-60 s on 2 cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _environment_check_indices() -> list[int]:
    """The code cells under lesson 00's 'Environment check' heading (up to the next markdown cell)."""
    cells = _cells("00_index.ipynb")
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith("## Environment check"):
            found = []
            for j in range(i + 1, len(cells)):
                if cells[j]["cell_type"] != "code":
                    break
                found.append(j)
            assert found, "lesson 00's 'Environment check' has no code cell"
            return found
    raise AssertionError("lesson 00 has no '## Environment check' section")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab as ``make lab`` starts it, on 127.0.0.1; stopped (with its kernels) by the finalizer."""
    from jupyter_client.kernelspec import KernelSpecManager

    from zarrtorch.course.synthetic import ensure_data

    specs = KernelSpecManager().find_kernel_specs()
    assert KERNEL in specs, f"no {KERNEL!r} Jupyter kernel (found {sorted(specs)}): make setup installs it"
    ensure_data("tiny")  # make lab runs make-data first
    home = tmp_path_factory.mktemp("lab")
    settings = home / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "ZARRTORCH_SIZE": "tiny",
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    log = open(home / "lab.log", "wb")  # noqa: SIM115 (closed in the finalizer)
    checkpoints = NOTEBOOKS / ".ipynb_checkpoints"
    had_checkpoints = checkpoints.exists()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",  # containers and CI runners often run as root
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            "--notebook-dir",
            str(NOTEBOOKS),
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.extension_manager=readonly",  # no extension index fetched
            f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}",  # made on opening: not in the checkout
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (home / "lab.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"JupyterLab did not answer on {base} (exit {proc.poll()}); its log ends:\n{tail}")
            time.sleep(0.3)
        yield {"base": base, "token": token}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(home / "runtime", ignore_errors=True)
    assert had_checkpoints or not checkpoints.exists(), f"the lab wrote {checkpoints}"


@pytest.fixture(scope="module")
def page(lab):
    """A tab of headless Chromium on the lab, 1280 x 900, shared by the module's tests (a browser and the lab's
    page loaded once: each is seconds of CPU); each test opens its notebook in it and closes it."""
    with launch_chromium() as browser:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Page", "Runtime"):
            browser.send(f"{domain}.enable", {}, session)
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        yield Lab(browser, session, lab["base"], lab["token"])
        # autosave is off and nothing saves: no notebook of the checkout was written through the lab
        saves = [
            (e["params"]["request"]["method"], e["params"]["request"]["url"].split("?")[0])
            for e in browser.events
            if e.get("method") == "Network.requestWillBeSent"
            and "/api/contents/" in e["params"]["request"]["url"]
            and e["params"]["request"]["method"] in ("PUT", "PATCH", "DELETE")
        ]
        assert not saves, f"the page wrote to the notebooks folder: {saves}"


CURRENT = "window.jupyterapp.shell.currentWidget"


class Lab:
    """The JupyterLab page: open a notebook, wait for its kernel, run cells with Shift+Enter, read the DOM."""

    def __init__(self, browser, session, base, token):
        self.browser, self.session, self.base, self.token = browser, session, base, token
        self.loaded = False  # the lab's page is in the tab

    def js(self, expression: str, timeout: float = 60):
        return self.browser.evaluate(self.session, expression, timeout)

    def wait(self, expression: str, timeout: float = 120):
        return self.browser.wait_for(self.session, expression, timeout)

    def open(self, name: str, first: bool = False, kernel: bool = True):
        """Open ``name`` (by URL for the first, as a learner's link does; then through the file manager's
        command), wait until all its cells are on the page and, with ``kernel``, its kernel is idle; then clear
        its outputs (Edit > Clear Outputs of All Cells), so that no committed output passes for this run's."""
        if first or not self.loaded:
            # ?reset: a fresh layout, not the tabs an earlier test left in the lab's workspace
            url = f"{self.base}/lab/tree/{name}?reset&token={self.token}"
            self.browser.send("Page.navigate", {"url": url}, self.session)
            self.wait("typeof window.jupyterapp !== 'undefined' && window.jupyterapp.restored.then(() => true)")
            self.loaded = True
        else:
            path = json.dumps(name)
            self.js(f"window.jupyterapp.commands.execute('docmanager:open', {{path: {path}}}).then(() => 1)")
        self.wait(
            f"typeof window.jupyterapp !== 'undefined' && !!{CURRENT} && !!{CURRENT}.context "
            f"&& {CURRENT}.context.path === {json.dumps(name)}"
        )
        self.wait(
            f"""(async () => {{ const w = {CURRENT}; await w.context.ready;
            if (!w.isVisible) window.jupyterapp.shell.activateById(w.id);  // its tab in front
            return w.isVisible && w.model.cells.length > 0 && w.content.widgets.length === w.model.cells.length;
            }})()"""
        )
        if kernel:
            self.wait(
                f"""(async () => {{ const w = {CURRENT}; await w.sessionContext.ready;
                const k = w.sessionContext.session && w.sessionContext.session.kernel;
                return !!k && k.status === 'idle'; }})()""",
                timeout=180,
            )
        self.js("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs').then(() => 1)")
        self.wait(f"{CURRENT}.content.widgets.every(c => c.model.type !== 'code' || c.model.executionCount === null)")

    def kernel_name(self) -> str:
        return self.js(f"{CURRENT}.sessionContext.session.kernel.name")

    def shift_enter(self, index: int) -> None:
        """Select cell ``index`` in command mode and press Shift+Enter; wait for the kernel to finish."""
        self.js(
            f"""(async () => {{ const nb = {CURRENT}.content; nb.activeCellIndex = {index}; nb.mode = 'command';
            await nb.scrollToItem({index}); nb.node.focus(); return 1; }})()"""
        )
        for kind in ("rawKeyDown", "keyUp"):
            self.browser.send(
                "Input.dispatchKeyEvent",
                {
                    "type": kind,
                    "modifiers": 8,  # Shift
                    "key": "Enter",
                    "code": "Enter",
                    "windowsVirtualKeyCode": 13,
                    "nativeVirtualKeyCode": 13,
                },
                self.session,
            )
        is_code = self.js(f"{CURRENT}.content.widgets[{index}].model.type === 'code'")
        if is_code:
            self.wait(
                f"""(() => {{ const w = {CURRENT}; const c = w.content.widgets[{index}];
                const n = c.model.executionCount;
                return n !== null && w.sessionContext.session.kernel.status === 'idle'; }})()"""
            )

    def output_text(self, index: int) -> str:
        return self.js(f"{CURRENT}.content.widgets[{index}].node.querySelector('.jp-OutputArea').innerText")

    def shutdown_kernel(self) -> None:
        """Shut the notebook's kernel down (JupyterLab starts one per notebook it opens)."""
        self.js(f"{CURRENT}.sessionContext.ready.then(() => {CURRENT}.sessionContext.shutdown()).then(() => 1)")

    def close(self) -> None:
        """Shut the notebook's kernel down and close its tab without saving (marked clean first: a notebook whose
        cells ran is changed, and the lab would ask, or hold the next page load with its "leave the page?")."""
        self.shutdown_kernel()
        self.js(f"(() => {{ const w = {CURRENT}; w.context.model.dirty = false; w.dispose(); return 1; }})()")


def test_notebooks_name_the_zarrtorch_kernel():
    names = {
        p.name: json.loads(p.read_text())["metadata"]["kernelspec"]["name"] for p in sorted(NOTEBOOKS.glob("*.ipynb"))
    }
    assert set(names.values()) == {KERNEL}, names


def test_lesson_00_environment_check_runs_in_the_zarrtorch_kernel(page):
    page.open("00_index.ipynb", first=True)
    assert page.kernel_name() == KERNEL
    checks = _environment_check_indices()
    for i in range(checks[-1] + 1):  # from the top, as a learner does: the check uses the size cell's imports
        page.shift_enter(i)
    text = "\n".join(page.output_text(i) for i in checks)
    assert "Error" not in text and "Traceback" not in text, text
    check = page.output_text(checks[0])  # the requirements; the cells after it print versions and devices
    requirement_lines = [line for line in check.splitlines() if line.split() and line.split()[0] in REQUIREMENTS]
    assert sorted(line.split()[0] for line in requirement_lines) == sorted(REQUIREMENTS), check
    assert all(line.rstrip().endswith(" ok") for line in requirement_lines), check
    assert "data for the size in use: ready" in text and "size in use: tiny" in text, text
    page.close()


REQUIREMENTS = ("torch", "zarr", "lightning", "numpy", "xarray")  # what the check cell checks

# what the page shows of each exercise cell: its code shown, JupyterLab's collapsed-input placeholder, its text
SHOWN_CELLS = """(async () => {{ const w = {current}; const out = [];
    const shown = e => !!e && getComputedStyle(e).display !== 'none' && e.getBoundingClientRect().height > 0;
    for (let i = 0; i < w.content.widgets.length; i++) {{
      const c = w.content.widgets[i]; const tags = c.model.getMetadata('tags') || [];
      if (!tags.includes('solution') && !tags.includes('exercise')) continue;
      await w.content.scrollToItem(i);
      const area = () => c.node.querySelector('.jp-Cell-inputWrapper .jp-InputArea');
      const box = () => c.node.querySelector('.jp-InputPlaceholder');
      // a cell scrolled into view is laid out (and its editor made) a moment later
      const editor = () => c.node.querySelector('.jp-Cell-inputWrapper .cm-content');
      for (let t = 0; t < 100 && !shown(box()) && !(shown(area()) && shown(editor())); t++) {{
        c.node.scrollIntoView({{block: 'center'}});  // again: cells above may have changed height
        await new Promise(r => setTimeout(r, 50));
      }}
      out.push({{i, tags, code: shown(area()), placeholder: shown(box()),
                 text: shown(editor()) ? editor().textContent : ''}});
    }}
    return out; }})()"""


def _lessons() -> list[Path]:
    from test_notebook_structure import LESSONS

    return LESSONS


@pytest.mark.parametrize("lesson", _lessons(), ids=lambda p: p.name)
def test_exercise_cells_shown_and_solution_cells_show_only_their_load_line(page, lesson):
    name = lesson.name
    page.open(name, kernel=False)  # what the page shows; no cell is run (opened as from the file browser)
    cells = page.js(SHOWN_CELLS.format(current=CURRENT))
    source = _cells(name)
    solutions = [c for c in cells if "solution" in c["tags"]]
    exercises = [c for c in cells if "exercise" in c["tags"]]
    assert len(exercises) >= 2 and len(solutions) == len(exercises), (name, cells)
    for c in exercises:
        first_line = "".join(source[c["i"]]["source"]).splitlines()[0]
        assert c["code"] and not c["placeholder"], f"{name}, cell {c['i']}: the exercise cell is collapsed: {c}"
        assert first_line.strip() in c["text"], f"{name}, cell {c['i']}: shows {c['text'][:80]!r}"
    for k, c in enumerate(solutions, start=1):
        load = f"# %load solutions/{name[:2]}_ex{k}.py"
        assert c["code"] and not c["placeholder"], f"{name}, cell {c['i']}: the solution cell is collapsed: {c}"
        assert c["text"].strip() == load, f"{name}, cell {c['i']}: shows {c['text'][:200]!r}, not only {load!r}"
    page.close()


def test_uncommented_load_line_loads_the_solution_into_its_cell(page):
    """What a learner does to see a solution: delete the ``# `` of the load line, press Shift+Enter. The kernel
    runs ``%load``, which reads the file and asks the front end to put its text into the cell; the cell's
    source then is the load line, commented again, and the solution's code (nothing is saved)."""
    name = _lessons()[0].name
    page.open(name, first=True)
    index = next(i for i, c in enumerate(_cells(name)) if "solution" in _tags(c))
    load = "".join(_cells(name)[index]["source"]).strip()
    assert load.startswith("# %load solutions/"), load
    solution = (NOTEBOOKS / load.removeprefix("# %load ")).read_text(encoding="utf-8")
    cell = f"{CURRENT}.content.widgets[{index}].model.sharedModel"
    page.js(f"(() => {{ {cell}.setSource({json.dumps(load.removeprefix('# '))}); return 1; }})()")
    page.shift_enter(index)
    page.wait(f"{cell}.getSource().includes({json.dumps(solution.strip().splitlines()[0])})", timeout=60)
    loaded = page.js(f"{cell}.getSource()")
    assert loaded.splitlines()[0] == load, loaded  # %load comments its own line out again
    assert loaded.strip().endswith(solution.strip()), loaded
    page.close()
