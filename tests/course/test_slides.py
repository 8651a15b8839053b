"""The workshop deck: it builds, works offline, and renders in a real headless browser.

``test_deck_builds_complete_and_offline`` checks the built files (no browser needed).
``test_deck_in_headless_chromium`` serves the deck on 127.0.0.1, opens it in Debian's chromium driven through
the DevTools protocol (a small client over ``websocket-client``), and checks that no request leaves the
machine, that every image loads, that no script fails and that every slide fits; it saves screenshots of a
few slides to ``slides/build/screenshots/``. Without a browser it is skipped, saying so
(``bash scripts/install_browser.sh`` installs one where it can).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLIDES = ROOT / "slides"
SCREENSHOTS = SLIDES / "build" / "screenshots"
WIDTH, HEIGHT = 1280, 720
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    f"--window-size={WIDTH},{HEIGHT}",
]

pytestmark = pytest.mark.slow


def _load_build():
    spec = importlib.util.spec_from_file_location("zarrtorch_slides_build", SLIDES / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def deck(tmp_path_factory):
    out = tmp_path_factory.mktemp("deck") / "build"
    summary = _load_build().build(out, log=lambda *a: None)
    return out, summary


# ---------------------------------------------------------------------------------------------------------
# Without a browser
# ---------------------------------------------------------------------------------------------------------
def test_deck_builds_complete_and_offline(deck):
    out, summary = deck
    page = (out / "index.html").read_text(encoding="utf-8")
    assert 20 <= summary["slides"] <= 34, summary
    assert "{{" not in page and "}}" not in page, "a placeholder was left unfilled"
    values = json.loads((out / "values.json").read_text())
    assert values["perf_source"] and values["throughput_ratio"]
    for name in summary["figures"]:
        png = out / "figures" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name
        assert f"figures/{name}" in page, f"{name} is computed but not shown"
    # nothing in the page or the styles points outside the folder (scripts' comments may hold URLs)
    remote = re.compile(
        r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import\s+["']?(?:https?:)?//""",
        re.I,
    )
    for path in list(out.rglob("*.html")) + list(out.rglob("*.css")):
        hits = remote.findall(path.read_text(encoding="utf-8", errors="replace"))
        assert not hits, f"{path.relative_to(out)} references a remote resource: {hits}"
    for ref in re.findall(r"""(?:src|href)="([^"]+)\"""", page):
        assert ref.startswith("data:") or (out / ref).is_file(), f"index.html references {ref}, not in the build"
    vendored = sum(p.stat().st_size for p in (SLIDES / "vendor").rglob("*") if p.is_file())
    assert vendored < 2_000_000, f"vendored reveal.js is {vendored / 1e6:.2f} MB"
    assert (SLIDES / "vendor" / "reveal.js" / "LICENSE").exists()


# ---------------------------------------------------------------------------------------------------------
# In a headless browser, through the DevTools protocol
# ---------------------------------------------------------------------------------------------------------
def find_chromium() -> str | None:
    for candidate in (
        os.environ.get("CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        shutil.which("google-chrome"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


class DevTools:
    """A minimal DevTools-protocol client: one browser websocket, flat sessions, events kept in a list."""

    def __init__(self, ws_url: str):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)
        raise TimeoutError(f"no answer to {method} within {timeout} s")

    def evaluate(self, session: str, expression: str, timeout: float = 60):
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session,
            timeout,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, session: str, expression: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(session, expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"{expression!r} still false after {timeout} s")

    def close(self):
        self.ws.close()


@contextlib.contextmanager
def launch_chromium():
    """Debian's chromium, headless, with a fresh profile: yields a :class:`DevTools` client on its browser
    websocket and ends the browser's process group afterwards. Skips the calling test, saying why, when there is
    no browser or it cannot start (``tests/course/test_lab.py`` uses it too)."""
    exe = find_chromium()
    if exe is None:
        pytest.skip(
            "no headless browser: /usr/bin/chromium is missing and none is on PATH "
            "(bash scripts/install_browser.sh installs it as root with apt-get; or set CHROMIUM=...)"
        )
    profile = tempfile.mkdtemp(prefix="zarrtorch-chromium-")
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if proc.poll() is not None:
                pytest.skip(
                    f"{exe} did not start (exit {proc.returncode}): "
                    f"{proc.stderr.read().decode(errors='replace')[-500:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"{exe} started but opened no DevTools port within 60 s")
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        client = DevTools(f"ws://127.0.0.1:{port}{path}")
        try:
            yield client
        finally:
            client.close()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the browser's own process group (start_new_session)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser():
    with launch_chromium() as client:
        yield client


@pytest.fixture
def served(deck):
    out, _ = deck
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_deck_in_headless_chromium(deck, served, browser):
    out, summary = deck
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Network", "Page", "Runtime", "Log"):
        browser.send(f"{domain}.enable", {}, session)
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
        session,
    )
    browser.send("Page.navigate", {"url": served + "index.html"}, session)
    browser.wait_for(session, "typeof Reveal !== 'undefined' && Reveal.isReady()", timeout=90)
    browser.wait_for(session, "document.fonts.status === 'loaded'", timeout=30)

    total = browser.evaluate(session, "Reveal.getTotalSlides()")
    assert total == summary["slides"], f"the browser shows {total} slides, the Markdown has {summary['slides']}"
    slides = browser.evaluate(
        session,
        """Reveal.getSlides().map((s, i) => ({
        i, title: (s.querySelector('h1, h2') || {textContent: ''}).textContent.trim(),
        images: s.querySelectorAll('img').length}))""",
    )

    # every image decoded (all slides' images are in the DOM; wait until the browser has them)
    browser.wait_for(session, "Array.from(document.images).every(i => i.complete)", timeout=60)
    images = browser.evaluate(session, "Array.from(document.images).map(i => [i.getAttribute('src'), i.naturalWidth])")
    assert len(images) == len(summary["figures"]), images
    assert all(width > 0 for _, width in images), f"images that did not load: {[s for s, w in images if not w]}"

    # visit every slide: nothing overflows the 1280 x 720 slide, no code block is cut; screenshots of a few
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("slide-*.png"):
        old.unlink()
    wanted = {0} | {s["i"] for s in slides if s["images"] or "slurm" in s["title"].lower()} | {len(slides) - 2}
    overflow = []
    for s in slides:
        browser.evaluate(session, f"Reveal.slide({s['i']})")
        browser.wait_for(session, f"Reveal.getIndices().h === {s['i']}", timeout=10)
        height = browser.evaluate(session, "Reveal.getCurrentSlide().scrollHeight")
        if height > HEIGHT + 4:
            overflow.append((s["i"] + 1, s["title"], f"{height} px high"))
        wide = browser.evaluate(
            session,
            """Array.from(Reveal.getCurrentSlide().querySelectorAll('pre code'))
            .filter(c => c.scrollWidth > c.clientWidth + 2).length""",
        )
        if wide:
            overflow.append((s["i"] + 1, s["title"], f"{wide} code block(s) wider than the slide"))
        if s["i"] in wanted:
            time.sleep(0.3)
            shot = browser.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
            slug = re.sub(r"[^a-z0-9]+", "-", s["title"].lower()).strip("-")[:40] or "slide"
            (SCREENSHOTS / f"slide-{s['i'] + 1:02d}-{slug}.png").write_bytes(base64.b64decode(shot))
    assert not overflow, f"slides that do not fit {WIDTH} x {HEIGHT} (number, title, what): {overflow}"

    # nothing left the machine, nothing failed
    events = browser.events
    urls = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    assert any(u.endswith("/index.html") for u in urls), urls
    outside = [u for u in urls if not (u.startswith(served) or u.startswith(("data:", "blob:", "about:")))]
    assert not outside, f"requests that leave 127.0.0.1: {outside}"
    failed = [e["params"] for e in events if e.get("method") == "Network.loadingFailed"]
    assert not failed, f"failed requests: {failed}"
    bad = [
        (e["params"]["response"]["url"], e["params"]["response"]["status"])
        for e in events
        if e.get("method") == "Network.responseReceived" and e["params"]["response"]["status"] >= 400
    ]
    assert not bad, f"HTTP errors: {bad}"
    errors = [e["params"] for e in events if e.get("method") == "Runtime.exceptionThrown"]
    errors += [
        e["params"]["entry"]
        for e in events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error"
    ]
    assert not errors, f"errors in the page: {errors}"
    assert len(list(SCREENSHOTS.glob("slide-*.png"))) == len(wanted)
