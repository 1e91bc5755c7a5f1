"""The GPU catalog: which GPU the estimate is for, and what that GPU gives a training process.

The estimate depends on the target GPU in a few fixed ways: the memory the driver lets a
process use (``total_memory_bytes``, the caching allocator's out-of-memory limit), the
memory every CUDA process loses before its first tensor (``context_bytes``), the kernels a
training step then loads outside the allocator (``kernel_bytes``; ``cudnn_bytes`` once cuDNN
runs, ``nccl_bytes`` once a process group exists: see ``fixed_memory.py``), the driver's own
reserve that NVML's total - free counts (``driver_reserved_bytes``), PyTorch's
cuBLAS workspace per handle (32 MiB on Hopper/Blackwell, 8,519,680 B elsewhere), and the
device properties user code reads through ``torch.cuda.get_device_properties``. Those
figures live in ``data/gpus.toml`` with a source for each; users add or correct GPUs in
their own TOML file (same layout), found in this order:

1. the path given to :func:`load_catalog`;
2. the file named by ``$XMEM_GPUS_FILE``;
3. ``$XDG_CONFIG_HOME/xmem/gpus.toml`` (``~/.config/xmem/gpus.toml``) if it exists.

A user entry whose key names a catalog GPU overrides only the fields it sets (aliases are
added to the catalog's); any other key adds a GPU and must set every required field.

Each fixed-memory figure is measured on its GPU or not (its source starts ``estimated:`` or
``assumed:``); an unmeasured one carries a ``<field>_range`` (given, or a default with its
reason in :data:`DEFAULT_RANGE_SOURCES`) that the estimate's range adds to the step's own.

Names are matched forgivingly (:func:`get_gpu`): case, spaces, ``-`` and ``_`` are ignored,
a leading ``NVIDIA`` / ``GeForce`` / ``Tesla`` is dropped, ``40GB`` == ``40G``, and the
words may come in any order. Bare family names pick the variant clouds mostly rent:
``a100`` -> A100-SXM4-40GB, ``h100`` -> H100-SXM-80GB, ``v100`` -> V100-SXM2-16GB.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ENV_VAR = "XMEM_GPUS_FILE"

#: Fields every GPU must have, with their TOML types. Why a table: one place that both the
#: loader's validation and the error message's TOML example are built from.
REQUIRED_FIELDS: dict[str, type] = {
    "name": str,
    "total_memory_bytes": int,
    "compute_capability": str,
    "sm_count": int,
    "cublas_workspace_bytes": int,
    "context_bytes": int,
}
#: The fixed memory of a training process beyond the bare CUDA context (see fixed_memory.py),
#: and the driver's own reserve: each optional, each may carry a ``<field>_range`` of [low, high].
PART_FIELDS = ("context_bytes", "kernel_bytes", "cudnn_bytes", "nccl_bytes", "driver_reserved_bytes")
RANGE_FIELDS = tuple(f"{f}_range" for f in PART_FIELDS)
OPTIONAL_FIELDS: dict[str, type] = {
    "kernel_bytes": int,
    "cudnn_bytes": int,
    "nccl_bytes": int,
    "driver_reserved_bytes": int,
    **{f: list for f in RANGE_FIELDS},
    "aliases": list,
    "nvidia_smi_memory_mib": int,
    "l2_cache_bytes": int,
    "sources": dict,
}
NUMERIC_FIELDS = (
    "total_memory_bytes",
    "compute_capability",
    "sm_count",
    "cublas_workspace_bytes",
    "context_bytes",
    "kernel_bytes",
    "cudnn_bytes",
    "nccl_bytes",
)

#: Source prefixes of a figure that was not measured on the GPU it describes: "estimated:" is
#: derived from figures that were (another GPU's, a formula's), "assumed:" has no public figure
#: behind it at all. Either way the estimate's range carries its uncertainty (fixed_memory.py).
UNMEASURED_PREFIXES = ("estimated:", "assumed:")

#: GPU kernels a training step loads on first use (PyTorch's own, cuBLAS / cuBLASLt's: CUDA >=
#: 11.7 loads modules lazily), which nvidia-smi counts and the caching allocator never sees. The
#: figure for a GPU without its own ``kernel_bytes``; how it was derived is in
#: :data:`DEFAULT_KERNEL_SOURCE`.
DEFAULT_KERNEL_BYTES = 54 << 20
DEFAULT_KERNEL_SOURCE = (
    "estimated: 54 MiB, measured on the RTX 3060 and RTX 4060 (xMem paper data, PyTorch 2.6.0 / CUDA 12.4, "
    "see their entries) and applied unchanged; kernel images differ by architecture: the range allows half to three "
    "times that (kernel_bytes_range)"
)
#: cuDNN's handle and the kernels of the engines a step runs, once a convolution, a recurrent layer,
#: batch norm or cuDNN attention ran (fixed_memory.libraries_used).
DEFAULT_CUDNN_BYTES = 0
DEFAULT_CUDNN_SOURCE = (
    "assumed: 0 B beyond the step's calibrated spread, as on the RTX 3060 and RTX 4060, whose convolutional "
    "runs (xMem paper data, PyTorch 2.6.0 / CUDA 12.4 / cuDNN 9) show no common offset for cuDNN; no public "
    "figure of cuDNN's device memory under lazy loading was found for any other GPU"
)
#: NCCL's communicator (buffers per channel and peer, outside PyTorch's allocator) once a process
#: group of more than one rank exists.
DEFAULT_NCCL_BYTES = 688 << 20
DEFAULT_NCCL_SOURCE = (
    "estimated: 688 MiB, https://github.com/NVIDIA/nccl/issues/964 (PyTorch, 4x A100 with NVLink, a 4 MB "
    "all-reduce in each process group): 'for group with only 2 devices, it requires 544 MB. And for group "
    "with more than 2 devices, it requires 688 MB'; NCCL's memory grows with channels, peers and algorithm "
    "(https://github.com/NVIDIA/nccl/issues/986)"
)

#: The range an unmeasured part gets when its entry gives none (``<field>_range``): how far the
#: figure may be off, and why. A measured part gets none: the calibrated spread of the runs that
#: measured it already holds its variation.
CONTEXT_SPREAD_BYTES = 170 << 20
DEFAULT_RANGE_SOURCES = {
    "context_bytes_range": (
        "estimated: +-170 MiB, as far as public bare-context figures with lazy loading differ among "
        "themselves: 256 MiB (RTX 3090, torch 2.7.1+cu128, https://github.com/invoke-ai/InvokeAI/issues/9413) "
        "to 426 MiB (RTX 6000 Ada, torch 2.10.0+cu130, https://github.com/unslothai/unsloth-zoo/pull/1053); "
        "torch 1.13 measured 287,047,680 B lazy and 666,632,192 B eager (https://github.com/pytorch/pytorch/pull/86509)"),
    "kernel_bytes_range": (
        "assumed: half to three times the figure: no measurement on this architecture (sm90 / sm100 cuBLASLt "
        "kernels are not those of sm86 / sm89); well under the 362 MiB by which eager loading of all of "
        "PyTorch's kernels exceeded lazy loading in https://github.com/pytorch/pytorch/pull/86509"),
    "cudnn_bytes_range": (
        "assumed: up to 162 MiB (three times the 54 MiB of PyTorch's and cuBLAS's kernels on the RTX 3060): "
        "cuDNN's engines load their own kernel images on first use; no public figure found"),
    "nccl_bytes_range": (
        "estimated: 544 MiB (2 ranks, 4x A100, https://github.com/NVIDIA/nccl/issues/964) to 1,086 MiB, the "
        "'NV 1.06 GB' per GPU, PyTorch's own memory excluded, before the first all_to_all on 8x H100 "
        "(https://github.com/NVIDIA/nccl/issues/1685); an all-to-all's extra channels (3.3 GB more there) "
        "are not included"),
    "driver_reserved_bytes_range": (
        "assumed: -1/3 to +1/6 of the figure, the relative spread public nvidia-smi -q outputs show on the "
        "H100 80GB HBM3 across drivers (Reserved 328-551 MiB around the catalog's 480 MiB)"),
}
DRIVER_RESERVED_SOURCE = (
    "estimated: nvidia_smi_memory_mib less total_memory_bytes: one driver's nvidia-smi total and "
    "totalGlobalMem differ by exactly its NVML 'Reserved' (L40S, driver 550.127.05: 46068 MiB total, "
    "Reserved 479 MiB, totalGlobalMem 45589 MiB, https://github.com/thamada/nvidia-smi/blob/"
    "c768aedc1e0bf705fc91b08e8d9403bf53760365/nvsim/L40S_smi.py and nvsim/L40S_deviceQuery.py), but this "
    "entry's two figures may come from different drivers"
)


def default_range(name: str, value: int) -> tuple[int, int]:
    """The [low, high] an unmeasured part ``name`` of ``value`` bytes gets by default (see
    :data:`DEFAULT_RANGE_SOURCES`)."""
    if name == "context_bytes":
        return max(0, value - CONTEXT_SPREAD_BYTES), value + CONTEXT_SPREAD_BYTES
    if name == "kernel_bytes":
        return value // 2, 3 * value
    if name == "cudnn_bytes":
        return min(value, 0), max(value, 3 * DEFAULT_KERNEL_BYTES)
    if name == "nccl_bytes":
        return min(value, 544 << 20), max(value, 1086 << 20)
    if name == "driver_reserved_bytes":
        return value - value // 3, value + value // 6
    raise KeyError(name)


ADD_GPU_HELP = f"""\
To add a GPU, describe it in ~/.config/xmem/gpus.toml (or the file ${ENV_VAR} names):

    [gpus."MY-GPU"]
    name = "NVIDIA GeForce RTX 4070"          # torch.cuda.get_device_name(0)
    aliases = ["rtx4070", "4070"]
    total_memory_bytes = 12_000_000_000       # torch.cuda.get_device_properties(0).total_memory
    compute_capability = "8.9"                # .major, .minor
    sm_count = 46                             # .multi_processor_count
    cublas_workspace_bytes = 8_519_680        # 33_554_432 on Hopper / Blackwell
    context_bytes = 446_693_376               # nvidia-smi usage right after CUDA init
    kernel_bytes = 56_623_104                 # optional: kernels loaded during the step
    cudnn_bytes = 0                           # optional: cuDNN, once a convolution / RNN ran
    nccl_bytes = 721_420_288                  # optional: NCCL, once a process group exists
    nvidia_smi_memory_mib = 12282             # optional: nvidia-smi memory.total (gives the
                                              #   driver's reserve: the total - free reading)
    # optional, per figure above: how far it may be off, e.g. context_bytes_range = [low, high]

Figures you set are taken as measured on your GPU: the estimate's range adds nothing for them.
`python benchmarks/gpu_groundtruth.py --fixed-memory` measures them on a GPU.

To correct one figure of a known GPU, set only that field under its key, e.g.
    [gpus."A100-SXM4-40GB"]
    context_bytes = 500_000_000"""


class GPUCatalogError(ValueError):
    """A catalog file is malformed: names the file, the GPU and the field."""


class UnknownGPUError(ValueError):
    """No GPU in the catalog matches the name; the message suggests close ones."""


@dataclass(frozen=True)
class GPU:
    """One target GPU: what its driver reports, and what PyTorch takes on it before tensors."""

    key: str
    name: str
    total_memory_bytes: int
    compute_capability: tuple[int, int]
    sm_count: int
    cublas_workspace_bytes: int
    context_bytes: int
    kernel_bytes: int = DEFAULT_KERNEL_BYTES
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    nvidia_smi_memory_mib: int | None = None
    cudnn_bytes: int = DEFAULT_CUDNN_BYTES
    nccl_bytes: int = DEFAULT_NCCL_BYTES
    # NVML's "Reserved": memory the driver keeps that NVML v1's used (total - free) counts and
    # nvidia-smi's used does not; None: not known for this GPU.
    driver_reserved_bytes: int | None = None
    # explicit [low, high] per part field (``<field>_range`` in the TOML); the others: part_range()
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, hash=False)
    # cudaDeviceProp.l2CacheSize: Inductor's autotuning flushes it with a buffer that size;
    # None: not in the catalog (the virtual device then reports an A100's 40 MiB)
    l2_cache_bytes: int | None = None

    @property
    def major(self) -> int:
        return self.compute_capability[0]

    @property
    def minor(self) -> int:
        return self.compute_capability[1]

    def properties(self) -> dict[str, Any]:
        """What ``torch.cuda.get_device_properties`` reports for this GPU (virtual device)."""
        return {
            "name": self.name,
            "total_memory": self.total_memory_bytes,
            "major": self.major,
            "minor": self.minor,
            "multi_processor_count": self.sm_count,
            "context_bytes": self.context_bytes,  # not a device property: mem_get_info's "free" leaves it out
            # nor these: the kernels' memory outside the allocator (a batch-size search's capacity)
            "kernel_bytes": self.kernel_bytes or 0, "cudnn_bytes": self.cudnn_bytes or 0,
            **({"L2_cache_size": self.l2_cache_bytes} if self.l2_cache_bytes is not None else {}),
        }

    def estimated_fields(self) -> list[str]:
        """Fields whose figure was not measured on this GPU (source starts "estimated:" or
        "assumed:")."""
        return [f for f, s in self.sources.items() if s.lower().startswith(UNMEASURED_PREFIXES)]

    def measured(self, name: str) -> bool:
        """Whether part field ``name`` was measured on this GPU (or given by the user, who is
        taken to have measured it), rather than estimated or assumed."""
        return not self.sources.get(name, "").lower().startswith(UNMEASURED_PREFIXES)

    def part_range(self, name: str) -> tuple[int, int]:
        """[low, high] bytes of part field ``name`` (one of :data:`PART_FIELDS`): the entry's own
        ``<name>_range``, else the default for an unmeasured figure, else the figure itself.
        Always contains the figure."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"GPU '{self.key}' has no {name}")
        if name in self.ranges:
            low, high = self.ranges[name]
        elif not self.measured(name):
            low, high = default_range(name, value)
        else:
            low = high = value
        return min(low, value), max(high, value)


# ----------------------------------------------------------------------------- loading


def load_catalog(extra: str | Path | None = None) -> dict[str, GPU]:
    """The packaged catalog merged with the user's file (see module docstring), by key.

    Read again whenever the files' text changed (a user's catalog edited in a session), else
    from the last read: every estimate resolves its GPU here, and parsing took 16 ms a call."""
    packaged = (resources.files("xmem_engine") / "data" / "gpus.toml").read_text(encoding="utf-8")
    user_path = _user_file(extra)
    text = None
    if user_path is not None:
        try:
            text = user_path.read_text(encoding="utf-8")
        except OSError as e:
            raise GPUCatalogError(f"{user_path}: cannot read GPU catalog: {e}") from e
    key = (packaged, str(user_path), text)
    if _LOADED.get("key") != key:
        _LOADED.clear()
        _LOADED.update(key=key, catalog=_load(packaged, user_path, text))
    return dict(_LOADED["catalog"])  # GPUs are frozen; the dict is the caller's


_LOADED: dict[str, Any] = {}  # the last catalog read, and the texts it was read from


def _load(packaged: str, user_path: Path | None, text: str | None) -> dict[str, GPU]:
    entries = _entries(_parse(packaged, "xmem_engine/data/gpus.toml"), "xmem_engine/data/gpus.toml")
    if user_path is not None and text is not None:
        _merge(entries, _entries(_parse(text, str(user_path)), str(user_path)), str(user_path))
    catalog = {key: _build(key, entry, origin) for key, (entry, origin) in entries.items()}
    _check_aliases(catalog, {key: origin for key, (_, origin) in entries.items()})
    return catalog


def _user_file(extra: str | Path | None) -> Path | None:
    """The user's catalog file; an explicitly named one must exist, the default may not."""
    if extra is not None:
        return Path(extra).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    default = Path(config_home) / "xmem" / "gpus.toml"
    return default if default.is_file() else None


def _parse(text: str, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GPUCatalogError(f"{origin}: not valid TOML: {e}") from e
    except RecursionError:
        raise GPUCatalogError(f"{origin}: its arrays or tables are nested too deeply to be a GPU catalog") from None


def _entries(raw: dict[str, Any], origin: str) -> dict[str, tuple[dict[str, Any], str]]:
    """The ``[gpus.KEY]`` tables of one file, each with the file it came from."""
    unknown = set(raw) - {"gpus", "schema_version"}
    if unknown:
        raise GPUCatalogError(
            f"{origin}: unknown top-level key(s) {sorted(unknown)}; GPUs go under [gpus.\"KEY\"]"
        )
    gpus = raw.get("gpus", {})
    if not isinstance(gpus, dict):
        raise GPUCatalogError(f"{origin}: 'gpus' must be a table of [gpus.\"KEY\"] tables")
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for key, entry in gpus.items():
        if not key.isprintable():  # escape codes would reach the terminal with `xmem gpus`
            raise GPUCatalogError(f"{origin}: GPU {key!r}: a key must be printable text")
        if not isinstance(entry, dict):
            raise GPUCatalogError(f"{origin}: GPU '{key}': must be a table, got {entry!r}")
        for name, value in entry.items():
            _check_field(origin, key, name, value)
        out[key] = (dict(entry), origin)
    return out


def _check_field(origin: str, key: str, name: str, value: Any) -> None:
    """Type and range checks for one field, so a typo fails at load with its location."""
    where = f"{origin}: GPU '{key}': field '{name}'"
    expected = REQUIRED_FIELDS.get(name) or OPTIONAL_FIELDS.get(name)
    if expected is None:
        known = sorted([*REQUIRED_FIELDS, *OPTIONAL_FIELDS])
        hint = difflib.get_close_matches(name, known, n=1)
        raise GPUCatalogError(
            f"{where} is unknown" + (f" (did you mean '{hint[0]}'?)" if hint else "")
            + f"; known fields: {', '.join(known)}"
        )
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise GPUCatalogError(f"{where} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise GPUCatalogError(f"{where} must be a {expected.__name__}, got {value!r}")
    if name in ("total_memory_bytes", "sm_count") and value <= 0:
        raise GPUCatalogError(f"{where} must be positive, got {value!r}")
    if expected is int and value < 0:
        raise GPUCatalogError(f"{where} must not be negative, got {value!r}")
    if name == "compute_capability" and not re.fullmatch(r"\d+\.\d+", value):
        raise GPUCatalogError(f"{where} must look like \"8.0\", got {value!r}")
    if name == "name" and not value.strip():
        raise GPUCatalogError(f"{where} must not be empty: the name torch.cuda.get_device_name() reports")
    if name == "aliases" and not all(isinstance(a, str) and a.strip() for a in value):
        raise GPUCatalogError(f"{where} must be a list of non-empty strings, got {value!r}")
    texts = [value] if name in ("name", "compute_capability") else list(value) if name == "aliases" else []
    if not all(t.isprintable() for t in texts):  # terminal escape codes, newlines
        raise GPUCatalogError(f"{where} must be printable text, got {value!r}")
    if name in RANGE_FIELDS and not (
            len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
            and value[0] <= value[1]):
        raise GPUCatalogError(f"{where} must be [low, high]: two whole numbers of bytes with 0 <= low <= high, "
                              f"got {value!r}")
    if name == "sources" and not all(isinstance(v, str) for v in value.values()):
        raise GPUCatalogError(f"{where} must map field names to strings, got {value!r}")


def _merge(
    entries: dict[str, tuple[dict[str, Any], str]],
    user: dict[str, tuple[dict[str, Any], str]],
    origin: str,
) -> None:
    """Apply the user's file: field-wise override of known keys, new keys added whole."""
    by_norm = {_normalize(k): k for k in entries}
    for key, (entry, _) in user.items():
        target = key if key in entries else by_norm.get(_normalize(key))
        if target is None:
            sources = {f: f"user catalog {origin}" for f in REQUIRED_FIELDS}
            sources.update(entry.get("sources", {}))
            entries[key] = ({**entry, "sources": sources}, origin)
            continue
        base, _ = entries[target]
        merged = dict(base)
        sources = dict(base.get("sources", {}))
        for name, value in entry.items():
            if name == "aliases":
                merged["aliases"] = [*base.get("aliases", []), *value]
            elif name != "sources":
                merged[name] = value
                sources[name] = f"user override in {origin}"
                if name in PART_FIELDS and f"{name}_range" not in entry:
                    # the user's figure is theirs, measured: the catalog's range for the old one goes
                    merged.pop(f"{name}_range", None)
                    sources.pop(f"{name}_range", None)
        sources.update(entry.get("sources", {}))
        merged["sources"] = sources
        entries[target] = (merged, origin)


def _build(key: str, entry: dict[str, Any], origin: str) -> GPU:
    missing = [f for f in REQUIRED_FIELDS if f not in entry]
    if missing:
        raise GPUCatalogError(
            f"{origin}: GPU '{key}': missing field(s) {', '.join(missing)}\n\n{ADD_GPU_HELP}"
        )
    if not key.strip():
        raise GPUCatalogError(f"{origin}: a GPU with an empty key: name it [gpus.\"MY-GPU\"]")
    kernel_bytes = entry.get("kernel_bytes", DEFAULT_KERNEL_BYTES)
    if entry["context_bytes"] + kernel_bytes >= entry["total_memory_bytes"]:
        raise GPUCatalogError(
            f"{origin}: GPU '{key}': context_bytes ({entry['context_bytes']:,}) + kernel_bytes ({kernel_bytes:,}) "
            f"leave nothing of total_memory_bytes ({entry['total_memory_bytes']:,}) for tensors; "
            "context_bytes is the CUDA context (hundreds of MiB), total_memory_bytes the device's memory")
    major, minor = (int(p) for p in entry["compute_capability"].split("."))
    sources = dict(entry.get("sources", {}))
    for name, default_source in (("kernel_bytes", DEFAULT_KERNEL_SOURCE), ("cudnn_bytes", DEFAULT_CUDNN_SOURCE),
                                 ("nccl_bytes", DEFAULT_NCCL_SOURCE)):
        if name not in entry:
            sources[name] = default_source
    smi_mib = entry.get("nvidia_smi_memory_mib")
    reserved = entry.get("driver_reserved_bytes")
    if reserved is None and smi_mib is not None:
        reserved = smi_mib * (1 << 20) - entry["total_memory_bytes"]
        if reserved < 0:
            raise GPUCatalogError(
                f"{origin}: GPU '{key}': nvidia_smi_memory_mib ({smi_mib:,} MiB) is below total_memory_bytes "
                f"({entry['total_memory_bytes']:,} B): nvidia-smi's memory.total includes the driver's reserve "
                "that totalGlobalMem leaves out, so it cannot be the smaller one")
        sources.setdefault("driver_reserved_bytes", DRIVER_RESERVED_SOURCE)
    values = {"context_bytes": entry["context_bytes"], "kernel_bytes": kernel_bytes,
              "cudnn_bytes": entry.get("cudnn_bytes", DEFAULT_CUDNN_BYTES),
              "nccl_bytes": entry.get("nccl_bytes", DEFAULT_NCCL_BYTES), "driver_reserved_bytes": reserved}
    ranges: dict[str, tuple[int, int]] = {}
    for name, value in values.items():
        given = entry.get(f"{name}_range")
        if given is not None:
            if value is None:
                raise GPUCatalogError(
                    f"{origin}: GPU '{key}': field '{name}_range' gives a range for {name}, which this GPU does "
                    f"not have (set {name}, or nvidia_smi_memory_mib to derive it)")
            if not given[0] <= value <= given[1]:
                raise GPUCatalogError(
                    f"{origin}: GPU '{key}': field '{name}_range' {list(given)} does not contain {name} "
                    f"({value:,}): the range is how far that figure may be off")
            ranges[name] = (given[0], given[1])
        elif value is not None and sources.get(name, "").lower().startswith(UNMEASURED_PREFIXES):
            sources.setdefault(f"{name}_range", DEFAULT_RANGE_SOURCES[f"{name}_range"])
    return GPU(
        key=key,
        name=entry["name"],
        total_memory_bytes=entry["total_memory_bytes"],
        compute_capability=(major, minor),
        sm_count=entry["sm_count"],
        cublas_workspace_bytes=entry["cublas_workspace_bytes"],
        context_bytes=entry["context_bytes"],
        kernel_bytes=kernel_bytes,
        aliases=tuple(entry.get("aliases", ())),
        sources=sources,
        nvidia_smi_memory_mib=smi_mib,
        cudnn_bytes=values["cudnn_bytes"],
        nccl_bytes=values["nccl_bytes"],
        driver_reserved_bytes=reserved,
        ranges=ranges,
        l2_cache_bytes=entry.get("l2_cache_bytes"),
    )


def _check_aliases(catalog: Mapping[str, GPU], origins: Mapping[str, str]) -> None:
    """Two GPUs answering to the same name would make lookups depend on file order."""
    seen: dict[str, str] = {}
    for gpu in catalog.values():
        for spelling in _spellings(gpu):
            other = seen.setdefault(_normalize(spelling), gpu.key)
            if other != gpu.key:
                raise GPUCatalogError(
                    f"{origins[gpu.key]}: GPU '{gpu.key}': field 'aliases': "
                    f"'{spelling}' also names GPU '{other}'"
                )


# ---------------------------------------------------------------------------- matching

_PREFIXES = ("nvidia", "geforce", "tesla")


def _tokens(name: str) -> list[str]:
    """Lower-case words of a name, vendor prefixes dropped, "40GB" spelled "40g"."""
    words = [w for w in re.split(r"[\s_\-]+", name.strip().lower()) if w]
    while words and words[0] in _PREFIXES:
        words = words[1:]
    return [re.sub(r"(\d+)gb\b", r"\1g", w) for w in words]


def _normalize(name: str) -> str:
    return "".join(_tokens(name))


def _spellings(gpu: GPU) -> tuple[str, ...]:
    return (gpu.key, gpu.name, *gpu.aliases)


def get_gpu(name: str, catalog: Mapping[str, GPU] | None = None) -> GPU:
    """The catalog GPU a user-typed name means; UnknownGPUError lists close matches."""
    if isinstance(name, GPU):
        return name
    if not isinstance(name, str) or not name.strip():
        raise UnknownGPUError(f"empty GPU name {name!r}: `xmem gpus` lists the names (e.g. A100-40GB, T4, H100)")
    if catalog is None:
        catalog = load_catalog()
    if name in catalog:
        return catalog[name]
    wanted = _normalize(name)
    if wanted:
        exact = {g.key for g in catalog.values() if any(_normalize(s) == wanted for s in _spellings(g))}
        if len(exact) == 1:
            return catalog[exact.pop()]
        # The same words in another order ("A100 40GB SXM4").
        words = sorted(_tokens(name))
        reordered = {
            g.key for g in catalog.values() if any(sorted(_tokens(s)) == words for s in _spellings(g))
        }
        if len(reordered) == 1:
            return catalog[reordered.pop()]
    raise UnknownGPUError(_unknown_message(name, catalog))


def _unknown_message(name: str, catalog: Mapping[str, GPU]) -> str:
    by_spelling: dict[str, str] = {}
    for gpu in catalog.values():
        for spelling in _spellings(gpu):
            by_spelling.setdefault(_normalize(spelling), gpu.key)
    close: list[str] = []
    for spelling in difflib.get_close_matches(_normalize(name), list(by_spelling), n=20, cutoff=0.5):
        key = by_spelling[spelling]
        if key not in close:
            close.append(key)
    # Short: a typo in a notebook cell needs the names, not a recipe (issue #35); the recipe
    # is one command away.
    lines = [f"Unknown GPU {name!r}."]
    if close:
        shown = ", ".join(f"{k} ({catalog[k].name})" for k in close[:5])
        lines.append(f"Close matches: {shown}.")
    lines.append(f"Known GPUs: {', '.join(sorted(catalog))}.")
    lines.append(f"To add yours: a few lines of TOML in ~/.config/xmem/gpus.toml (or ${ENV_VAR}); "
                 "`xmem gpus --help` shows them.")
    return "\n".join(lines)
