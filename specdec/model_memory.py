"""Whether a checkpoint's weights fit the machine, checked before any of them is loaded.

Why: a checkpoint too large for the machine's memory (an 8B model is 16 GB in bfloat16 and 32 GB
in float32, beside a 24 GiB host's other work) otherwise fails deep inside ``from_pretrained``
after minutes of reading, or the kernel's out-of-memory killer ends the process with no message
at all. The weights' size is known without reading them: a safetensors file starts with a JSON
header giving every tensor's dtype and shape (:func:`checkpoint_bytes`), so :func:`check_fits`
compares the bytes the weights take in the dtype they will be loaded in against the memory
available on the device (:func:`available_memory`) and refuses, naming both
sizes, before the first byte is read.

The rule is :data:`WEIGHTS_SHARE` of the available memory: the weights are read in place (a
bfloat16 checkpoint stays bfloat16, with no float32 copy), and the rest is left for the KV cache,
the activations and the process itself (a batch's KV caches are checked on their own,
:func:`specdec.batching.check_memory`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

from specdec.errors import SpecDecError

WEIGHTS_SHARE = 0.85  # the most of the device's available memory a model's weights may take
HEADER_LIMIT = 100 * 2**20  # a safetensors header longer than this is a damaged file, not a checkpoint

# Bytes per element of safetensors' dtype names (its format's list).
_ELEMENT_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
_FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def _header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (its first 8 bytes give the header's length)."""
    with file.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SpecDecError(f"{file} is not a safetensors file: {len(prefix)} bytes")
        (length,) = struct.unpack("<Q", prefix)
        if length > HEADER_LIMIT:
            raise SpecDecError(f"{file} is not a safetensors file: a header of {length} bytes")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SpecDecError(f"{file} is not a safetensors file: its header is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise SpecDecError(f"{file} is not a safetensors file: its header is not a JSON object")
    return header


def checkpoint_bytes(path: str | Path, dtype: torch.dtype | None = None) -> int | None:
    """The bytes a checkpoint's weights take once loaded in ``dtype`` (None: as stored), from the
    safetensors headers alone; None where the folder holds no safetensors file (a ``.bin``
    checkpoint's size is not known without unpickling it).

    Floating tensors take ``dtype``'s size per element (what ``from_pretrained(dtype=...)`` casts them
    to), the others (integer buffers) their stored size. Every ``*.safetensors`` file of the folder
    counts (a sharded checkpoint's shards).
    """
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    target = None if dtype is None else torch.empty((), dtype=dtype).element_size()
    total = 0
    for file in files:
        for name, entry in _header(file).items():
            if name == "__metadata__":
                continue
            if not isinstance(entry, dict) or entry.get("dtype") not in _ELEMENT_BYTES:
                raise SpecDecError(f"{file}: tensor {name!r} has no known dtype ({entry!r:.80})")
            elements = 1
            for size in entry.get("shape", []):
                elements *= int(size)
            stored = entry["dtype"]
            width = target if target is not None and stored in _FLOATING else _ELEMENT_BYTES[stored]
            total += elements * width
    return total


def available_memory(device: torch.device) -> int | None:
    """Bytes available for new allocations on ``device``: a GPU's free memory, a Linux host's
    ``MemAvailable``; None where neither can be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
    return None


def size_text(count: float) -> str:
    """Bytes in GiB (or MiB under one GiB), one decimal."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def check_fits(path: str | Path, dtype: torch.dtype | None, device: torch.device | None) -> int | None:
    """The checkpoint's weight bytes in ``dtype`` (None: unknown); raises :class:`SpecDecError` before
    any loading when they are more than :data:`WEIGHTS_SHARE` of the memory available on ``device``
    (the CPU where None), naming both sizes. Where the available memory cannot be read, nothing is
    refused."""
    needed = checkpoint_bytes(path, dtype)
    if needed is None:
        return None
    loaded_as = f"in {str(dtype).removeprefix('torch.')}" if dtype is not None else "as stored"
    halved = checkpoint_bytes(path, torch.bfloat16) or needed
    smaller = f"load it in bfloat16 (dtype='bfloat16': {size_text(halved)}), " if halved < needed else ""
    check_bytes_fit(needed, f"the model at {str(path)!r}", loaded_as, device, smaller)
    return needed


def check_bytes_fit(needed: int, what: str, loaded_as: str, device: torch.device | None, instead: str = "") -> None:
    """Raise :class:`SpecDecError` where ``needed`` bytes of ``what``'s weights (``loaded_as``: "in float32")
    are more than :data:`WEIGHTS_SHARE` of the memory available on ``device`` (the CPU where None), naming
    both sizes and ``instead`` (another way to load it, ending ", "); nothing where that cannot be read."""
    place = device or torch.device("cpu")
    available = available_memory(place)
    if available is None or needed <= WEIGHTS_SHARE * available:
        return
    raise SpecDecError(
        f"{what} does not fit: its weights take {size_text(needed)} {loaded_as}, more than "
        f"{WEIGHTS_SHARE:.0%} of the {size_text(available)} available on {place}; free memory, {instead}or load "
        f"it on another device"
    )
