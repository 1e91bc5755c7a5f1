"""Build function for hatch-jupyter-builder (pyproject.toml: [tool.hatch.build.hooks.jupyter-builder]).

It builds the JupyterLab extension with npm, like ``hatch_jupyter_builder.npm_builder``
(which it calls), after checking that Node.js and npm are there, so that a machine
without them fails with a message that says what to install instead of a bare "cmd not found".
"""

from __future__ import annotations

import shutil
import subprocess

MIN_NODE = (20, 0)


def build(target_name: str, version: str, **kwargs) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if p is None)
        missing += " are" if node is None and npm is None else " is"
        raise RuntimeError(
            f"xmem: building its JupyterLab extension (labextension/) needs Node.js >= {MIN_NODE[0]} "
            f"with npm, but {missing} not on PATH. Install Node.js and npm (for example "
            "`apt-get install nodejs npm`) and run the install again."
        )
    out = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        found = tuple(int(x) for x in out.lstrip("v").split(".")[:2])
    except ValueError:
        found = MIN_NODE
    if found < MIN_NODE:
        raise RuntimeError(
            f"xmem: building its JupyterLab extension needs Node.js >= {MIN_NODE[0]}; "
            f"{node} is {out}. Install a newer Node.js and run the install again."
        )
    from hatch_jupyter_builder import npm_builder

    npm_builder(target_name, version, **kwargs)
