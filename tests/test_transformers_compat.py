"""No deprecation warning from transformers or torch on any path specdec drives.

transformers renames an argument with a FutureWarning some releases before it removes it
(5.24: ``past_key_values`` became ``cache``, the old name goes in 5.40). Each path that runs
the model runs here while every warning is recorded: the dynamic cache, the static cache
(eager, and compiled by inductor), specdec's own forward (``engine="specdec"``), and
``model.generate(..., custom_generate=specdec.hf_generate(...))`` on each of them. A
FutureWarning or DeprecationWarning fails the test and is shown. pyproject's
``filterwarnings`` turns them into errors in every other test too; this file is where each
path runs on purpose, and it also sees warnings that were already shown once in the process.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import transformers
from packaging import version
from tiny_models import ARCHITECTURES, tiny_model

import specdec
from specdec.backends.specdec_engine.model_runner import ARCHITECTURES as NATIVE_ARCHITECTURES
from specdec.models import cache_keyword

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
CASES = [(arch, engine) for arch in ARCHITECTURES for engine in ("hf", "buckets")]
CASES += [(arch, "specdec") for arch in ARCHITECTURES if arch in NATIVE_ARCHITECTURES]
CASES += [("llama", "compiled")]  # compiling imports more of torch: its warnings count too


def deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]


@pytest.mark.parametrize(("arch", "engine"), CASES)
def test_no_deprecation_warning_on_any_path(arch: str, engine: str) -> None:
    model = tiny_model(arch)
    ids = torch.tensor([PROMPT])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = specdec.run(model, PROMPT, "pld", max_new_tokens=12, engine=engine, budget="full")
        hook = specdec.hf_generate("pld", engine=engine, budget="full")
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             custom_generate=hook)  # fmt: skip
    assert result.stats.engine.startswith(engine)  # the path named is the path that ran
    assert hook.last_result is not None and hook.last_result.stats.engine == result.stats.engine
    assert out[0, len(PROMPT) :].tolist() == result.tokens
    assert deprecations(caught) == []


def test_the_cache_goes_by_the_name_the_forward_takes() -> None:
    """5.24 takes ``cache`` (``past_key_values`` warns); 5.0-5.23 know only ``past_key_values``."""
    expected = "cache" if version.parse(transformers.__version__) >= version.parse("5.24") else "past_key_values"
    for arch in ARCHITECTURES:
        assert cache_keyword(tiny_model(arch)) == expected, arch


def test_the_old_name_warns_where_it_is_deprecated() -> None:
    """The check above cannot pass vacuously: on 5.24+, ``past_key_values`` does warn."""
    if version.parse(transformers.__version__) < version.parse("5.24"):
        pytest.skip(f"transformers {transformers.__version__} has no cache keyword to be renamed to")
    model = tiny_model("llama")
    cache: Any = transformers.DynamicCache(config=model.config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(input_ids=torch.tensor([PROMPT]), past_key_values=cache, use_cache=True)
    assert any("past_key_values" in line for line in deprecations(caught))
