"""The JupyterLab extension (labextension/): its node unit tests, and that installing the
project installs the prebuilt extension, enabled."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABEXT = REPO / "labextension"
PACKAGE = json.loads((LABEXT / "package.json").read_text())
NAME = PACKAGE["name"]
INSTALLED = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / NAME
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_node_unit_tests_pass():
    """`npm test` in labextension/: the renderer against the example reports (jsdom)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not on PATH")
    if not (LABEXT / "node_modules" / "jsdom").is_dir():
        pytest.skip("labextension/node_modules missing: `pip install -e .` (or `npm ci` in labextension/) installs it")
    proc = subprocess.run([npm, "test"], cwd=LABEXT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    passed = re.search(r"^\S*\s*pass (\d+)$", out, re.M)
    failed = re.search(r"^\S*\s*fail (\d+)$", out, re.M)
    assert passed and int(passed.group(1)) >= 30, out[-3000:]
    assert failed and int(failed.group(1)) == 0, out[-3000:]


def test_package_describes_a_prebuilt_mime_extension_and_plugin():
    # the saved-report renderer (index.ts) and the notebook plugin that picks widget or report
    assert PACKAGE["jupyterlab"]["mimeExtension"] == "lib/index.js"
    assert PACKAGE["jupyterlab"]["extension"] == "lib/live.js"
    assert PACKAGE["jupyterlab"]["outputDir"] == "../xmem_jupyter/labextension"
    assert (LABEXT / "package-lock.json").is_file(), "commit package-lock.json: builds must be reproducible"
    from xmem_engine import __version__
    assert PACKAGE["version"] == __version__, "labextension/package.json and xmem versions differ"
    install = json.loads((LABEXT / "install.json").read_text())
    assert install["packageName"] == "xmem"


def test_installed_and_enabled():
    """`pip install .` / `pip install -e .` put the built extension in share/jupyter."""
    if not (INSTALLED / "package.json").is_file():
        pytest.skip(f"{INSTALLED} missing: xmem is not installed with its lab extension here (pip install -e .)")
    built = json.loads((INSTALLED / "package.json").read_text())
    assert built["name"] == NAME
    assert built["jupyterlab"]["mimeExtension"], "the built package.json names no mime extension"
    assert built["jupyterlab"]["_build"].get("extension"), "the built package.json has no plugin (live.ts)"
    assert (INSTALLED / "static" / "style.js").is_file()
    assert json.loads((INSTALLED / "install.json").read_text())["packageName"] == "xmem"

    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter)] if jupyter.exists() else [sys.executable, "-m", "jupyter"]
    proc = subprocess.run([*cmd, "labextension", "list"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out
    line = next((ln for ln in out.splitlines() if ln.strip().startswith(f"{NAME} ")), None)
    assert line is not None, out
    assert re.search(rf"{re.escape(NAME)} v{re.escape(PACKAGE['version'])} enabled\s+OK \(python, xmem\)", line), line
