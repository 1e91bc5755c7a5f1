"""The compile cache's size bound (xmem_engine/tracing/compiler/compile_cache.py, ``make_room``):
a sub-folder per target GPU, torch and xmem source accumulates as xmem and torch are upgraded;
the ones used least recently go first, none that another estimate may be using now."""

from __future__ import annotations

import os

import pytest

from xmem_engine.tracing.compiler.compile_cache import (CACHE_MAX_VAR, IN_USE_SECONDS, LAST_USED, cache_limit_bytes,
                                                        make_room)

MiB = 1 << 20
NOW = 1_800_000_000.0


def _folder(root, name: str, mib: float, used: float):
    path = root / "inductor" / name
    (path / "fxgraph").mkdir(parents=True)
    (path / "fxgraph" / "entry").write_bytes(b"x" * int(mib * MiB))
    (path / LAST_USED).touch()
    os.utime(path / LAST_USED, (used, used))
    return path


def test_the_least_recently_used_folders_go_until_the_cache_fits(tmp_path):
    oldest = _folder(tmp_path, "a", 3, NOW - 10 * IN_USE_SECONDS)
    older = _folder(tmp_path, "b", 3, NOW - 5 * IN_USE_SECONDS)
    recent = _folder(tmp_path, "c", 3, NOW - 2 * IN_USE_SECONDS)
    here = tmp_path / "inductor" / "mine"
    removed = make_room(str(here), limit=5 * MiB, now=NOW)
    assert removed == [str(oldest), str(older)]  # 9 MiB -> 6 -> 3: under 5 after two
    assert recent.exists() and here.exists()
    assert (here / LAST_USED).stat().st_mtime == NOW


def test_nothing_goes_while_the_cache_fits(tmp_path):
    old = _folder(tmp_path, "a", 1, NOW - 100 * IN_USE_SECONDS)
    assert make_room(str(tmp_path / "inductor" / "mine"), limit=2 * MiB, now=NOW) == []
    assert old.exists()


def test_a_folder_another_estimate_may_be_using_stays(tmp_path):
    busy = _folder(tmp_path, "a", 3, NOW - IN_USE_SECONDS / 2)
    make_room(str(tmp_path / "inductor" / "mine"), limit=1 * MiB, now=NOW)
    assert busy.exists()


def test_this_gpus_folder_alone_over_the_limit_is_emptied(tmp_path):
    here = _folder(tmp_path, "mine", 3, NOW - 1)
    assert make_room(str(here), limit=2 * MiB, now=NOW) == [str(here)]
    assert here.is_dir() and not (here / "fxgraph").exists() and (here / LAST_USED).exists()


def test_the_limit_from_the_environment(monkeypatch):
    monkeypatch.delenv(CACHE_MAX_VAR, raising=False)
    assert cache_limit_bytes() == 1024 * MiB
    monkeypatch.setenv(CACHE_MAX_VAR, "64")
    assert cache_limit_bytes() == 64 * MiB
    monkeypatch.setenv(CACHE_MAX_VAR, "1GB")
    with pytest.raises(ValueError, match=f"{CACHE_MAX_VAR}='1GB': expected the compile cache's size limit in MiB"):
        cache_limit_bytes()
