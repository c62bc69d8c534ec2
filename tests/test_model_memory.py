"""A checkpoint's weights measured from its safetensors headers, and a model that cannot fit refused before loading.

The sizes are the loaded model's own (every parameter and buffer it reads from the file, in the dtype it
is loaded in); the refusal comes from a small fake of the available memory (no allocation), names both
sizes, and no weight is read (``from_pretrained`` is never reached).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import own_tiny_model

from specdec import model_memory, models
from specdec.errors import SpecDecError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny Llama saved in float32 (safetensors, no tokenizer: the refusal comes before one is read)."""
    model = own_tiny_model("llama").float()
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    return folder, model


def _stored_bytes(model: Any, dtype: torch.dtype) -> int:
    """What the saved tensors take in ``dtype``: parameters once each (tied ones are stored once)."""
    state = model.state_dict()
    unique = {tensor.data_ptr(): tensor for tensor in state.values()}
    return int(sum(tensor.numel() for tensor in unique.values()) * torch.empty((), dtype=dtype).element_size())


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.bfloat16, torch.float64])
def test_the_headers_give_the_weights_bytes_in_the_loaded_dtype(checkpoint: tuple[Path, Any], dtype: Any) -> None:
    folder, model = checkpoint
    assert model_memory.checkpoint_bytes(folder, dtype) == _stored_bytes(model, dtype or torch.float32)
    loaded, _ = _load_weights_only(folder, dtype)
    assert model_memory.checkpoint_bytes(folder, dtype) == _stored_bytes(loaded, dtype or torch.float32)


def _load_weights_only(folder: Path, dtype: Any) -> tuple[Any, None]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or "auto", local_files_only=True), None


def test_a_model_that_cannot_fit_is_refused_before_loading_naming_the_sizes(
    checkpoint: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, model = checkpoint
    needed = _stored_bytes(model, torch.float32)
    available = int(needed / model_memory.WEIGHTS_SHARE) - 4096  # just too little
    monkeypatch.setattr(model_memory, "available_memory", lambda device: available)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("from_pretrained was reached: the weights were read before the refusal")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", never)
    with pytest.raises(SpecDecError) as raised:
        models.load_model(folder, dtype="float32")
    message = str(raised.value)
    assert f"{needed / 2**20:.1f} MiB in float32" in message, message
    assert f"{available / 2**20:.1f} MiB available on cpu" in message, message
    assert f"dtype='bfloat16': {needed / 2 / 2**20:.1f} MiB" in message, message  # the way out, with its size
    # in bfloat16 it fits: the check passes and the load goes on (to the patched from_pretrained)
    with pytest.raises(AssertionError, match="from_pretrained was reached"):
        models.load_model(folder, dtype="bfloat16")


def test_unknown_available_memory_or_no_safetensors_refuses_nothing(
    checkpoint: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = checkpoint
    monkeypatch.setattr(model_memory, "available_memory", lambda device: None)
    assert model_memory.check_fits(folder, torch.float32, None) == model_memory.checkpoint_bytes(folder, torch.float32)
    monkeypatch.setattr(model_memory, "available_memory", lambda device: 1)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    assert model_memory.check_fits(tmp_path, torch.float32, None) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x02", "2 bytes"),
        (struct.pack("<Q", 2**40), "a header of 1099511627776 bytes"),
        (struct.pack("<Q", 5) + b"nope!", "its header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (
            struct.pack("<Q", 40) + json.dumps({"w": {"dtype": "F33", "shape": [2]}}).encode().ljust(40),
            "tensor 'w' has no known dtype",
        ),
    ],
)
def test_a_damaged_header_is_a_clear_error_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(SpecDecError, match="model.safetensors") as raised:
        model_memory.checkpoint_bytes(tmp_path, None)
    assert message in str(raised.value)
