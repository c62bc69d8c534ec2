"""What a verifier's forwards depend on, as strings: the key of the calibration and planner caches.

:func:`model_identity` names what a verification's cost depends on: the model's
architecture (its config, minus names and paths: two checkpoints of one architecture cost
the same), parameter dtype, device (CPU model or GPU name), attention implementation, the
verifier's tree ops and KV cache kind, torch version and thread count.
:func:`weights_fingerprint` tells two checkpoints of one architecture apart (they accept
drafts differently). Verifiers report both (:meth:`specdec.types.TunableVerifier.identity`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import weakref
from typing import Any

import numpy as np
import torch

_SAMPLES_PER_TENSOR = 64  # weight values hashed per parameter tensor: enough to tell checkpoints apart
_WEIGHTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def device_name(device: torch.device) -> str:
    """``cuda:<GPU name>``, or ``<type>:<CPU model>``."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"{device.type}:{_cpu_name()}"


@functools.cache
def _cpu_name() -> str:
    """The CPU's model name: ``/proc/cpuinfo``'s, else :func:`platform.processor`'s (which runs ``uname -p``
    in a child process on Linux, ~1.5 ms: asked only where there is no cpuinfo), else the machine type.
    Once per process: every generator's identity names it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            found = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), None)
    except OSError:
        found = None
    return found or platform.processor() or platform.machine()


def model_identity(model: Any, *, dtype: torch.dtype, device: torch.device, backend: str, cache: str) -> dict[str, str]:
    """What a verification's cost depends on (module docstring), as strings."""
    config = model.config.to_dict()
    architecture = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("name_or_path",)}
    digest = hashlib.sha256(json.dumps(architecture, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {
        "model_type": str(config.get("model_type", type(model).__name__)),
        "config": digest,
        "dtype": str(dtype).removeprefix("torch."),
        "device": device_name(device),
        "attention": str(getattr(model.config, "_attn_implementation", None) or "eager"),
        "backend": backend,
        "cache": cache,
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()) if device.type == "cpu" else "-",
    }


def weights_fingerprint(model: Any) -> str:
    """A hash of every parameter's name, shape, dtype and ``_SAMPLES_PER_TENSOR`` evenly spaced values.

    Tells two checkpoints of one architecture apart at the cost of a few hundred tiny reads
    (~5-60 ms for the default model), not a pass over the weights; remembered per model
    object (an in-place weight update after the first call goes unnoticed: the statistics
    keyed on it only steer budgets). Parameters that cannot be read (offloaded to ``meta``)
    count by name and shape only.
    """
    try:
        found = _WEIGHTS.get(model)
    except TypeError:  # refuses weak references: computed every time
        return _weights_fingerprint(model)
    if found is None:
        found = _WEIGHTS[model] = _weights_fingerprint(model)
    return found


def _weights_fingerprint(model: Any) -> str:
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
            if tensor.device.type == "meta" or tensor.numel() == 0:
                continue
            digest.update(_samples(tensor))
    return digest.hexdigest()[:24]


def _samples(tensor: torch.Tensor) -> bytes:
    """``_SAMPLES_PER_TENSOR`` evenly spaced values of ``tensor`` (flattened) as float64 bytes.

    A contiguous CPU tensor of a dtype NumPy shares is read through a NumPy view: the same bytes
    as the torch ops below at about half their cost (four torch dispatches per tensor; for the
    default model's 273 tensors 1.4-1.9 ms against 2.9-4.2 ms, once per model object)."""
    if tensor.device.type == "cpu" and tensor.dtype in _NUMPY_DTYPES and tensor.is_contiguous() and not tensor.is_neg():
        flat = tensor.detach().numpy().reshape(-1)
        step = max(1, flat.size // _SAMPLES_PER_TENSOR)
        return bytes(flat[::step][:_SAMPLES_PER_TENSOR].astype(np.float64).tobytes())
    flat_tensor = tensor.detach().reshape(-1)
    step = max(1, flat_tensor.numel() // _SAMPLES_PER_TENSOR)
    return bytes(flat_tensor[::step][:_SAMPLES_PER_TENSOR].to(torch.float64).cpu().numpy().tobytes())


_NUMPY_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.bool})
