"""Shared by the real-browser tests: a Jupyter server on 127.0.0.1 in private Jupyter dirs,
and the Debian Chromium they drive (see ../shared/docs/jupyter-stack-notes.md)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: run "
                                    "scripts/setup_browser.sh (apt-get install chromium chromium-driver)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def jupyter_server(tmp: Path, root_dir: Path, app: str = "jupyterlab", kernels: bool = True,
                   pythonpath: Path | None = None) -> Iterator[tuple[str, str]]:
    """Start ``python -m APP`` serving ``root_dir``; yield (base URL, token); stop it after.

    Config, data, runtime and IPython dirs live under ``tmp`` so nothing of the user's setup
    leaks in; the news pop-up is off. ``kernels=False`` allows only a kernel spec that does
    not exist, so nothing can start a kernel (for saved-output tests)."""
    env = dict(os.environ)
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(tmp / sub)
    env.pop("JUPYTER_PATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath) + os.pathsep + env.get("PYTHONPATH", "")
    (tmp / "config" / "labconfig").mkdir(exist_ok=True)
    (tmp / "config" / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    port, token = free_port(), secrets.token_hex(16)
    args = [sys.executable, "-m", app, "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
            f"--ServerApp.token={token}", "--ServerApp.password=", f"--ServerApp.root_dir={root_dir}",
            "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False"]
    if not kernels:
        args.append("--KernelSpecManager.allowed_kernelspecs=xmem-test-no-such-kernel")
    log_path = tmp / f"{app}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(args, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                get_json(f"{base}/api/status?token={token}")
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    pytest.fail(f"{app} did not start:\n{log_path.read_text()[-4000:]}")
                time.sleep(0.3)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def run_all_in_lab(page, base: str, token: str, notebook: str, timeout_ms: int = 90_000) -> None:
    """Open ``notebook`` in JupyterLab (a fresh workspace), wait for its kernel, run every cell."""
    page.goto(f"{base}/lab/workspaces/xmem-{secrets.token_hex(4)}/tree/{notebook}?reset&token={token}")
    page.wait_for_function(
        """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                   const k = w && w.sessionContext && w.sessionContext.session
                             && w.sessionContext.session.kernel;
                   return k && k.status === 'idle'; }""", timeout=timeout_ms)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def write_notebook(path: Path, cells: list[str], kernel: tuple[str, str] = ("python3", "Python 3")) -> None:
    """A notebook of code cells, unexecuted, for ``kernel`` (its spec name and display name)."""
    import json

    code = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
             "source": src} for i, src in enumerate(cells)]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": code, "metadata": {
        "kernelspec": {"name": kernel[0], "display_name": kernel[1], "language": "python"}}}))
