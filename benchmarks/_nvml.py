"""GPU queries that never create a CUDA context: NVML (nvidia-ml-py) if importable, else nvidia-smi.

Kept free of torch so the orchestrating process can name the GPU without
importing torch, and so the recorder can read device memory before CUDA init.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """Optional NVML access; NVML never creates a CUDA context, so it is safe before init."""

    def __init__(self, module: Any) -> None:
        self._nvml = module
        self._handle: Any = None

    @classmethod
    def open(cls) -> "Nvml | None":
        try:
            import pynvml  # provided by nvidia-ml-py
            pynvml.nvmlInit()
        except Exception:
            return None
        return cls(pynvml)

    def select(self, uuid: str | None = None) -> None:
        """Pick the GPU torch will call cuda:0: by UUID once known, else from CUDA_VISIBLE_DEVICES."""
        n = self._nvml
        if uuid:
            self._handle = n.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            return
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        if first.startswith(("GPU-", "MIG-")):
            self._handle = n.nvmlDeviceGetHandleByUUID(first)
        else:
            self._handle = n.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)

    def used(self) -> int:
        if self._handle is None:
            self.select()
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def name(self) -> str:
        if self._handle is None:
            self.select()
        return _as_str(self._nvml.nvmlDeviceGetName(self._handle))

    def driver_version(self) -> str:
        return _as_str(self._nvml.nvmlSystemGetDriverVersion())


def nvidia_smi(field: str) -> str | None:
    """One `nvidia-smi --query-gpu` field for GPU 0, or None if the tool is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run([exe, f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", first],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0].strip() if out.strip() else None


def gpu_name_without_cuda() -> str | None:
    """GPU name for file naming, without creating a CUDA context in the calling process."""
    nvml = Nvml.open()
    if nvml is not None:
        try:
            return nvml.name()
        except Exception:
            pass
    return nvidia_smi("name")
