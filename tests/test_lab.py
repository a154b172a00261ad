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
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if requests.get(f"{base}/api/status", params={"token": token}, timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited early:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        else:
            pytest.fail(f"jupyter lab did not answer within 60 s:\n{log.read_text()[-3000:]}")
        yield base, token, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


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
