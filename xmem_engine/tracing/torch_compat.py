"""What differs between the PyTorch releases xmem supports (README, "Install": 2.10 to 2.14).

One place for the private torch helpers whose name or presence changed between releases,
so the rest of the tracer reads as if there were one torch.
"""

from __future__ import annotations

import torch
import torch._prims_common as _prims

# ``_or_false`` (2.7+) answers False instead of guarding on unbacked symbolic sizes; the
# tracer's tensors have concrete sizes, for which the two agree.
is_non_overlapping_and_dense = getattr(_prims, "is_non_overlapping_and_dense_or_false", None) \
    or _prims.is_non_overlapping_and_dense

TORCH_VERSION: tuple[int, int] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore[assignment]
