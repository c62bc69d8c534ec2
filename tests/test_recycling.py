"""Token Recycling: hand cases, the production drafter against the reference, templates, losslessness.

Layers: hand cases (matrix writes, unknown rows, repeats, state lifetime); properties
(production equals :mod:`specdec.reference.recycling` on random templates and feedback
streams; greedy templates are optimal under their model); differential (speculative
output equals plain greedy decoding on tiny fp64 models of every architecture); errors.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, tiny_model

import specdec
from specdec.commands.recycling_template import (
    build_template,
    calibration_template,
    counts_from_meta,
    measure_acceptance,
)
from specdec.drafters import make_factory
from specdec.drafters.recycling import RecyclingConfig, RecyclingDrafter
from specdec.drafters.recycling_templates import (
    AcceptanceCounts,
    TreeTemplate,
    grow_template,
    resolve_template,
    saved_template,
)
from specdec.errors import SpecDecError
from specdec.reference.recycling import ReferenceRecycling
from specdec.types import Feedback

SMALL = TreeTemplate.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], "small")


def feedback(tokens: list[int], rows: list[list[int]], accepted: tuple[int, ...] = ()) -> Feedback:
    return Feedback(np.asarray(tokens, dtype=np.int64), np.asarray(rows, dtype=np.int64), accepted)


def drafter(template: TreeTemplate = SMALL, k: int = 2, vocab: int | None = 50) -> RecyclingDrafter:
    return RecyclingDrafter(RecyclingConfig(k=k, template=template), vocab, template)


# -- hand cases -------------------------------------------------------------------------
def test_template_filled_from_the_matrix() -> None:
    d = drafter()
    d.reset([1, 2], feedback([10, 11, 12], [[11, 12], [13, 14], [15, 16]]))
    tree = d.propose(10, 10)
    # root 10 -> ranks 0,1 of row 10 = 11, 12; under 11: 13, 14; under 12: 15; under 13: unknown row
    assert tree.tokens == (10, 11, 12, 13, 14, 15)
    assert tree.parents == (-1, 0, 0, 1, 1, 2)
    assert d.last_nodes == [0, 1, 2, 3, 4, 5]  # the template's [0,0,0] node had no row to fill it
    assert tree.source == "recycling"


def test_unknown_rows_drop_whole_subtrees() -> None:
    d = drafter()
    d.write(np.array([10, 12]), np.array([[11, 12], [15, 16]]))
    tree = d.propose(10, 10)
    # 11 has no row: template nodes [0,0], [0,1] and [0,0,0] are dropped; [1,0] (node 5) stays under 12
    assert tree.tokens == (10, 11, 12, 15)
    assert tree.parents == (-1, 0, 0, 2)
    assert d.last_nodes == [0, 1, 2, 5]
    assert d.propose(49, 10).size == 1  # a token never seen: just the root


def test_budget_cuts_a_prefix_and_num_nodes_defaults() -> None:
    d = drafter()
    d.write(np.array([10, 11, 12, 13]), np.array([[11, 12], [13, 14], [15, 16], [17, 18]]))
    full = d.propose(10, 100)
    for budget in range(1, full.size + 1):
        assert d.propose(10, budget).tokens == full.tokens[:budget]
    small = RecyclingDrafter(RecyclingConfig(k=2, template=SMALL, num_nodes=3), 50, SMALL)
    small.matrix[:] = d.matrix
    assert small.propose(10, 100).size == 3


def test_repeated_tokens_last_writer_wins_and_accepted_path_wins() -> None:
    d = drafter()
    d.write(np.array([5, 6, 5]), np.array([[1, 2], [3, 4], [7, 8]]))
    assert d.matrix[5].tolist() == [7, 8]  # the later row
    d.write(np.array([5, 6, 5]), np.array([[1, 2], [3, 4], [7, 8]]), last=[0])
    assert d.matrix[5].tolist() == [1, 2]  # the accepted path's row
    d.update([5], feedback([5, 6, 5], [[9, 10], [3, 4], [11, 12]], (0,)))
    assert d.matrix[5].tolist() == [9, 10]


def test_matrix_grows_when_the_vocabulary_is_unknown() -> None:
    d = drafter(vocab=None)
    assert d.propose(1000, 10).size == 1
    d.write(np.array([1000]), np.array([[7, 8]]))
    assert d.matrix.shape[0] > 1000
    assert d.propose(1000, 10).tokens == (1000, 7, 8)
    assert d.matrix[999].tolist() == [-1, -1]


def test_state_lifetime_object_keeps_it_name_starts_fresh() -> None:
    model = tiny_model("llama")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    kept = RecyclingDrafter(RecyclingConfig(template="breadth-first-16"))
    specdec.run(model, prompt, kept, max_new_tokens=20, budget="full")
    learned = int((kept.matrix[:, 0] >= 0).sum())
    assert learned > 0
    kept.reset(prompt)  # a new sequence keeps what was learned
    assert int((kept.matrix[:, 0] >= 0).sum()) == learned
    kept.clear()
    assert int((kept.matrix >= 0).sum()) == 0
    generator = specdec.Generator(model, drafter="recycling")
    first, second = generator.new_drafter(), generator.new_drafter()
    assert first is not second
    assert isinstance(second, RecyclingDrafter) and int((second.matrix >= 0).sum()) == 0


def test_prompt_feedback_writes_the_models_top_k_after_each_prompt_token() -> None:
    model = tiny_model("qwen2")
    prompt = [7, 8, 9, 7, 10, 11]
    d = RecyclingDrafter(RecyclingConfig(k=4, template="breadth-first-8"))
    specdec.run(model, prompt, d, max_new_tokens=1, prompt_feedback=True, budget="full")  # prefill only
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    top = logits.topk(4, dim=-1).indices
    for token, position in {t: i for i, t in enumerate(prompt)}.items():  # later positions win
        assert d.matrix[token].tolist() == top[position].tolist()
    cold = RecyclingDrafter(RecyclingConfig(k=4, template="breadth-first-8"))
    specdec.run(model, prompt, cold, max_new_tokens=1, budget="full")
    assert int((cold.matrix >= 0).sum()) == 0


# -- production against the reference --------------------------------------------------
@st.composite
def templates(draw: st.DrawFn, k: int) -> list[tuple[int, ...]]:
    """Random prefix-closed rank paths, parents first, ranks below k."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(0, 25))):
        parent = draw(st.sampled_from([(), *paths]))
        if len(parent) < 5:
            child = (*parent, draw(st.integers(0, k - 1)))
            if child not in paths:
                paths.append(child)
    return paths


@settings(max_examples=200, deadline=None)
@given(data=st.data(), k=st.integers(1, 5), vocab=st.integers(2, 12), seed=st.integers(0, 10**6))
def test_production_equals_reference(data: st.DataObject, k: int, vocab: int, seed: int) -> None:
    paths = data.draw(templates(k))
    template = TreeTemplate.from_paths(paths)
    production = RecyclingDrafter(RecyclingConfig(k=k, template=template), vocab if seed % 2 else None, template)
    reference = ReferenceRecycling(paths, k)
    rng = random.Random(seed)
    for _ in range(8):
        n = rng.randrange(0, 12)
        tokens = [rng.randrange(vocab) for _ in range(n)]
        rows = [rng.sample(range(vocab + 3), k) for _ in range(n)]  # distinct, as a top-k is; some past vocab
        accepted = tuple(sorted(rng.sample(range(n), rng.randrange(0, n + 1))))
        production.update([], feedback(tokens, rows, accepted) if n else None)
        reference.write(tokens, rows, accepted)
        for budget in (1, 2, rng.randrange(1, 30)):
            pending = rng.randrange(vocab + 3)
            ours = production.propose(pending, budget)
            theirs = reference.draft(pending, min(budget, template.size))
            assert (ours.tokens, ours.parents) == (theirs.tokens, theirs.parents), (paths, budget)


# -- templates ---------------------------------------------------------------------------
def test_breadth_first_and_level_counts() -> None:
    bfs = TreeTemplate.breadth_first(12, 3)
    assert bfs.paths[:4] == ((0,), (1,), (2,), (0, 0))
    assert bfs.level_counts() == [3, 8]
    assert resolve_template("breadth-first-12", 3).paths == bfs.paths


def _expected(paths: list[tuple[int, ...]], rates: np.ndarray) -> float:
    return sum(float(np.prod([rates[d, r] for d, r in enumerate(p)])) for p in paths)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 7))
def test_grown_template_is_the_best_tree_of_its_size(seed: int, n: int) -> None:
    """Brute force over every prefix-closed set of n - 1 nodes (depth <= 3, k = 2)."""
    rates = np.random.default_rng(seed).random((3, 2))
    grown = grow_template(rates, n)
    assert grown.values is not None
    assert list(grown.values) == sorted(grown.values, reverse=True)
    assert grown.expected_accepted() == pytest.approx(_expected(list(grown.paths), rates))
    universe = [p for d in (1, 2, 3) for p in itertools.product(range(2), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(universe, n - 1):
        chosen = set(subset)
        if all(len(p) == 1 or p[:-1] in chosen for p in chosen):
            best = max(best, _expected(list(subset), rates))
    assert grown.size == n
    assert grown.expected_accepted() == pytest.approx(best)


def test_acceptance_counts_and_rates() -> None:
    counts = AcceptanceCounts(max_depth=3, k=2)
    # tree = SMALL's first 5 nodes; accepted path root -> [0] -> [0,1]
    counts.record(SMALL, [0, 1, 2, 3, 4], list(SMALL.parents[:5]), [0, 1, 4])
    assert counts.offered.tolist() == [[1, 1], [1, 1], [0, 0]]
    assert counts.accepted.tolist() == [[1, 0], [0, 1], [0, 0]]
    rates = counts.rates(min_offered=1)
    # depth 2's rank 1 beating rank 0 is pooled; depth 3 was never offered: depth 2 stands in
    assert rates.tolist() == [[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]
    assert counts.rates(min_offered=2).tolist() == [[0.0, 0.0]] * 3


def test_template_json_round_trip(tmp_path: Path) -> None:
    grown = grow_template(np.array([[0.5, 0.2], [0.4, 0.1]]), 5, "x", default_nodes=3, meta={"why": "test"})
    grown.save(tmp_path / "t.json")
    loaded = TreeTemplate.load(tmp_path / "t.json")
    assert loaded.paths == grown.paths and loaded.default_nodes == 3 and loaded.meta == {"why": "test"}
    assert loaded.values == pytest.approx(grown.values)
    assert resolve_template(str(tmp_path / "t.json")).paths == grown.paths


def test_saved_default_template_is_measured() -> None:
    template = saved_template("default")
    assert template.max_rank < 8 and template.values is not None and template.size == 81
    counts = counts_from_meta(template.meta)
    assert counts.steps > 0 and (counts.offered >= counts.accepted).all()
    # the shipped tree is exactly what its recorded counts grow (nothing hand-edited)
    regrown = build_template(counts, template.size, template.name, template.meta["min_offered"], {})
    assert regrown.paths == template.paths
    assert np.allclose(regrown.meta["rates"], template.meta["rates"])
    default = make_factory("recycling").create()
    assert isinstance(default, RecyclingDrafter) and default.num_nodes == 81


def test_rates_are_non_increasing_in_rank() -> None:
    counts = AcceptanceCounts(max_depth=1, k=3)
    counts.offered[:] = [[100, 100, 100]]
    counts.accepted[:] = [[40, 10, 30]]  # rank 2 beating rank 1 is noise: pooled to their weighted mean
    assert counts.rates(min_offered=1).tolist() == [[0.4, 0.2, 0.2]]


def test_calibration_counts_what_the_run_accepted() -> None:
    model = tiny_model("llama")
    probe = calibration_template(num_nodes=30, max_depth=3, k=4)
    assert probe.size == 30 and all((0,) * d + (j,) in probe.paths for d in range(3) for j in range(4))
    results = []
    prompts = [random_prompt(random.Random(i)) for i in range(3)]
    counts = measure_acceptance(model, prompts, probe, k=4, max_new_tokens=40, progress=lambda i, r: results.append(r))
    accepted = sum(sum(rec.accepted for rec in r.stats.records) for r in results)
    # every accepted draft token is one accepted (depth, rank) node, except in steps the
    # engine pruned near max_new_tokens, which are not counted (at most the last 3 per prompt)
    tail = sum(sum(rec.accepted for rec in r.stats.records[-3:]) for r in results)
    assert accepted - tail <= int(counts.accepted.sum()) <= accepted
    assert accepted > 0 and (counts.offered >= counts.accepted).all()


# -- losslessness ------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_recycling_matches_plain_greedy(arch: str) -> None:
    """Fresh drafters (prompt feedback on and off) and one drafter kept across prompts, several budgets."""
    model = tiny_model(arch)
    rng = random.Random(f"recycling-{arch}")
    kept = RecyclingDrafter(RecyclingConfig(template="breadth-first-24"))
    accepted = 0
    for i in range(3):
        prompt = random_prompt(rng)
        max_new = rng.randrange(1, 60) if i else 60
        expected = hf_greedy(model, prompt, max_new)
        runs = {
            "fresh": specdec.run(model, prompt, "recycling", max_new_tokens=max_new, budget="full"),
            "fresh+pf": specdec.run(
                model, prompt, "recycling", max_new_tokens=max_new, prompt_feedback=True, budget="full"
            ),
            "kept": specdec.run(model, prompt, kept, max_new_tokens=max_new, budget=rng.choice(["full", 4, 9])),
        }
        for label, result in runs.items():
            assert result.tokens == expected, f"{arch}/recycling {label}: prompt {prompt}"
            IDENTITY_COUNTS[f"{arch}/recycling"] += 1
            accepted += sum(r.accepted for r in result.stats.records)
    assert accepted > 0  # regression guard: recycled drafts were accepted


def test_recycling_eager_attention_and_auto_budget() -> None:
    model = tiny_model("llama", "eager")
    prompt = random_prompt(random.Random(5))
    result = specdec.run(model, prompt, "recycling", max_new_tokens=40, budget="full")
    assert result.tokens == hf_greedy(model, prompt, 40)
    assert result.stats.mean_tree_size > 1
    planned = specdec.run(model, prompt, "recycling", max_new_tokens=40)  # budget="auto": the planner cuts trees
    assert planned.tokens == result.tokens


# -- errors ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 0}, "k must be a positive int, got 0"),
        ({"num_nodes": 0}, "num_nodes must be a positive int, got 0"),
        ({"k": 2}, "uses rank [3-7], but the matrix keeps only k=2"),
        ({"template": "nope"}, "unknown tree template 'nope'"),
        ({"template": "breadth-first-x"}, "expected breadth-first-N"),
        ({"template": "/no/such/file.json"}, "cannot read tree template '/no/such/file.json'"),
        ({"template": [[0], [1, 0]]}, r"path \[1, 0\] comes before its parent \[1\]"),
        ({"template": [[0], [0]]}, r"path \[0\] appears twice"),
        ({"template": [[0], []]}, "path 1 is empty"),
        ({"template": [[-1]]}, r"path \[-1\] holds a rank that is not an int >= 0"),
        ({"template": 7}, "a tree template is a name, a file or rank paths, got int"),
        ({"size": 3}, "drafter 'recycling' has no option 'size'; valid options: k, template, num_nodes"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(SpecDecError, match=message):
        make_factory("recycling", options)


def test_bad_template_files_and_values_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(SpecDecError, match="is not a tree template"):
        TreeTemplate.load(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"format": "specdec-tree-template", "version": 9, "paths": []}))
    with pytest.raises(SpecDecError, match="unsupported template version 9"):
        TreeTemplate.load(tmp_path / "b.json")
    with pytest.raises(SpecDecError, match="2 values for 1 paths"):
        TreeTemplate.from_paths([[0]], values=(0.5, 0.2))
    with pytest.raises(SpecDecError, match="default_nodes 5 is outside"):
        TreeTemplate.from_paths([[0]], default_nodes=5)
    with pytest.raises(SpecDecError, match="no saved tree template 'x'"):
        saved_template("x")
    with pytest.raises(SpecDecError, match="rates must be probabilities"):
        grow_template(np.array([[1.5]]), 3)
    with pytest.raises(SpecDecError, match=r"rates must be a \[depth, k\] array"):
        grow_template(np.array([0.5]), 3)
    with pytest.raises(SpecDecError, match="carries no calibrated values"):
        SMALL.expected_accepted()


def test_feedback_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(SpecDecError, match=r"needs top-2 feedback for 1 tokens, got shape \(1, 1\)"):
        drafter().update([5], feedback([5], [[1]]))
