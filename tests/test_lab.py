"""JupyterLab starts headless from the venv, serves the course, and has nbgrader's server
extensions loaded (checked over HTTP), then stops."""
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from nbtools import REPO

pytestmark = pytest.mark.slow   # starts a JupyterLab server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    port, token = free_port(), secrets.token_hex(16)
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
               JUPYTER_RUNTIME_DIR=str(tmp_path_factory.mktemp("runtime")))
    log = tmp_path_factory.mktemp("lab") / "lab.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [str(bindir / "jupyter"), "lab", "--no-browser", f"--ServerApp.port={port}",
             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={REPO}", "--ServerApp.port_retries=0",
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    yield from _served(proc, f"http://127.0.0.1:{port}", log, lambda: token)


def test_lab_serves_the_course(lab):
    base, token, _ = lab
    r = requests.get(f"{base}/lab/tree/notebooks", params={"token": token}, timeout=30)
    assert r.status_code == 200 and "JupyterLab" in r.text
    listing = requests.get(f"{base}/api/contents/notebooks", params={"token": token}, timeout=30).json()
    names = {c["name"] for c in listing["content"]}
    assert "01_attention.ipynb" in names
    assert requests.get(f"{base}/api/contents/notebooks").status_code in (401, 403)  # token needed


def test_nbgrader_server_extensions_loaded(lab):
    base, token, log = lab
    text = log.read_text()
    for ext in ("nbgrader.server_extensions.validate_assignment",
                "nbgrader.server_extensions.formgrader"):
        mod = ext.rsplit(".", 1)[-1]
        assert mod in text or ext in text, f"{ext} not loaded:\n{text[-2000:]}"
    # the labextension that draws the Validate button is installed
    settings = requests.get(f"{base}/lab/api/settings", params={"token": token}, timeout=30).json()
    ids = {s["id"].split(":")[0] for s in settings["settings"]}
    assert any(i.startswith("@jupyter/nbgrader") or "nbgrader" in i for i in ids), sorted(ids)[:20]
    # the formgrader's HTTP handler answers
    r = requests.get(f"{base}/formgrader", params={"token": token}, timeout=60)
    assert r.status_code == 200


@pytest.fixture(scope="module")
def student_lab(tmp_path_factory):
    """JupyterLab exactly as `make lab` starts it (NO_BROWSER=1), on a free port; the token
    is read from the address it prints, as a student would."""
    import re
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("rt"))
    log = tmp_path_factory.mktemp("student_lab") / "lab.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(["make", "-s", "lab", "NO_BROWSER=1", f"PORT={port}"], cwd=REPO, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def printed():      # the token of the address make lab printed, once it has
        found = re.search(rf"^\s*{re.escape(base)}/lab\?token=(\w+)", log.read_text(), re.M)
        return found.group(1) if found else None
    yield from _served(proc, base, log, printed, tries=240)


def _served(proc, base, log, token_of, tries=120):
    """Wait until the server at `base` answers with the token `token_of()` gives, yield
    (base, token, log), and stop the server's whole process group at the end."""
    try:
        for _ in range(tries):
            token = token_of()
            try:
                if token and requests.get(f"{base}/api/status", params={"token": token}, timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"the lab exited early:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        else:
            pytest.fail(f"the lab did not answer within {tries // 2} s:\n{log.read_text()[-3000:]}")
        yield base, token, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_make_lab_lands_in_the_notebooks_without_the_instructors_parts(student_lab):
    """Issue 41.6: the student sees the course's notebooks (not solutions/, tests/, the
    grader), no Create Assignment panel, nbgrader menu or news prompt (the Validate button
    stays), no formgrader, and the address printed plainly."""
    base, token, log = student_lab
    root = requests.get(f"{base}/api/contents/", params={"token": token}, timeout=30).json()
    names = {c["name"] for c in root["content"]}
    assert "01_attention.ipynb" in names and not names & {"solutions", "tests", "autograder"}, names
    import json
    import re
    page = requests.get(f"{base}/lab", params={"token": token}, timeout=30).text
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    off = set(config.get("disabledExtensions") or [])
    assert {"@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:menu",
            "@jupyterlab/apputils-extension:announcements"} <= off, off
    assert "@jupyter/nbgrader:validate-assignment" not in off
    settings = requests.get(f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification",
                            params={"token": token}, timeout=30).json()
    news = settings["schema"]["properties"]["fetchNews"]     # overrides.json: the default is "Never"
    assert news["default"] == "false" and "fetchNews" not in settings["settings"], news
    assert requests.get(f"{base}/formgrader", params={"token": token}, timeout=30).status_code == 404
    text = log.read_text()
    url = next(ln for ln in text.splitlines() if f"{base}/lab?token=" in ln)
    assert url.strip().startswith("http"), text[-1500:]     # plainly, no "[C ...]" log tag
