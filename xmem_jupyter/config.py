"""Per-notebook defaults for ``%%xmem``: set once, used by every cell that does not say.

Sources, later ones winning: built-in defaults, the environment (``XMEM_GPU``,
``XMEM_MODE``, ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``), ``%xmem_config``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from xmem_engine.inputs import ENV_GPU, default_gpus, env_alloc_conf

ENV_MODE = "XMEM_MODE"


@dataclass
class Config:
    """The notebook's defaults (one per IPython shell)."""

    gpus: list[str] = field(default_factory=list)  # empty: from the environment / built in
    mode: str = ""
    alloc_conf: str | None = None

    def default_gpus(self) -> list[str]:
        if self.gpus:
            return list(self.gpus)
        return default_gpus()

    def default_mode(self) -> str:
        return self.mode or os.environ.get(ENV_MODE, "").strip() or "auto"

    def default_alloc_conf(self) -> str:
        if self.alloc_conf is not None:
            return self.alloc_conf
        return env_alloc_conf()[1]

    def describe(self) -> str:
        return (f"xmem defaults: GPU {', '.join(self.default_gpus())}; mode {self.default_mode()}; "
                f"alloc conf {self.default_alloc_conf() or '(PyTorch default)'}")
