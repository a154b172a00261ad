"""Drive JupyterLab in headless Chromium the way a student does: open a notebook, Run All,
look at what the page shows, move sliders, press Validate, open the formgrader.

Actions go through the user interface (menus, toolbar buttons, mouse drags). What the page
shows is read from the DOM; the notebook's output models are read through the application
object that `--LabApp.expose_app_in_browser` puts on `window.jupyterapp`.
"""
from __future__ import annotations

import base64
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
SHOTS = ARTIFACTS / "screenshots"          # one per notebook, after Run All
DOCS_IMG = REPO / "docs" / "img"           # the README's screenshots
TIMINGS: dict = {"session": {}, "notebooks": {}}   # written to ARTIFACTS/timings.json

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--disable-dev-shm-usage",
]


def _env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


# Generous: the machines that run this are small and shared.
RUN_TIMEOUT = _env_seconds("TFS_BROWSER_RUN_TIMEOUT", 420)        # one notebook, Run All
SLIDER_TIMEOUT = _env_seconds("TFS_BROWSER_SLIDER_TIMEOUT", 30)    # one slider -> new figure
VALIDATE_TIMEOUT = _env_seconds("TFS_BROWSER_VALIDATE_TIMEOUT", 420)
START_TIMEOUT = _env_seconds("TFS_BROWSER_START_TIMEOUT", 180)     # lab start, kernel start

# A cell that shows an explorer / draws a heatmap: a top-level statement (not inside a def) that
# calls explore(...) / Explorer(...) / a *heatmap*(...) function.
EXPLORE_RE = re.compile(r"^(?!(def|class|@)\b)[^\s#].*\b(explore|Explorer)\s*\(", re.M)
HEATMAP_CALL_RE = re.compile(r"^(?!(def|class|@)\b)[^\s#].*\b\w*heatmap\w*\s*\(", re.M)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(s: str) -> str:
    return ANSI_RE.sub("", s or "")


# --------------------------------------------------------------------------- the notebooks

@dataclass(frozen=True)
class Nb:
    kind: str      # "solution" | "student"
    name: str      # e.g. 01_attention
    src: Path      # the committed notebook

    @property
    def id(self) -> str:
        return f"{'solutions' if self.kind == 'solution' else 'notebooks'}/{self.name}"

    def __str__(self):
        return self.id


def discover() -> list[Nb]:
    """Every solution notebook of the course manifest (run at full size, as a student who has
    done the exercises meets it: explorers, heatmaps, training) and the first student notebook
    (the stubs' grey lines and the progress table as JupyterLab renders them). The other
    untouched student notebooks are run headless by the grading round trip, which checks the
    same things on their outputs; TFS_BROWSER_ALL_STUDENT=1 opens them here too."""
    from tfsgrade import manifest
    names = manifest.load().names()
    every = bool(os.environ.get("TFS_BROWSER_ALL_STUDENT"))
    return [Nb(kind, name, REPO / folder / f"{name}.ipynb") for k, name in enumerate(names)
            for kind, folder in (("solution", "solutions"), ("student", "notebooks"))
            if kind == "solution" or k == 0 or every]


def unavailable() -> str | None:
    """Why the browser tests cannot run here, or None when they can (test_notebooks runs its
    headless fallback only then)."""
    if os.environ.get("TFS_SKIP_BROWSER"):
        return "TFS_SKIP_BROWSER is set"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not find_chromium():
        return "no Chromium on PATH"
    return None


NOTEBOOKS = discover()


def validate_targets() -> list[Nb]:
    """Validate runs the whole notebook again on the server: by default only the first pair
    (01's solution and student notebook); TFS_BROWSER_VALIDATE_ALL=1 does every notebook."""
    if os.environ.get("TFS_BROWSER_VALIDATE_ALL"):
        return NOTEBOOKS
    first = NOTEBOOKS[0].name if NOTEBOOKS else None
    return [n for n in NOTEBOOKS if n.name == first]


# --------------------------------------------------------------------------- the browser

def find_chromium() -> str | None:
    """Debian's Chromium (or another Chrome) on PATH; TFS_CHROMIUM overrides."""
    env = os.environ.get("TFS_CHROMIUM")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def launch_chromium(playwright, executable: str):
    return playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)


# --------------------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Lab settings for the test run: every cell in the DOM (no virtual scrolling, so offscreen
# outputs are really rendered), no news or update checks, no autosave, no extension manager.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}


class LabServer:
    """`jupyter lab` from this interpreter's environment on a free loopback port with a token."""

    def __init__(self, root_dir: Path, cwd: Path, workdir: Path):
        self.root_dir = Path(root_dir)
        self.cwd = Path(cwd)
        self.workdir = Path(workdir)
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "jupyter-lab.log"
        self.start_seconds = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "lab") -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}/{path.lstrip('/')}{sep}token={self.token}"

    def _write_settings(self) -> Path:
        settings = self.workdir / "lab-settings"
        for plugin, values in LAB_SETTINGS.items():
            p = settings / f"{plugin}.jupyterlab-settings"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(values))
        return settings

    def command(self) -> list[str]:
        jupyter = Path(sys.executable).parent / "jupyter"
        cmd = [str(jupyter), "lab", "--no-browser",
               f"--ServerApp.token={self.token}", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.root_dir={self.root_dir}",
               f"--LabApp.user_settings_dir={self._write_settings()}",
               f"--LabApp.workspaces_dir={self.workdir / 'lab-workspaces'}",
               "--LabApp.expose_app_in_browser=True",
               # a kernel that does not stop within 2 s of a shutdown request is killed
               "--KernelManager.shutdown_wait_time=2"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--ServerApp.allow_root=True")
        return cmd

    def env(self) -> dict:
        env = dict(os.environ)
        # The student's environment, not the test runner's: no forced backend, warnings shown,
        # not under autograde; private config/runtime dirs so nothing on this machine leaks in.
        for k in ("MPLBACKEND", "PYTHONWARNINGS", "NBGRADER_EXECUTION", "TFS_STATIC",
                  "JUPYTER_PATH", "JUPYTER_DATA_DIR"):
            env.pop(k, None)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        # 07's minute of training is timed and checked by `make bench` (tools/bench_transformer.py);
        # here a few steps draw the same figures. TFS_BROWSER_FULL_TRAINING=1 trains in full.
        if not os.environ.get("TFS_BROWSER_FULL_TRAINING"):
            env["TFS_QUICK_TRAINING"] = "1"
        for k, sub in (("JUPYTER_CONFIG_DIR", "jupyter-config"), ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
                       ("IPYTHONDIR", "ipython")):
            d = self.workdir / sub
            d.mkdir(parents=True, exist_ok=True)
            env[k] = str(d)
        return env

    def start(self) -> "LabServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), cwd=self.cwd, env=self.env(), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = t0 + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                self.api("GET", "api/status", timeout=2)
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"jupyter lab not ready after {START_TIMEOUT:.0f}s:\n" + self.log_tail())
            time.sleep(0.2)
        self.start_seconds = time.monotonic() - t0
        return self

    def api(self, method: str, path: str, body=None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base}/{path.lstrip('/')}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None


    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self):
        """SIGTERM: jupyter-server shuts its kernels down (all at once) and exits."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # kernels exit when their parent dies
            self.proc.wait(timeout=10)


# --------------------------------------------------------------------------- results

@dataclass
class SliderResult:
    cell: int
    explorer: int
    control: str
    before: str
    after: str
    ok: bool
    problem: str = ""
    seconds: float = 0.0

    def __str__(self):
        where = f"cell {self.cell}, explorer {self.explorer}, slider {self.control!r}"
        if self.ok:
            return f"{where}: {self.before} -> {self.after}, figure changed ({self.seconds:.1f}s)"
        return f"{where}: {self.before} -> {self.after}: {self.problem}"


@dataclass
class ValidateResult:
    title: str
    status: str       # success | failed | changed | passed | error | unknown
    text: str


@dataclass
class ErrorOutput:
    cell: int
    ename: str
    evalue: str
    traceback: str
    source: str

    def __str__(self):
        tb = strip_ansi(self.traceback).strip().splitlines()
        first = next((ln for ln in self.source.splitlines() if ln.strip()), "")
        return (f"cell {self.cell} ({first[:70]!r}): {self.ename}: {self.evalue}\n      "
                + "\n      ".join(tb[-6:]))


@dataclass
class Cell:
    index: int
    type: str
    source: str
    execution_count: int | None
    outputs: list = field(default_factory=list)
    dom: dict | None = None
    tags: list = field(default_factory=list)

    @property
    def is_graded_test(self) -> bool:
        return "graded-test" in self.tags

    @property
    def errors(self) -> list[ErrorOutput]:
        return [ErrorOutput(self.index, o["ename"] or "", o["evalue"] or "", o["traceback"] or "",
                            self.source) for o in self.outputs if o["output_type"] == "error"]

    @property
    def is_explorer(self) -> bool:
        return self.type == "code" and bool(EXPLORE_RE.search(self.source))

    @property
    def draws_heatmap(self) -> bool:
        return self.type == "code" and bool(HEATMAP_CALL_RE.search(self.source))

    @property
    def first_line(self) -> str:
        return next((ln for ln in self.source.splitlines() if ln.strip()), "")[:70]


# --------------------------------------------------------------------------- JavaScript

JS_CELLS = r"""
() => {
  const nb = window.__tfsNb;
  const text = v => Array.isArray(v) ? v.join('') : (v || '');
  return nb.content.widgets.map((c, i) => {
    c.node.dataset.tfsIndex = String(i);
    const m = c.model;
    const out = {index: i, type: m.type, source: m.sharedModel.getSource(),
                 execution_count: null, outputs: [], dom: null,
                 tags: (m.getMetadata ? m.getMetadata('tags') : m.metadata.get('tags')) || []};
    if (m.type !== 'code') return out;
    out.execution_count = m.executionCount;
    out.outputs = m.outputs.toJSON().map(o => {
      const d = o.data || {};
      const t = o.output_type === 'stream' ? text(o.text) : text(d['text/plain']);
      return {output_type: o.output_type, name: o.name || null, ename: o.ename || null,
              evalue: o.evalue || null, traceback: (o.traceback || []).join('\n'),
              text: t.slice(0, 4000), mimes: Object.keys(d),
              png_b64_len: d['image/png'] ? String(d['image/png']).length : 0};
    });
    const area = c.node.querySelector('.jp-Cell-outputArea');
    const kids = area ? Array.from(area.children) : [];
    const slots = kids.map(k => {
      if (k.querySelector(':scope .jp-OutputArea-output > .jupyter-widgets')) return 'widget';
      if (k.querySelector('.jp-RenderedImage img')) return 'image';
      return 'other';
    });
    out.dom = {
      slots,
      images: kids.flatMap(k => Array.from(k.querySelectorAll('.jp-RenderedImage img'))).map(im => (
        {complete: im.complete, width: im.naturalWidth, height: im.naturalHeight})),
      sliders: area ? area.querySelectorAll('.widget-slider').length : 0,
      controls: area ? area.querySelectorAll('.widget-slider, .widget-checkbox, .widget-dropdown, .widget-toggle-button').length : 0,
      widget_problems: kids.map(k => k.innerText || '').filter(
        t => /Error displaying widget|Loading widget|Error rendering|model not found|Failed to load model/i.test(t)
      ).map(t => t.slice(0, 400)),
    };
    return out;
  });
}
"""

JS_CELL_ERRORS = r"""
(i) => {
  const c = window.__tfsNb.content.widgets[i];
  const outs = c.model.outputs;
  const errs = [];
  for (let k = 0; k < outs.length; k++) {
    const o = outs.get(k);
    if (o.type === 'error') {
      const j = o.toJSON();
      errs.push({ename: j.ename || '', evalue: j.evalue || '', traceback: (j.traceback || []).join('\n'),
                 source: c.model.sharedModel.getSource()});
    }
  }
  return errs;
}
"""

JS_BUSY = r"""
() => {
  const nb = window.__tfsNb;
  const k = nb.sessionContext.session && nb.sessionContext.session.kernel;
  if (!k) return 'no kernel';
  if (k.status === 'dead' || k.connectionStatus === 'disconnected') return 'dead';
  if (k.status !== 'idle') return 'busy';
  const pending = Array.from(nb.content.node.querySelectorAll('.jp-InputPrompt'))
      .some(e => e.textContent.includes('*'));
  return pending ? 'busy' : 'idle';
}
"""

# After a run stopped at an error: run each code cell that did not run, one at a time and in
# order (the command behind Run > Run Selected Cell and Do not Advance, i.e. a student going on
# with Ctrl+Enter), so that one more error does not abort the rest. Each command resolves
# when its cell has run. Right after an error the kernel may still be aborting requests: a
# cell whose run came back aborted is tried again after a pause.
JS_RUN_REST = r"""
async ({timeout_ms}) => {
  const app = window.jupyterapp, content = window.__tfsNb.content;
  const end = Date.now() + timeout_ms;
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const notRun = c => c.model.type === 'code' && c.model.executionCount === null &&
      c.model.sharedModel.getSource().trim() !== '';
  let ran = 0, retried = 0;
  const at = [];
  for (let i = 0; i < content.widgets.length; i++) {
    if (notRun(content.widgets[i])) at.push(i);
    for (let attempt = 0; notRun(content.widgets[i]); attempt++) {
      if (attempt > 5) {
        const line = content.widgets[i].model.sharedModel.getSource().trim().split('\n')[0];
        return {state: 'stuck', index: i, line: line.slice(0, 70), ran, retried};
      }
      if (attempt > 0) { retried++; await sleep(100 * attempt); }
      content.activeCellIndex = i;
      content.deselectAll();
      const left = end - Date.now();
      if (left <= 0) return {state: 'timeout', ran, retried};
      const run = app.commands.execute('notebook:run-cell').then(() => 'ran');
      const res = await Promise.race([run, sleep(left).then(() => 'timeout')]);
      if (res === 'timeout') return {state: 'timeout', ran, retried};
      ran++;
    }
  }
  return {state: 'done', ran, retried, at};
}
"""

# State of output slot `slot` of cell `cell` once it has changed from the marked image.
JS_SLOT_CHANGED = r"""
({cell, slot}) => {
  const c = document.querySelector(`[data-tfs-index="${cell}"]`);
  const area = c && c.querySelector('.jp-Cell-outputArea');
  const child = area && area.children[slot];
  if (!child) return null;
  const img = child.querySelector('.jp-RenderedImage img');
  if (img) {
    if (img.__tfsOld !== undefined && img.__tfsOld === img.src) return null;
    if (!img.complete || !img.naturalWidth) return null;
    return {state: 'image', src: img.src};
  }
  const t = (child.innerText || '').trim();
  return t ? {state: 'text', text: t.slice(0, 3000)} : null;
}
"""

JS_MARK_SLOT = r"""
({cell, slot}) => {
  const c = document.querySelector(`[data-tfs-index="${cell}"]`);
  const child = c.querySelector('.jp-Cell-outputArea').children[slot];
  const img = child && child.querySelector('.jp-RenderedImage img');
  if (!img) return null;
  img.__tfsOld = img.src;
  return img.src;
}
"""


def _png_bytes(data_url: str) -> bytes:
    return base64.b64decode(data_url.split(",", 1)[1]) if data_url and "," in data_url else b""


def image_is_blank(png: bytes) -> str | None:
    """None if the PNG shows something; otherwise why it counts as empty."""
    if len(png) < 1000:
        return f"only {len(png)} bytes"
    try:
        import numpy as np
        from matplotlib import image as mpimg
        arr = mpimg.imread(io.BytesIO(png), format="png")
    except Exception as e:  # noqa: BLE001
        return f"not a readable PNG ({e})"
    rgb = arr[..., :3] if arr.ndim == 3 else arr
    if float(np.ptp(rgb)) == 0.0:
        return "a single flat colour"
    if arr.ndim == 3 and arr.shape[-1] == 4 and float(arr[..., 3].max()) == 0.0:
        return "fully transparent"
    return None


def shot_is_blank(path: Path) -> str | None:
    """None if a notebook screenshot shows the notebook; otherwise why it counts as empty
    (the notebook area, below the toolbars and above the status bar, is almost all white)."""
    import numpy as np
    from PIL import Image
    a = np.asarray(Image.open(path).convert("L"))
    area = a[120:max(121, a.shape[0] - 40), 60:max(61, a.shape[1] - 60)]
    ink = float((area < 200).mean())
    return None if ink > 0.002 else f"{path.name}: {ink:.4%} of the notebook area is not white"


# --------------------------------------------------------------------------- the lab page

class Lab:
    """One JupyterLab page in the browser."""

    def __init__(self, page, server: LabServer):
        self.page = page
        self.server = server
        self.load_seconds = 0.0

    def load(self) -> "Lab":
        t0 = time.monotonic()
        self.page.set_default_timeout(START_TIMEOUT * 1000)
        self.page.goto(self.server.url("lab"))
        self.page.wait_for_function("() => window.jupyterapp && window.jupyterapp.restored")
        self.page.evaluate("async () => { await window.jupyterapp.restored; }")
        self.page.wait_for_selector(".lm-MenuBar-itemLabel")
        # More room for the notebook, as a student would make on a laptop.
        self.page.evaluate("() => { const s = window.jupyterapp.shell; s.collapseLeft(); s.collapseRight(); }")
        self.page.set_default_timeout(60_000)
        self.load_seconds = time.monotonic() - t0
        return self

    def menu(self, top: str, item: str):
        """Click a menu bar entry, then one of its items (both by exact label)."""
        page = self.page
        page.locator(".lm-MenuBar-itemLabel").filter(
            has_text=re.compile(rf"^{re.escape(top)}$")).first.click()
        entry = page.locator(".lm-Menu-content .lm-Menu-item:not(.lm-mod-disabled)").filter(
            has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$")))
        try:
            entry.first.click(timeout=10_000)
        except Exception:
            labels = page.locator(".lm-Menu-itemLabel").all_inner_texts()
            page.keyboard.press("Escape")
            raise AssertionError(f"no enabled menu item {top} > {item!r}; the menu shows {labels}")

    def open_dialog_text(self) -> str | None:
        d = self.page.locator(".jp-Dialog")
        return d.first.inner_text() if d.count() else None

    def open_notebook(self, relpath: str) -> "Notebook":
        return Notebook(self, relpath).open()

    def prefetch(self, relpath: str):
        """Open a notebook in a background tab without waiting: its kernel starts while the
        current notebook is being checked (a warm kernel when the tests get to it)."""
        self.page.evaluate(
            """(path) => { window.__tfsPrefetch = window.jupyterapp.commands.execute(
                 'docmanager:open', {path, factory: 'Notebook', options: {activate: false}}
               ).catch(e => null); return true; }""", relpath)

    def open_formgrader(self):
        """Nbgrader > Formgrader; returns the frame that shows it."""
        self.menu("Nbgrader", "Formgrader")
        frame = self.page.frame_locator("iframe[src*='formgrader']").first
        return frame


class Notebook:
    """An open notebook panel; the one the JavaScript above works on (window.__tfsNb)."""

    def __init__(self, lab: Lab, relpath: str):
        self.lab = lab
        self.page = lab.page
        self.relpath = relpath
        self.id = None
        self.rounds = 0
        self.retried = 0

    def open(self) -> "Notebook":
        self.id = self.page.evaluate(
            """async (path) => {
                 const app = window.jupyterapp;
                 const w = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
                 window.__tfsNb = w;
                 await w.context.ready;
                 await w.sessionContext.ready;
                 app.shell.activateById(w.id);
                 return w.id;
               }""", self.relpath)
        self.wait_idle(START_TIMEOUT, what="kernel start")
        dialog = self.lab.open_dialog_text()
        if dialog:
            raise AssertionError(f"a dialog opened with {self.relpath}: {dialog[:500]}")
        return self

    @property
    def panel(self):
        return self.page.locator(f"[id='{self.id}']")

    def wait_idle(self, timeout: float, what: str = "run"):
        """Kernel idle and no cell waiting ([*]) twice in a row."""
        deadline = time.monotonic() + timeout
        idle_seen = 0
        while True:
            state = self.page.evaluate(JS_BUSY)
            if state == "dead":
                raise AssertionError(f"{self.relpath}: the kernel died during {what}")
            idle_seen = idle_seen + 1 if state == "idle" else 0
            if idle_seen >= 2:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.relpath}: {what} not finished after {timeout:.0f}s "
                                     f"(kernel state: {state})")
            time.sleep(0.1)

    def cells(self) -> list[Cell]:
        return [Cell(**c) for c in self.page.evaluate(JS_CELLS)]

    def cell_errors(self, index: int) -> list[ErrorOutput]:
        """The error outputs of one cell, as its output model holds them now."""
        errs = self.page.evaluate(JS_CELL_ERRORS, index)
        return [ErrorOutput(index, e["ename"], e["evalue"], e["traceback"], e["source"]) for e in errs]

    def cell(self, index: int):
        return self.page.locator(f"[data-tfs-index='{index}']")

    def cell_text(self, index: int) -> str:
        """What the cell's output area shows, as the browser renders it (innerText)."""
        return self.cell(index).locator(".jp-Cell-outputArea").first.inner_text()

    def run_all(self, timeout: float = RUN_TIMEOUT) -> int:
        """Run > Run All Cells. JupyterLab stops a run at the first error (the kernel aborts the
        queued cells); then every cell that did not run is run on its own, in order, as a
        student going on past the error does. Returns how many cells were run that way."""
        deadline = time.monotonic() + timeout
        self.page.evaluate("() => window.jupyterapp.shell.activateById(window.__tfsNb.id)")
        self.lab.menu("Run", "Run All Cells")
        self.page.wait_for_timeout(100)
        self.wait_idle(max(1.0, deadline - time.monotonic()))
        # the kernel is briefly idle between two queued cells on a busy machine: only an idle
        # state that lasts counts as the end of Run All (else its last cell looks "not run")
        for _ in range(3):
            self.page.wait_for_timeout(700)
            self.wait_idle(max(1.0, deadline - time.monotonic()))
        left = deadline - time.monotonic()
        r = self.page.evaluate(JS_RUN_REST, {"timeout_ms": max(1000, int(left * 1000))})
        self.rounds = r["ran"]
        self.retried = r["retried"]
        self.run_after_error_at = r.get("at", [])  # the cells Run All did not run
        if r["state"] == "stuck":
            raise AssertionError(f"{self.relpath}: cell {r['index']} does not run ({r['line']!r})")
        if r["state"] == "timeout":
            raise AssertionError(f"{self.relpath}: Run All not finished after {timeout:.0f}s")
        self.wait_idle(max(1.0, deadline - time.monotonic()))
        return self.rounds

    # ---------------------------------------------------------------- explorers

    def explorer_slots(self, cell: Cell) -> list[tuple[int, int | None]]:
        """(widget slot, figure slot) for each explorer in the cell: the figure is the first
        image output after the widgets (and before the next widgets)."""
        slots = cell.dom["slots"]
        pairs = []
        for i, kind in enumerate(slots):
            if kind != "widget":
                continue
            fig = None
            for j in range(i + 1, len(slots)):
                if slots[j] == "widget":
                    break
                if slots[j] == "image":
                    fig = j
                    break
            pairs.append((i, fig))
        return pairs

    def check_sliders(self, cell: Cell, timeout: float = SLIDER_TIMEOUT) -> list[SliderResult]:
        """Move every slider of every explorer in the cell with the mouse and require the
        figure it drives to be redrawn with different image bytes, and no error to appear."""
        results = []
        for k, (wslot, fslot) in enumerate(self.explorer_slots(cell)):
            box = self.cell(cell.index).locator(
                f".jp-Cell-outputArea > :nth-child({wslot + 1})")
            sliders = box.locator(".widget-slider")
            n = sliders.count()
            if fslot is None:
                results.append(SliderResult(cell.index, k, "-", "", "", False,
                                            "the explorer shows no figure after its widgets"))
                continue
            for s in range(n):
                results.append(self._move_one(cell.index, k, sliders.nth(s), fslot, timeout))
        return results

    def _move_one(self, cell: int, explorer: int, slider, fslot: int, timeout: float) -> SliderResult:
        page = self.page
        label = slider.locator(".widget-label").first.inner_text().strip() or "?"
        readout = slider.locator(".widget-readout").first
        before = readout.inner_text().strip()
        old_src = page.evaluate(JS_MARK_SLOT, {"cell": cell, "slot": fslot})
        if not old_src:
            return SliderResult(cell, explorer, label, before, before, False,
                                "no figure before the slider moved")
        errors_before = len(self.cell_errors(cell))
        handle = slider.locator(".noUi-handle").first
        track = slider.locator(".noUi-base").first
        handle.scroll_into_view_if_needed()
        hb, tb = handle.bounding_box(), track.bounding_box()
        hx, hy = hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2
        frac = (hx - tb["x"]) / max(tb["width"], 1)
        tx = tb["x"] + tb["width"] * (0.8 if frac < 0.5 else 0.2)
        t0 = time.monotonic()
        page.mouse.move(hx, hy)
        page.mouse.down()
        page.mouse.move(tx, hy, steps=8)
        page.mouse.up()
        after, until = before, time.monotonic() + 5
        while after == before and time.monotonic() < until:
            page.wait_for_timeout(100)
            after = readout.inner_text().strip()
        if after == before:
            return SliderResult(cell, explorer, label, before, after, False,
                                "dragging the handle did not change the slider's value")
        try:
            handle_js = page.wait_for_function(JS_SLOT_CHANGED, arg={"cell": cell, "slot": fslot},
                                               timeout=timeout * 1000, polling=100)
            state = handle_js.json_value()
        except Exception:  # noqa: BLE001 (playwright's TimeoutError)
            state = None
        secs = time.monotonic() - t0
        new_errors = self.cell_errors(cell)[errors_before:]
        if new_errors:
            return SliderResult(cell, explorer, label, before, after, False,
                                "an error appeared: " + str(new_errors[0]), secs)
        if state is None:
            return SliderResult(cell, explorer, label, before, after, False,
                                f"the figure did not change within {timeout:.0f}s", secs)
        if state["state"] == "text":
            return SliderResult(cell, explorer, label, before, after, False,
                                "the figure was replaced by text: " + state["text"][:1500], secs)
        if _png_bytes(state["src"]) == _png_bytes(old_src):
            return SliderResult(cell, explorer, label, before, after, False,
                                "the figure was redrawn with the same image bytes", secs)
        blank = image_is_blank(_png_bytes(state["src"]))
        if blank:
            return SliderResult(cell, explorer, label, before, after, False,
                                f"the new figure is empty: {blank}", secs)
        return SliderResult(cell, explorer, label, before, after, True, "", secs)

    # ---------------------------------------------------------------- images

    def images_of(self, cell: int) -> list[bytes]:
        srcs = self.cell(cell).locator(".jp-Cell-outputArea .jp-RenderedImage img").evaluate_all(
            "els => els.map(e => e.src)")
        return [_png_bytes(s) for s in srcs]

    def _tall_viewport(self, height: int, max_height: int = 16000):
        """Context: the viewport made tall enough that `height` pixels of notebook fit."""
        page = self.page

        class Tall:
            def __enter__(self):
                self.vp = page.viewport_size
                tall = int(min(max(self.vp["height"], height + 200), max_height))
                page.set_viewport_size({"width": self.vp["width"], "height": tall})
                page.wait_for_timeout(250)

            def __exit__(self, *exc):
                page.set_viewport_size(self.vp)
        return Tall()

    def _stable_height(self, outer: str, tries: int = 10) -> int:
        """The notebook's height, measured until two readings agree (a busy machine can still
        be laying out cells when the viewport grows), and never more than the panel's own
        scrollHeight: a reading past it is a layout in progress, which photographed empty parts."""
        measure = f"""() => {{ const o = {outer}, w = window.__tfsNb.content.widgets;
            const last = w[w.length - 1].node.getBoundingClientRect().bottom;
            return [Math.ceil(last - o.getBoundingClientRect().top + o.scrollTop + 40), o.scrollHeight]; }}"""
        prev = None
        for _ in range(tries):
            h, full = self.page.evaluate(measure)
            h = min(h, full)
            if h == prev:
                break
            prev = h
            self.page.wait_for_timeout(300)
        return h

    def screenshot(self, path: Path, max_height: int = 16000, first_only: bool = False) -> list[Path]:
        """The whole notebook: the viewport is made as tall as the notebook (at most
        max_height px; a longer notebook is photographed in parts: NAME-part2.jpg, ...).
        first_only: the top max_height px alone."""
        path.parent.mkdir(parents=True, exist_ok=True)
        outer = """window.__tfsNb.content.node.querySelector('.jp-WindowedPanel-outer')
                   || window.__tfsNb.content.node"""
        h = self.page.evaluate(f"() => ({outer}).scrollHeight")
        jpeg = path.suffix.lower() in (".jpg", ".jpeg")
        paths = []
        with self._tall_viewport(h, max_height):
            view = self._settled_view(outer)
            # the notebook's own height: its last cell's bottom (scrollHeight also counts the
            # empty space JupyterLab adds after the last cell so that it can scroll to the top)
            h = self._stable_height(outer)
            # one shot when it all fits; else overlapping parts, the last one bottom-aligned
            # (never a part scrolled past the end, which photographs an empty page)
            step = max(500, view - 100)
            tops = [0] if h <= view or first_only else [*range(0, h - view, step), h - view]
            self.shot_geometry = {"scroll_height": h, "view": view, "tops": tops}
            for k, top in enumerate(tops):
                self.page.evaluate(f"(y) => ({outer}).scrollTo(0, y)", top)
                self.page.wait_for_timeout(100)
                p = path if k == 0 else path.with_name(f"{path.stem}-part{k + 1}{path.suffix}")
                self._shoot_rendered(p, jpeg)
                paths.append(p)
            self.page.evaluate(f"() => ({outer}).scrollTo(0, 0)")
        return paths

    def _settled_view(self, outer: str, tries: int = 20) -> int:
        """The panel's visible height once the taller viewport has reached it (a busy machine
        read the old, short one and photographed a long notebook in dozens of parts)."""
        prev = None
        for _ in range(tries):
            view = self.page.evaluate(f"() => ({outer}).clientHeight")
            if view == prev:
                return view
            prev = view
            self.page.wait_for_timeout(250)
        return prev

    def _shoot_rendered(self, p: Path, jpeg: bool, tries: int = 12) -> None:
        """One part of the notebook, taken again while it shows nothing: JupyterLab's windowed
        notebook renders the cells scrolled into view a moment later, and a busy machine
        photographed that moment (an empty part). A part still empty after the retries is kept,
        and the test says so."""
        for _ in range(tries):
            if jpeg:
                self.page.screenshot(path=str(p), type="jpeg", quality=70)
            else:
                self.page.screenshot(path=str(p))
            if shot_is_blank(p) is None:
                return
            self.page.wait_for_timeout(500)

    def cell_screenshot(self, index: int, path: Path, part: str = "cell"):
        """One cell (part="cell") or only its outputs (part="output")."""
        path.parent.mkdir(parents=True, exist_ok=True)
        loc = self.cell(index)
        if part == "output":
            loc = loc.locator(".jp-Cell-outputArea").first
        with self._tall_viewport(int(loc.bounding_box()["height"])):
            loc.scroll_into_view_if_needed()
            self.page.wait_for_timeout(200)
            loc.screenshot(path=str(path))

    # ---------------------------------------------------------------- nbgrader

    def validate(self, timeout: float = VALIDATE_TIMEOUT) -> ValidateResult:
        """Press the toolbar's Validate button (it saves, then runs nbgrader's validator) and
        read the dialog it opens."""
        page = self.page
        self.panel.locator(".jp-Toolbar [title='Validate Assignment']").first.click()
        dialog = page.locator(".jp-Dialog").first
        dialog.wait_for(state="visible", timeout=timeout * 1000)
        title = dialog.locator(".jp-Dialog-header").first.inner_text().strip()
        body = dialog.locator(".jp-Dialog-body").first
        text = body.inner_text()
        status = "unknown"
        for cls in ("success", "failed", "changed", "passed"):
            if dialog.locator(f".validation-{cls}").count():
                status = cls
                break
        if status == "unknown" and "error running the validate command" in text:
            status = "error"
        accept = dialog.locator(".jp-Dialog-button.jp-mod-accept")
        (accept.first if accept.count() else dialog.locator("button").last).click()
        return ValidateResult(title, status, text)

    # ---------------------------------------------------------------- closing

    def close(self):
        """Close the tab without saving and shut its kernel down (not waiting for that: the
        server finishes it while the next notebook runs)."""
        try:
            self.page.evaluate(
                """() => {
                     const w = window.__tfsNb;
                     window.__tfsNb = null;
                     if (!w || w.isDisposed) return;
                     w.sessionContext.shutdown().catch(e => null);
                     w.context.model.dirty = false;
                     w.dispose();
                   }""")
        except Exception:  # noqa: BLE001 - the page may be gone; the server cleans up
            pass
