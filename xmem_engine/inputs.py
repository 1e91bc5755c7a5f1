"""What a user's environment says about an estimate, read one way for every front end.

``xmem estimate``, ``advise``, ``sweep`` and ``%%xmem`` each took the target GPU and the
allocator settings from the environment, and read them differently: ``XMEM_GPU=T4,L4`` was a
list for ``%%xmem`` and one unknown GPU name for ``xmem estimate``; the notebook preferred
``PYTORCH_CUDA_ALLOC_CONF`` where PyTorch (2.9+) and the CLI prefer ``PYTORCH_ALLOC_CONF``;
``xmem sweep`` read only the older name. These functions are the one reading.
"""

from __future__ import annotations

import os
from typing import Mapping

#: the target GPU(s) when none is named: one catalog name or a comma-separated list
ENV_GPU = "XMEM_GPU"
#: a target GPU when neither a flag nor ``XMEM_GPU`` names one
DEFAULT_GPU = "A100-SXM4-40GB"
#: PyTorch's allocator settings, in the order PyTorch reads them (the first set one wins)
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def env_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPU names ``XMEM_GPU`` lists (``"T4, L4"`` -> ``["T4", "L4"]``); empty when unset.
    A front end that estimates one GPU takes the first, as ``%%xmem`` shows the first."""
    env = os.environ if environ is None else environ
    return [g.strip() for g in (env.get(ENV_GPU) or "").split(",") if g.strip()]


def default_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """:func:`env_gpus`, else :data:`DEFAULT_GPU`."""
    return env_gpus(environ) or [DEFAULT_GPU]


def env_alloc_conf(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(variable, setting)``: the allocator setting the target run would read from this
    environment, and the variable it came from (for error messages); ``("", "")`` when
    neither is set. ``PYTORCH_ALLOC_CONF`` wins, as in PyTorch 2.9+."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARS:
        if env.get(name):
            return name, env[name]
    return "", ""
