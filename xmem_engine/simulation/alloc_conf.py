"""Allocator settings and the parser for ``PYTORCH_CUDA_ALLOC_CONF`` strings.

The grammar and the error messages follow ``c10/cuda/CUDAAllocatorConfig.cpp``: the string
is lexed into tokens split at ``,`` ``:`` ``[`` ``]`` (spaces dropped), then read as
``key:value`` items separated by commas. A malformed string raises
:class:`AllocConfError` naming the offending key or value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MB = 1024 * 1024
K_LARGE_BUFFER = 20 * MB
N_ROUNDUP_INTERVALS = 16  # 1 MiB .. 64 GiB, one entry per power-of-two interval
SIZE_MAX = 2**64 - 1

# Keys PyTorch accepts but that do not change where device memory goes.
_IGNORED_BOOL_KEYS = (
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
)
_IGNORED_INT_KEYS = ("pinned_num_register_threads", "pinned_reserve_segment_size_mb")


class AllocConfError(ValueError):
    """A malformed allocator configuration string."""


@dataclass
class AllocatorConfig:
    """The caching allocator's tunables (defaults are PyTorch's)."""

    max_split_size: int = SIZE_MAX  # bytes; SIZE_MAX = unlimited (the default)
    max_non_split_rounding_size: int = K_LARGE_BUFFER  # bytes (PyTorch >= 2.6)
    roundup_power2_divisions: list[int] = field(default_factory=lambda: [0] * N_ROUNDUP_INTERVALS)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    backend: str = "native"  # or "cudaMallocAsync"
    source: str = ""  # the string this was parsed from

    def divisions_for(self, size: int) -> int:
        """``CUDAAllocatorConfig::roundup_power2_divisions(size)``."""
        index = size.bit_length() - 1 - 20  # floor(log2(size)) - log2(1 MiB)
        if index < 0:
            index = 0
        elif index >= N_ROUNDUP_INTERVALS:
            index = N_ROUNDUP_INTERVALS - 1
        return self.roundup_power2_divisions[index]

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "AllocatorConfig":
        """Read ``PYTORCH_ALLOC_CONF`` (2.9+) or ``PYTORCH_CUDA_ALLOC_CONF``."""
        from xmem_engine.inputs import env_alloc_conf

        name, text = env_alloc_conf(environ)
        try:
            return parse_alloc_conf(text)
        except AllocConfError as e:  # say where it came from: the user may not know it is set
            raise AllocConfError(f"{name}: {e}") from None


def _lex(text: str) -> list[str]:
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf.clear()
            tokens.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _lex(text)
        self.i = 0

    def error(self, msg: str) -> AllocConfError:
        return AllocConfError(f"{msg} (in allocator config {self.text!r})")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self, what: str) -> str:
        tok = self.peek()
        if tok is None:
            raise self.error(f"expected {what} but the string ended")
        self.i += 1
        return tok

    def expect(self, ch: str, key: str) -> None:
        tok = self.peek()
        if tok != ch:
            raise self.error(f"expected {ch!r} after {key!r}, got {tok!r}")
        self.i += 1

    def value(self, key: str) -> str:
        self.expect(":", key)
        tok = self.next(f"a value for {key!r}")
        if tok in ",:[]":
            raise self.error(f"expected a value for {key!r}, got {tok!r}")
        return tok


def _int(r: _Reader, key: str, tok: str) -> int:
    try:
        val = int(tok)
    except ValueError:
        raise r.error(f"{key}: {tok!r} is not an integer") from None
    if not 0 <= val < 1 << 64:  # PyTorch reads a size_t (std::stoull, std::stoi before 2.8): out of range, refused
        raise r.error(f"{key}: {tok} is out of range (0 to {(1 << 64) - 1:,})")
    return val


def _bool(r: _Reader, key: str, tok: str) -> bool:
    if tok not in ("True", "False"):
        raise r.error(f"Expected a single True/False argument for {key}, got {tok!r}")
    return tok == "True"


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_roundup(r: _Reader, cfg: AllocatorConfig) -> None:
    key = "roundup_power2_divisions"
    r.expect(":", key)
    tok = r.next(f"a value for {key!r}")
    divs = cfg.roundup_power2_divisions
    if tok != "[":
        val = _int(r, key, tok)
        if not _is_pow2(val):
            raise r.error(f"{key}: the divisions have to be a power of 2, got {val}")
        divs[:] = [val] * N_ROUNDUP_INTERVALS
        return
    first, last_index = True, 0
    while True:
        interval = r.next(f"an interval or ']' in {key}")
        if interval == "]":
            return
        r.expect(":", f"{key} interval {interval}")
        val = _int(r, key, r.next(f"divisions for interval {interval!r}"))
        if val != 0 and not _is_pow2(val):
            raise r.error(f"{key}: the divisions have to be a power of 2 or 0, got {val}")
        if interval == ">":
            divs[last_index:] = [val] * (N_ROUNDUP_INTERVALS - last_index)
        else:
            mib = _int(r, key, interval)
            if not _is_pow2(mib):
                raise r.error(f"{key}: the intervals have to be a power of 2 (MiB), got {mib}")
            index = min(mib.bit_length() - 1, N_ROUNDUP_INTERVALS - 1)
            if first:
                divs[:index] = [val] * index
                first = False
            divs[index] = val
            last_index = index
        nxt = r.peek()
        if nxt == ",":
            r.i += 1
        elif nxt is None:
            raise r.error(f"expected ',' or ']' in {key} but the string ended")
        elif nxt != "]":
            raise r.error(f"expected ',' or ']' in {key}, got {nxt!r}")


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string with PyTorch's grammar and checks."""
    cfg = AllocatorConfig(source=text)
    r = _Reader(text)
    while r.peek() is not None:
        key = r.next("a key")
        if key == "max_split_size_mb":
            val = _int(r, key, r.value(key))
            if val <= K_LARGE_BUFFER // MB:
                raise r.error(f"max_split_size_mb too small, must be > {K_LARGE_BUFFER // MB}, got {val}")
            cfg.max_split_size = min(val, SIZE_MAX // MB) * MB  # PyTorch's clamp
        elif key == "max_non_split_rounding_mb":
            val = _int(r, key, r.value(key))
            if val <= K_LARGE_BUFFER // MB:
                raise r.error(f"max_non_split_rounding_mb too small, must be > {K_LARGE_BUFFER // MB}, got {val}")
            cfg.max_non_split_rounding_size = min(val, SIZE_MAX // MB) * MB
        elif key == "garbage_collection_threshold":
            tok = r.value(key)
            try:
                val_f = float(tok)
            except ValueError:
                raise r.error(f"{key}: {tok!r} is not a number") from None
            if not 0.0 < val_f < 1.0:
                raise r.error(f"{key} must be strictly between 0.0 and 1.0, got {tok}")
            cfg.garbage_collection_threshold = val_f
        elif key == "roundup_power2_divisions":
            _parse_roundup(r, cfg)
        elif key == "expandable_segments":
            cfg.expandable_segments = _bool(r, key, r.value(key))
        elif key == "backend":
            tok = r.value(key)
            if tok not in ("native", "cudaMallocAsync"):
                raise r.error(f"Unknown allocator backend {tok!r}, options are native and cudaMallocAsync")
            cfg.backend = tok
        elif key in _IGNORED_BOOL_KEYS:
            _bool(r, key, r.value(key))
        elif key in _IGNORED_INT_KEYS:
            _int(r, key, r.value(key))
        elif key in ",:[]":
            raise r.error(f"expected a key, got {key!r}")
        else:
            raise r.error(f"Unrecognized CachingAllocator option: {key!r}")
        if r.peek() is not None:
            r.expect(",", key)
    return cfg


def require_native(cfg: AllocatorConfig) -> AllocatorConfig:
    """``cfg``, if xmem can simulate it: ``backend:cudaMallocAsync`` hands every request to
    CUDA's stream-ordered allocator, whose pool rules are not PyTorch's (AllocConfError)."""
    if cfg.backend != "native":
        raise AllocConfError(f"backend:{cfg.backend} bypasses PyTorch's caching allocator, which is what xmem "
                             "simulates; leave the backend out (or use backend:native)")
    return cfg
