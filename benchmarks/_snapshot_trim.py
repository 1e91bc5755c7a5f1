"""Shrink a torch.cuda.memory._snapshot() to what a later event-by-event comparison needs.

Full snapshots carry a Python stack per event and per block (megabytes per
training step).  We keep every event and segment, but replace each stack by one
'where' string: the innermost frame inside the workload's own files.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterable

EVENT_KEYS = ("action", "addr", "size", "stream")
SEGMENT_KEYS = ("address", "total_size", "stream", "segment_type", "is_expandable")
BLOCK_KEYS = ("address", "size", "requested_size", "state")


class WhereFinder:
    """Maps a frame list (innermost first, as torch stores it) to "file:line:function"."""

    def __init__(self, files: Iterable[str | os.PathLike[str]]) -> None:
        self._files = {os.path.realpath(f) for f in files}
        self._match: dict[str, str | None] = {}

    def _short(self, filename: str) -> str | None:
        if filename not in self._match:
            real = os.path.realpath(filename) if filename and not filename.startswith("<") else ""
            self._match[filename] = os.path.basename(real) if real in self._files else None
        return self._match[filename]

    def __call__(self, frames: list[dict[str, Any]] | None) -> str | None:
        for fr in frames or ():
            short = self._short(fr.get("filename", ""))
            if short is not None:
                return f"{short}:{fr.get('line')}:{fr.get('name')}"
        return None


def trim_snapshot(snapshot: dict[str, Any], where: WhereFinder, device: int = 0) -> dict[str, Any]:
    """Events (action, addr, size, stream, where) and segments with bare blocks, for one device."""
    traces = snapshot.get("device_traces") or []
    events = []
    for ev in traces[device] if device < len(traces) else []:
        out = {k: ev[k] for k in EVENT_KEYS if k in ev}
        if "device_free" in ev:  # only on 'oom' events: what CUDA still reported free
            out["device_free"] = ev["device_free"]
        out["where"] = where(ev.get("frames"))
        events.append(out)
    segments = []
    for seg in snapshot.get("segments") or []:
        if seg.get("device", device) != device:
            continue
        out = {k: seg[k] for k in SEGMENT_KEYS if k in seg}
        out["blocks"] = [{k: b[k] for k in BLOCK_KEYS if k in b} for b in seg.get("blocks", [])]
        segments.append(out)
    trimmed: dict[str, Any] = {"device_traces": events, "segments": segments}
    if "allocator_settings" in snapshot:
        trimmed["allocator_settings"] = snapshot["allocator_settings"]
    return trimmed


def _gz(obj: Any) -> bytes:
    return gzip.compress(json.dumps(obj, separators=(",", ":")).encode(), compresslevel=9)


def store_snapshot(trimmed: dict[str, Any], path: Path, inline_limit: int, file_limit: int) -> dict[str, Any]:
    """Decide where the trimmed snapshot goes and return the record fields describing it.

    Small snapshots stay inline in the JSON line; larger ones are gzipped to
    `path`.  If even that exceeds `file_limit`, the event list is cut to its
    earliest events (the first iterations, where peaks usually happen) and the
    cut is recorded, never silent.
    """
    n_events = len(trimmed["device_traces"])
    info: dict[str, Any] = {"snapshot": None, "snapshot_file": None, "snapshot_events": n_events,
                            "snapshot_events_dropped": 0, "snapshot_segments": len(trimmed["segments"])}
    if len(json.dumps(trimmed, separators=(",", ":"))) <= inline_limit:
        info["snapshot"] = trimmed
        return info
    data, keep = _gz(trimmed), n_events
    while len(data) > file_limit and keep > 0:
        keep = int(keep * min(0.9, file_limit / len(data)))
        cut = {**trimmed, "device_traces": trimmed["device_traces"][:keep], "events_dropped": n_events - keep}
        data = _gz(cut)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    info["snapshot_file"] = str(path)
    info["snapshot_events_dropped"] = n_events - keep
    info["snapshot_file_bytes"] = len(data)
    return info


def load_snapshot(record: dict[str, Any], base_dir: str | os.PathLike[str] = ".") -> dict[str, Any] | None:
    """The trimmed snapshot of a JSON-lines record, inline or from its gz file (relative to base_dir)."""
    if record.get("snapshot") is not None:
        return record["snapshot"]
    if not record.get("snapshot_file"):
        return None
    path = Path(record["snapshot_file"])
    path = path if path.is_absolute() else Path(base_dir) / path
    return json.loads(gzip.decompress(path.read_bytes()))
