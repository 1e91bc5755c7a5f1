"""Shared test helpers. ../shared (real GPU recordings) is optional: tests that need it skip."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRACES = SHARED / "allocator-traces"


def recorded_traces() -> list[Path]:
    if not TRACES.is_dir():
        return []
    return sorted(p for p in TRACES.iterdir() if p.suffix in (".pickle", ".pkl"))


needs_shared_traces = pytest.mark.skipif(not recorded_traces(), reason="../shared/allocator-traces not present")
