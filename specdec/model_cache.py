"""The process-wide model cache: a checkpoint path or ``"default"`` is loaded once per process and placement.

:func:`resolve_model` turns :func:`specdec.run`'s ``model`` argument into a model object and its
tokenizer; a model object the user passes is used as it is (never moved or cast).
"""

from __future__ import annotations

import os
from typing import Any

from specdec.errors import SpecDecError
from specdec.models import load_model

ModelSpec = str | os.PathLike[str] | Any

_LOADED: dict[str, tuple[Any, Any]] = {}


def resolve_model(
    model: ModelSpec, tokenizer: Any, device: Any = None, dtype: Any = None, engine: str = "auto"
) -> tuple[Any, Any]:
    """A model object (loading a path or "default" once per process and placement) and its tokenizer.

    ``device`` and ``dtype`` place a model that specdec loads; a model object the user
    passes stays where it is (specdec never moves or casts the user's model). A GGUF file loads
    blocks-only where ``engine`` may be specdec's (``weights="auto"`` of :func:`~specdec.models.load_model`),
    else dense: the other engines cannot run a blocks-only model.
    """
    if isinstance(model, (str, os.PathLike)):
        weights = "auto" if engine in ("auto", "specdec") else "dense"
        key = f"{model}|{device}|{dtype}|{weights}"
        if key not in _LOADED:
            _LOADED[key] = load_model(None if str(model) == "default" else model, device=device, dtype=dtype,
                                      weights=weights)  # fmt: skip
        loaded_model, loaded_tokenizer = _LOADED[key]
        return loaded_model, tokenizer if tokenizer is not None else loaded_tokenizer
    if model is None:
        raise SpecDecError("model is None: pass a Hugging Face causal LM, a checkpoint path or 'default'")
    if device is not None or dtype is not None:
        raise SpecDecError(
            "device= and dtype= place a model that specdec loads (a path or 'default'); move your own model "
            "object with model.to(...) before passing it"
        )
    return model, tokenizer
