"""When Triton is not installed where xmem runs: what the estimate then misses, said.

A GPU machine with PyPI's Linux torch wheel has Triton (the wheel depends on it); a CPU build
of torch (the CPU wheel, macOS) has not. Libraries that have a Triton kernel and a PyTorch
fallback choose by whether Triton imports, so on such a machine the traced step runs the
fallback, which can hold more memory than the kernel the GPU runs: TRL's losses then compute
log-probabilities from the whole logits (``benchmarks/zoo/finetune/qlora_sft.py`` on a T4:
5.81 GiB with the CPU wheel, 3.81 GiB with ``pip install triton`` beside it, as with the CUDA
wheel). xmem records Triton launches without compiling or running them
(``triton_launches.py``), so installing Triton is all the estimate needs; these notes say so
where it matters: after a trace that loaded such a library, and on a script that failed to
import Triton.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

#: modules that take a PyTorch fallback without Triton -> what that fallback does
FALLBACKS = {
    "trl.kernels.chunked_logprob": "TRL's log-probabilities and entropies computed from the whole logits",
    "trl.kernels.chunked_divergence": "TRL's divergence losses computed from the whole logits",
    "torchao.prototype.quantized_training.int8_mixed_precision": "torchao's INT8 matmuls as PyTorch ops",
}

INSTALL = ("`pip install triton` here (Linux; PyPI's CUDA wheel of torch brings it) and estimate again: xmem "
           "records Triton kernels without a GPU")


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None  # (the imported module's spec, once imported)


def note_fallbacks(tracer: Any) -> None:
    """The trace's note when its libraries took their fallbacks for want of Triton."""
    taken = [what for module, what in FALLBACKS.items() if module in sys.modules]
    if taken and not triton_installed():
        tracer.notes.append(f"Triton is not installed here, so these ran the PyTorch fallbacks a GPU machine does "
                            f"not: {'; '.join(taken)}. They can hold more memory than the Triton kernels: {INSTALL}")


def hint_missing_triton(e: BaseException) -> None:
    """A script that failed to import Triton (Liger, Unsloth, a user's kernels) is told how to
    go on, under its traceback (an exception note; Python 3.10: in the message)."""
    if not isinstance(e, ModuleNotFoundError) or (e.name or "").partition(".")[0] != "triton" or triton_installed():
        return
    hint = f"xmem: Triton is not installed here; {INSTALL}"
    if hasattr(e, "add_note"):
        e.add_note(hint)
    else:
        e.msg = f"{e.msg}\n{hint}"
