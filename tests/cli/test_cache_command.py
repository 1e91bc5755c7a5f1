"""``xmem cache`` (xmem_engine/cli/cache.py): what the compile cache holds, and ``--clear``."""

from __future__ import annotations

import json
import os

from xmem_engine.cli.main import main
from xmem_engine.tracing.compiler.compile_cache import ABOUT, CACHE_DIR_VAR, LAST_USED


def _folder(root, name: str, nbytes: int, used: float, about: dict | None = None):
    path = root / "inductor" / name
    (path / "fxgraph").mkdir(parents=True)
    (path / "fxgraph" / "entry").write_bytes(b"x" * nbytes)
    (path / LAST_USED).touch()
    os.utime(path / LAST_USED, (used, used))
    if about:
        (path / ABOUT).write_text(json.dumps(about))
    return path


def test_lists_the_folders_most_recent_first_then_clears_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path))
    old = _folder(tmp_path, "a", 3 << 20, 1_700_000_000.0)
    new = _folder(tmp_path, "b", 1 << 20, 1_800_000_000.0, {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.14.1"})
    assert main(["cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path / 'inductor'}: 4.0 MiB of 1,024 MiB (XMEM_CACHE_MAX_MB)"
    assert "NVIDIA H100 80GB HBM3, torch 2.14.1" in out[1] and out[1].lstrip().startswith("1.0 MiB")
    assert "not recorded" in out[2] and out[2].lstrip().startswith("3.0 MiB")
    assert main(["cache", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [f["path"] for f in listed["folders"]] == [str(new), str(old)]
    assert 0 <= listed["bytes"] - (4 << 20) < 1024  # and the small about.json
    assert main(["cache", "--clear"]) == 0
    assert "cleared: 2 folder(s), 4.0 MiB" in capsys.readouterr().out
    assert not (tmp_path / "inductor").exists()


def test_says_when_the_cache_is_off(monkeypatch, capsys):
    monkeypatch.setenv(CACHE_DIR_VAR, "off")
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.strip() == "the compile cache is off (XMEM_CACHE_DIR=off)"
