"""The engines' table (specdec/backends/engines.py): each row builds what it says, and ``auto`` says why."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from specdec.backends import ENGINES, auto_engine, auto_engine_reason, make_verifier, resolve_engine
from specdec.backends.engines import TABLE, choose_engine, engine_row, row_of
from specdec.errors import SpecDecError


def test_each_row_builds_a_verifier_of_its_engine_and_cache_kind() -> None:
    model = tiny_model("llama")
    assert ("auto", *TABLE) == ENGINES and {"hf", "specdec", "buckets", "compiled", "graphs"} <= set(TABLE)
    for name, row in TABLE.items():
        assert row.name == name and (row.mode is None) == (name in ("hf", "specdec"))
        if row.cuda_only:
            with pytest.raises(SpecDecError, match=f"engine {name!r} needs a model on a CUDA device"):
                make_verifier(model, name, tree_ops="torch")
            continue
        verifier = make_verifier(model, name, tree_ops="torch")
        assert verifier.engine == name and verifier.forward.cache_kind == row.cache_kind and row_of(verifier) is row
        verifier.close()
    assert row_of(object()) is None


def test_a_batch_verifier_only_where_the_row_gives_one() -> None:
    model = tiny_model("llama")
    alone = make_verifier(model, "buckets", tree_ops="torch")
    batch = TABLE["buckets"].batch
    assert batch is not None and TABLE["hf"].batch is None and TABLE["specdec"].batch is None
    rows = batch(alone, 3)
    assert rows is not alone and rows.engine == "buckets" and batch(rows, 3) is rows  # rows already: itself
    assert batch(make_verifier(model, "hf", tree_ops="torch"), 3).engine == "hf"  # not the buckets: itself
    rows.close()
    alone.close()


def test_names_are_checked_in_one_place() -> None:
    with pytest.raises(SpecDecError, match="unknown engine 'stattic'; valid names: auto, hf, specdec, buckets"):
        engine_row("stattic")
    with pytest.raises(SpecDecError, match="unknown engine 'auto'"):
        engine_row("auto")  # auto is a choice, not a row
    with pytest.raises(SpecDecError, match="unknown engine 3"):
        resolve_engine(3, torch.device("cpu"))  # type: ignore[arg-type]


def test_auto_gives_its_choice_and_reason_together() -> None:
    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_engine(llama, cpu) == ("specdec", auto_engine_reason(llama, cpu))
    assert choose_engine(gpt2, cpu)[0] == "hf" == auto_engine(gpt2, cpu) and "'gpt2'" in choose_engine(gpt2, cpu)[1]
    assert choose_engine(llama, cuda)[0] == "graphs" == resolve_engine("auto", cuda, llama)
    for model in (llama, gpt2):
        for device in (cpu, cuda):
            choice, reason = choose_engine(model, device)
            assert choice in TABLE and reason and resolve_engine("auto", device, model) == choice
