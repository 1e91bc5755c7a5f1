"""The GPU catalog: which GPU the estimate is for, and what that GPU gives a training process.

The estimate depends on the target GPU in a few fixed ways: the memory the driver lets a
process use (``total_memory_bytes``, the caching allocator's out-of-memory limit), the
memory every CUDA process loses before its first tensor (``context_bytes``), the kernels a
training step then loads outside the allocator (``kernel_bytes``), PyTorch's
cuBLAS workspace per handle (32 MiB on Hopper/Blackwell, 8,519,680 B elsewhere), and the
device properties user code reads through ``torch.cuda.get_device_properties``. Those
figures live in ``data/gpus.toml`` with a source for each; users add or correct GPUs in
their own TOML file (same layout), found in this order:

1. the path given to :func:`load_catalog`;
2. the file named by ``$XMEM_GPUS_FILE``;
3. ``$XDG_CONFIG_HOME/xmem/gpus.toml`` (``~/.config/xmem/gpus.toml``) if it exists.

A user entry whose key names a catalog GPU overrides only the fields it sets (aliases are
added to the catalog's); any other key adds a GPU and must set every required field.

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
OPTIONAL_FIELDS: dict[str, type] = {
    "kernel_bytes": int,
    "aliases": list,
    "nvidia_smi_memory_mib": int,
    "sources": dict,
}
NUMERIC_FIELDS = (
    "total_memory_bytes",
    "compute_capability",
    "sm_count",
    "cublas_workspace_bytes",
    "context_bytes",
    "kernel_bytes",
)

#: GPU kernels a training step loads on first use (PyTorch's own, cuBLAS, cuDNN: CUDA >= 11.7
#: loads modules lazily), which nvidia-smi counts and the caching allocator never sees. The
#: figure for a GPU without its own ``kernel_bytes``; how it was derived is in
#: :data:`DEFAULT_KERNEL_SOURCE`.
DEFAULT_KERNEL_BYTES = 54 << 20
DEFAULT_KERNEL_SOURCE = (
    "estimated: 54 MiB, measured on the RTX 3060 and RTX 4060 (see their entries) and applied "
    "unchanged; kernel images differ by architecture, so treat it as +-10 MiB"
)

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
        }

    def estimated_fields(self) -> list[str]:
        """Fields whose figure is derived rather than reported (source starts "estimated:")."""
        return [f for f, s in self.sources.items() if s.lower().startswith("estimated")]


# ----------------------------------------------------------------------------- loading


def load_catalog(extra: str | Path | None = None) -> dict[str, GPU]:
    """The packaged catalog merged with the user's file (see module docstring), by key."""
    packaged = resources.files("xmem_engine") / "data" / "gpus.toml"
    raw = _parse(packaged.read_text(encoding="utf-8"), "xmem_engine/data/gpus.toml")
    entries = _entries(raw, "xmem_engine/data/gpus.toml")
    user_path = _user_file(extra)
    if user_path is not None:
        try:
            text = user_path.read_text(encoding="utf-8")
        except OSError as e:
            raise GPUCatalogError(f"{user_path}: cannot read GPU catalog: {e}") from e
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
    if "kernel_bytes" not in entry:
        sources["kernel_bytes"] = DEFAULT_KERNEL_SOURCE
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
        nvidia_smi_memory_mib=entry.get("nvidia_smi_memory_mib"),
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
