"""xmem's folder for the graphs Inductor compiled for a target GPU, kept between estimates.

One sub-folder per target GPU, torch version and xmem tracing source (:func:`compile_cache_dir`):
a second estimate of the same compiled step reads Inductor's output code back instead of
compiling it again. A sub-folder whose key no longer matches (xmem or torch upgraded, its graphs
compiled under other patches) is never read again, so the folder is kept under a size limit
(``$XMEM_CACHE_MAX_MB``, 1,024 MiB by default): before a trace compiles, the sub-folders used
least recently go first (:func:`make_room`). ``inductor_gpu.py`` points Inductor at it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

#: the environment variable naming xmem's cache directory; "off" (or "0", "none") keeps no cache
CACHE_DIR_VAR = "XMEM_CACHE_DIR"
#: the environment variable bounding the cache's size, in MiB
CACHE_MAX_VAR = "XMEM_CACHE_MAX_MB"
DEFAULT_MAX_MB = 1024
#: a sub-folder used this recently may be another estimate's, running now (a second notebook):
#: never removed to make room for this one
IN_USE_SECONDS = 3600.0
#: the file whose modification time says when a sub-folder was last used (a directory's own time
#: changes only when its direct entries do)
LAST_USED = ".last-used"
#: what a sub-folder was compiled for (target GPU, torch), as ``xmem cache`` lists it
ABOUT = "about.json"

_OFF = ("", "0", "off", "none", "false")


def cache_root() -> Path | None:
    """``$XMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/xmem`` or ``~/.cache/xmem``; None when the
    variable says "off"."""
    root = os.environ.get(CACHE_DIR_VAR)
    if root is not None and root.strip().lower() in _OFF:
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "xmem")
    return Path(os.path.abspath(os.path.expanduser(root)))


def compile_cache_dir(props: Any) -> str | None:
    """Where Inductor keeps the graphs it compiled for this target GPU between estimates, or None
    (``$XMEM_CACHE_DIR`` is "off"). xmem's own directory, never torch's: these graphs were
    compiled under xmem's patches and must not reach a real run. One directory per target GPU,
    torch and xmem source, so that nothing compiled for another (or by another xmem) is read back."""
    root = cache_root()
    if root is None:
        return None
    ident = "|".join(str(getattr(props, k, "")) for k in ("name", "major", "minor", "total_memory",
                                                           "multi_processor_count", "L2_cache_size"))
    key = hashlib.sha256(f"{ident}|{torch.__version__}|{_xmem_source_hash()}".encode()).hexdigest()[:20]
    return str(root / "inductor" / key)


@functools.cache
def _xmem_source_hash() -> str:
    """A hash of xmem_engine's tracing code: a cached graph compiled under other patches is stale."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_limit_bytes() -> int:
    """``$XMEM_CACHE_MAX_MB`` in bytes (a clear error for a value that is not a number of MiB)."""
    raw = os.environ.get(CACHE_MAX_VAR, "").strip()
    if not raw:
        return DEFAULT_MAX_MB << 20
    try:
        mib = float(raw)
    except ValueError:
        raise ValueError(f"{CACHE_MAX_VAR}={raw!r}: expected the compile cache's size limit in MiB, "
                         f"e.g. {CACHE_MAX_VAR}={DEFAULT_MAX_MB}") from None
    if mib < 0:
        raise ValueError(f"{CACHE_MAX_VAR}={raw!r}: a size limit cannot be negative")
    return int(mib * (1 << 20))


def folders() -> list[dict]:
    """The cache's sub-folders, most recently used first: path, bytes, last use (seconds since
    the epoch) and what they were compiled for (empty where not recorded)."""
    root = cache_root()
    if root is None or not (root / "inductor").is_dir():
        return []
    found = []
    for path in (root / "inductor").iterdir():
        if path.is_dir():
            try:
                about = json.loads((path / ABOUT).read_text())
            except (OSError, ValueError):
                about = {}
            about = about if isinstance(about, dict) else {}
            found.append({"path": str(path), "bytes": _size(path), "last_used": _last_used(path), **about})
    return sorted(found, key=lambda f: -f["last_used"])


def _size(path: Path) -> int:
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:  # removed meanwhile (another estimate's Inductor)
                pass
    return total


def _last_used(path: Path) -> float:
    for p in (path / LAST_USED, path):
        try:
            return p.stat().st_mtime
        except OSError:
            continue
    return 0.0


def make_room(where: str, limit: int | None = None, now: float | None = None, about: dict | None = None) -> list[str]:
    """Mark ``where`` (a :func:`compile_cache_dir`) used now, and bring the cache under ``limit``
    bytes (:func:`cache_limit_bytes`) by removing the sub-folders used least recently, none used
    within :data:`IN_USE_SECONDS` but ``where`` itself; ``where`` is emptied too when it alone is
    over the limit (this trace has not compiled yet: it compiles afresh). ``about`` (the target
    GPU and torch, for ``xmem cache``) is written beside the graphs. The removed folders."""
    limit = cache_limit_bytes() if limit is None else limit
    now = time.time() if now is None else now
    here = Path(where)
    here.mkdir(parents=True, exist_ok=True)
    entries = [(p, _size(p), _last_used(p)) for p in here.parent.iterdir() if p.is_dir()]
    total = sum(size for _, size, _ in entries)
    removed = []
    for path, size, used in sorted(entries, key=lambda e: e[2]):
        if total <= limit:
            break
        if path == here or now - used < IN_USE_SECONDS:
            continue
        shutil.rmtree(path, ignore_errors=True)
        total -= size
        removed.append(str(path))
    if next(size for path, size, _ in entries if path == here) > limit:
        shutil.rmtree(here, ignore_errors=True)
        here.mkdir(parents=True, exist_ok=True)
        removed.append(str(here))
    if about is not None and not (here / ABOUT).exists():
        (here / ABOUT).write_text(json.dumps(about))
    marker = here / LAST_USED
    marker.touch()
    os.utime(marker, (now, now))
    return removed
