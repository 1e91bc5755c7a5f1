"""transformers' "is this tensor being traced?" answered as on the GPU.

transformers 5.x asks ``is_tracing(tensor)`` before it reads a mask's values, and counts any
``FakeTensor`` as traced (``utils.import_utils.is_fake_tensor``). ``masking_utils`` then keeps
an all-ones padding mask it would drop on a GPU (so that SDPA runs without one): BERT's
masked-LM step with ``attention_mask=torch.ones_like(input_ids)`` made one float mask per layer,
and a different attention backend, +1.65% against an H200's measured peak
(benchmarks/data/gpu_groundtruth-nvidia-h200-2026-12-04.jsonl, ``zoo-hf-fp16-gradscaler-bert``).

The tracer's fake tensors stand for a GPU run's real tensors, and the values such checks read
(masks, ids) are known where they matter (``shadow_values.py``); so they are not "traced" here.
Dynamo's own fake tensors, while ``torch.compile`` captures a graph, still are. transformers is
patched when the traced code imports it, and put back after.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from xmem_engine.tracing.patches import on_import, patched_attr

#: where ``is_fake_tensor`` lives (transformers 5.x; 4.x has no such check)
IMPORT_UTILS = "transformers.utils.import_utils"


def _ours_are_real(is_fake_tensor: Callable[[Any], bool], tracer: Any) -> Callable[[Any], bool]:
    def check(x: Any) -> bool:  # the tracer's mode is made after transformers may be patched: read it now
        return is_fake_tensor(x) and getattr(x, "fake_mode", None) is not tracer.fake_mode

    return check


def fake_tensors_are_not_traced(tracer: Any, stack: contextlib.ExitStack) -> contextlib.AbstractContextManager:
    """While the trace lasts, in fake mode: the tracer's fake tensors are not "tracing" to transformers."""

    def patch(module: Any) -> None:
        original = getattr(module, "is_fake_tensor", None)
        if tracer.fake and callable(original):
            stack.enter_context(patched_attr(module, "is_fake_tensor", _ours_are_real(original, tracer)))

    return on_import([IMPORT_UTILS], patch)
