"""How much host memory a real-mode run may take, and the guard that stops it in time.

Why: in real mode every tensor of the virtual GPU is a real CPU tensor, so a step that
needs 40 GB on a GPU needs 40 GB of this machine's memory. Past what the machine has, the
kernel's out-of-memory killer ends the process (a notebook's kernel dies, a scheduler's
job with it). So a real-mode run gets a budget: the memory available when it starts, less
a margin; before each large allocation the tracer compares the process's resident memory
plus that allocation with the budget and stops the run with :class:`HostMemoryExceeded`,
while there is still memory to report it. ``auto`` mode does not start a real-mode re-run
that the fake attempt already showed to be too big.

Available memory is Linux's ``MemAvailable``, capped by the process's cgroup limit (a
container, a Slurm job) and by ``XMEM_HOST_MEMORY`` (bytes, or with a K/M/G/T suffix) when
set. Elsewhere, without ``/proc``, there is no guard unless ``XMEM_HOST_MEMORY`` is set.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MARGIN_BYTES = 1 << 30  # left free for the rest of the process and the machine
MARGIN_FRACTION = 0.10
CHECK_BYTES = 1 << 20  # allocations smaller than this are not checked (they cannot matter)
ENV = "XMEM_HOST_MEMORY"


class HostMemoryExceeded(BaseException):
    """A real-mode run would outgrow the host's memory. A BaseException, so that a user's
    ``except Exception`` around a training step cannot swallow it."""

    def __init__(self, needed: int, budget: int, where: str = ""):
        super().__init__(needed, budget, where)
        self.needed, self.budget, self.where = needed, budget, where


def parse_bytes(text: str) -> int:
    """``"8G"`` -> 8 GiB; ``"512M"``, ``"1.5T"``, ``"1000000"``."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"{ENV} must be a size such as 8G or 512M, not {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_dirs() -> list[str]:
    """The process's own cgroup v2 directory (``/proc/self/cgroup``), then the root one."""
    dirs = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    dirs.append("/sys/fs/cgroup" + line[3:].strip().rstrip("/"))
    except OSError:
        pass
    return dirs + ["/sys/fs/cgroup"]


def _cgroup_room() -> int | None:
    """Bytes the process's cgroup (v2, or v1) may still take; None without a limit."""
    paths = [(d + "/memory.max", d + "/memory.current") for d in _cgroup_dirs()]
    paths.append(("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
    for limit_path, usage_path in paths:
        try:
            with open(limit_path) as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            limit = int(raw)
            if limit >= 1 << 60:  # v1's "no limit"
                return None
            with open(usage_path) as f:
                return max(limit - int(f.read().strip()), 0)
        except (OSError, ValueError):
            continue
    return None


def rss_bytes() -> int:
    """The process's resident memory now (``/proc/self/statm``), or its peak elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def available_bytes() -> int | None:
    """Memory this process may still take: the least of MemAvailable, the cgroup's room and
    ``XMEM_HOST_MEMORY`` less what the process holds already. None when nothing is known."""
    found = [v for v in (_meminfo_available(), _cgroup_room()) if v is not None]
    cap = os.environ.get(ENV)
    if cap:
        found.append(max(parse_bytes(cap) - rss_bytes(), 0))
    return min(found) if found else None


@dataclass
class HostBudget:
    """The resident size a real-mode run may reach: what the process held when it started
    plus what was available, less the margin."""

    limit_bytes: int
    available_bytes: int

    @classmethod
    def now(cls) -> "HostBudget | None":
        avail = available_bytes()
        if avail is None:
            return None
        margin = max(MARGIN_BYTES, int(avail * MARGIN_FRACTION))
        if os.environ.get(ENV):  # an explicit cap is the limit itself
            margin = 0
        room = max(avail - margin, 0)
        return cls(limit_bytes=rss_bytes() + room, available_bytes=room)

    def check(self, nbytes: int) -> None:
        """Raise :class:`HostMemoryExceeded` if allocating ``nbytes`` more would pass the limit."""
        if nbytes < CHECK_BYTES:
            return
        rss = rss_bytes()
        if rss + nbytes > self.limit_bytes:
            from xmem_engine.tracing.frames import user_frame

            raise HostMemoryExceeded(rss + nbytes, self.limit_bytes, user_frame(3))


def gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"
