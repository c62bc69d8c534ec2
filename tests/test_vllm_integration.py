"""specdec.integrations.vllm without vLLM: the proposer against a replayed engine.

:class:`~specdec.integrations.vllm_replay.BatchReplay` plays vLLM's side of the ``custom_class``
interface as the installed vLLM 0.32 does (``token_ids_cpu`` rows, ``num_tokens_no_spec``,
the tokens each row sampled, rows that move when the batch is condensed) with a greedy
target whose outputs are known. The real engine is checked by ``scripts/vllm_check.sh``.

Test layers: hand cases (chains from trees, bad input), differential (every chain the
proposer sends equals a fresh drafter's on the same context: the incremental per-row
state is exact), regression guards (states built once per request, freed when requests
leave; something is drafted).
"""

from __future__ import annotations

import itertools
import json
import random
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_suffix_automaton import sam_native  # noqa: F401
from tiny_models import VOCAB, tiny_model

from specdec.budget.acceptance import AcceptanceModel, node_keys
from specdec.cachefiles import TokenizerIdentity
from specdec.commands.vllm_flags import main
from specdec.errors import DatastoreError, SpecDecError
from specdec.integrations.vllm import (
    CONFIG_KEY,
    PROPOSER,
    DrafterSpec,
    Proposer,
    best_chain,
    best_path,
    engine_args,
    serve_flags,
)
from specdec.integrations.vllm_replay import BatchReplay
from specdec.types import DraftTree

# The compiled automata (sam is the default drafter): a build failure fails (conftest.native_or_skip).
pytestmark = pytest.mark.usefixtures("sam_native")

K = 6
MAX_LEN = 512


def vllm_config(entry: Any = None, k: int = K, max_len: int = MAX_LEN, tokenizer: str | None = None,
                additional: Any = None) -> Any:
    """The attributes of vLLM's VllmConfig that the proposer reads."""
    model_config = SimpleNamespace(max_model_len=max_len, tokenizer=tokenizer, model=tokenizer, tokenizer_revision=None,
                                   trust_remote_code=False, get_vocab_size=lambda: VOCAB)
    if additional is None:
        additional = {} if entry is None else {CONFIG_KEY: entry}
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model_config,
                           additional_config=additional)


def phrase_text(rng: random.Random, length: int, phrases: int = 6) -> list[int]:
    """Random phrases repeated with noise: long matches for suffix automata, as real text has."""
    pool = [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(4, 12))] for _ in range(phrases)]
    text: list[int] = []
    while len(text) < length:
        text += rng.choice(pool) if rng.random() < 0.8 else [rng.randrange(2, VOCAB)]
    return text[:length]


class Spy:
    """Wraps a drafter: counts the tokens it is given, keeps its last tree, forwards ``finish``."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.feedback_topk = inner, inner.name, inner.feedback_topk
        self.given = 0
        self.finished = 0
        self.last_tree: DraftTree | None = None

    def reset(self, prompt: Any, feedback: Any = None) -> None:
        self.given += len(prompt)
        self.inner.reset(prompt)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        self.last_tree = self.inner.propose(pending, max_nodes)
        return self.last_tree

    def update(self, accepted: Any, feedback: Any) -> None:
        self.given += len(accepted)
        self.inner.update(accepted, feedback)

    def finish(self) -> None:
        self.finished += 1
        getattr(self.inner, "finish", lambda: None)()


class SpyFactory:
    """The proposer's own factory (its shared indexes and store), making :class:`Spy` drafters."""

    def __init__(self, proposer: Proposer) -> None:
        self.inner = proposer.factory
        self.name = self.inner.name
        self.spies: list[Spy] = []
        proposer.factory = self

    def create(self) -> Spy:
        self.spies.append(Spy(self.inner.create()))
        return self.spies[-1]

    def fresh_tree(self, context: list[int], max_nodes: int) -> DraftTree:
        """The tree a drafter built from the whole context proposes (shared store included)."""
        fresh = self.inner.create()
        fresh.reset(context[:-1])
        return fresh.propose(context[-1], max_nodes)


def root_paths(tree: DraftTree, max_tokens: int) -> set[tuple[int, ...]]:
    """The token sequences of every path from the root, root excluded, at most ``max_tokens`` long."""
    return {tuple(tree.tokens[i] for i in tree.path_to(node)[1:]) for node in range(1, tree.size)
            if tree.depths[node] <= max_tokens}


def checked_steps(engine: BatchReplay, spies: SpyFactory, steps: int) -> int:
    """Run ``steps`` calls. Each row's drafter must propose what a fresh drafter proposes on the
    row's context (the incremental per-row state is exact), and the chain sent must be a path
    of that tree from the root. Returns how many trees had branches."""
    proposer = engine.proposer
    assert isinstance(proposer, Proposer)
    k = proposer.num_speculative_tokens
    branched = 0
    for _ in range(steps):
        contexts = [engine.context(row) for row in range(engine.num_rows)]
        live = [bool(s) for s in engine.sampled]
        # (before the call: at its end the proposer may free a finished request's state, whose
        # text then enters the store the drafters share)
        fresh = [spies.fresh_tree(context, k + 1) if alive else None for context, alive in zip(contexts, live,
                                                                                              strict=True)]
        drafts = engine.step()
        for row, context in enumerate(contexts):
            expected = fresh[row]
            if expected is None:
                assert drafts[row] == []
                continue
            spy = proposer.drafter_of(row)
            assert isinstance(spy, Spy) and spy.last_tree is not None
            where = f"row {row} at length {len(context)}"
            assert (spy.last_tree.tokens, spy.last_tree.parents) == (expected.tokens, expected.parents), where
            assert tuple(drafts[row]) in root_paths(expected, k) | {()}, where
            branched += not expected.is_chain
            spy.last_tree = None
    return branched


# -- the per-row state --------------------------------------------------------------------


@pytest.mark.parametrize(("drafter", "options"), [("sam", {}), ("pld", {}), ("sam+pld", {}),
                                                  ("sam", {"max_children": 1})])
def test_each_row_drafts_as_a_fresh_drafter_on_its_context(drafter: str, options: dict[str, Any],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    proposer = Proposer(vllm_config({"drafter": drafter, "options": options, "min_accept": 0.0}))
    # The acceptance model the proposer lends its drafters (composites order merged trees by it)
    # learns within a call; frozen here, so a fresh drafter after the call orders nodes alike.
    monkeypatch.setattr(proposer.acceptance, "observe", lambda *args: None)
    spies = SpyFactory(proposer)
    engine = BatchReplay(proposer)
    for _ in range(5):
        text = phrase_text(rng, rng.randrange(120, 200))
        cut = rng.randrange(20, 60)
        engine.add(text[:cut], text[cut:])
    branched = checked_steps(engine, spies, 40)
    assert proposer.stats.fresh_states == len(spies.spies) == 5  # one state per request: advanced, never rebuilt
    assert proposer.stats.drafted_rows > 0 and engine.accepted > 0  # something was drafted and accepted
    assert proposer.stats.accepted_tokens == engine.reported  # acceptance read back from the rows
    if drafter == "sam" and not options:
        assert branched > 0  # sam's occurrence trees: chains were chosen from real trees


def test_work_per_step_is_the_new_tokens_only() -> None:
    rng = random.Random(3)
    proposer = Proposer(vllm_config({"drafter": "sam"}))
    spies = SpyFactory(proposer)
    engine = BatchReplay(proposer)
    for _ in range(4):
        text = phrase_text(rng, 300)
        engine.add(text[:100], text[100:])
    for _ in range(30):
        seen = engine.lengths[: engine.num_rows].copy()  # the contexts of the call below
        engine.step()
    # Every token of those contexts reached its drafter exactly once (the pending tokens not yet).
    assert sum(spy.given for spy in spies.spies) == sum(int(n) - 1 for n in seen)


def test_moved_rows_keep_their_state_and_others_start_fresh() -> None:
    rng = random.Random(11)
    proposer = Proposer(vllm_config({"drafter": "sam"}))
    spies = SpyFactory(proposer)
    engine = BatchReplay(proposer)
    texts = [phrase_text(rng, 260) for _ in range(4)]
    for text in texts:
        engine.add(text[:40], text[40:])
    checked_steps(engine, spies, 5)
    assert proposer.stats.fresh_states == 4
    engine.move(3, 1)  # request 1 finished; request 3 moved into its row
    checked_steps(engine, spies, 5)
    assert (proposer.stats.fresh_states, proposer.stats.moved_states) == (4, 1)
    assert proposer.num_states == 3  # request 1's state was freed...
    assert [spy.finished for spy in spies.spies] == [0, 1, 0, 0]  # ...and its text handed to the shared store
    new = phrase_text(rng, 200)
    engine.add(new[:30], new[30:], row=0)  # another request takes row 0: its tokens do not extend the state
    checked_steps(engine, spies, 5)  # (the fresh drafters share the store: request 1's text included)
    assert proposer.stats.fresh_states == 5
    assert proposer.num_states == 3  # the replaced state was freed one call later
    assert [spy.finished for spy in spies.spies] == [1, 1, 0, 0, 0]


def test_rows_without_new_tokens_get_no_draft_and_keep_their_state() -> None:
    text = [5, 6, 7, 8, 9, 10, 11] * 20
    proposer = Proposer(vllm_config({"drafter": "pld"}))
    spies = SpyFactory(proposer)
    engine = BatchReplay(proposer)
    engine.add(text[:30], text[30:])
    engine.add(text[:20], text[20:])
    engine.step()
    engine.sampled[1] = []  # e.g. a prefill chunk or a discarded sample this step
    before = proposer.stats.fresh_states
    drafts = engine.step()
    assert drafts[1] == [] and drafts[0] != []
    engine.sampled[1] = [int(engine.token_ids[1, engine.lengths[1] - 1])]
    checked_steps(engine, spies, 3)
    assert proposer.stats.fresh_states == before


def test_all_finished_frees_every_state() -> None:
    text = [3, 4, 5, 6] * 30
    proposer = Proposer(vllm_config({"drafter": "pld"}))
    engine = BatchReplay(proposer)
    engine.add(text[:10], text[10:])
    engine.step()
    assert proposer.num_states == 1
    empty = np.zeros(1, np.int32), np.zeros((1, MAX_LEN), np.int32)
    assert proposer.propose([], *empty) == []
    proposer.propose([], *empty)
    assert proposer.num_states == 1  # detached, and claimable in this call and the next
    proposer.propose([], *empty)
    assert proposer.num_states == 0


def test_drafts_stop_at_max_model_len() -> None:
    text = [3, 4, 5, 6] * 30
    proposer = Proposer(vllm_config({"drafter": "pld"}, k=8, max_len=64))
    engine = BatchReplay(proposer, max_len=64)
    engine.add(text[:50], text[50:64])
    sent = []
    while not engine.done:
        length = int(engine.lengths[0])
        sent.append((length, len(engine.step()[0])))  # (BatchReplay also refuses a draft past max_model_len)
    assert engine.context(0) == text[:64]
    assert all(length + size <= 64 for length, size in sent)
    assert any(0 < size < 8 and length + size == 64 for length, size in sent)  # a draft the limit cut


def test_greedy_output_of_a_tiny_model_is_reproduced() -> None:
    """The simulated engine emits the target's greedy output whatever the drafts (a guard on the fake)."""
    import torch

    model = tiny_model("llama")
    rng = random.Random(5)
    prompts = [phrase_text(rng, 40) for _ in range(3)]
    engine = BatchReplay(Proposer(vllm_config({"drafter": "sam", "options": {"l_threshold": 2}})))
    for prompt in prompts:
        output = model.generate(torch.tensor([prompt]), max_new_tokens=80, do_sample=False,
                                pad_token_id=0)[0, len(prompt):].tolist()
        engine.add(prompt, output)
    steps = 0
    while any(int(engine.lengths[row]) < len(engine.truth[row]) for row in range(engine.num_rows)):
        engine.step()
        steps += 1
    for row in range(engine.num_rows):
        assert engine.context(row) == engine.truth[row]
    assert steps < 80  # drafts were accepted: fewer steps than tokens


# -- trees become chains -------------------------------------------------------------------


def test_min_accept_sends_only_likely_tokens() -> None:
    """Chains are cut where the acceptance model's p falls below min_accept; the model learns
    from what the engine accepted, so a drafter that is always right gets longer chains."""
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13] * 40
    lengths = {}
    for min_accept in (0.0, 0.2, 0.5, 0.9):
        proposer = Proposer(vllm_config({"drafter": "pld", "min_accept": min_accept}, k=8))
        engine = BatchReplay(proposer)
        engine.add(text[:20], text[20:])
        first = engine.step()[0]
        engine.run()
        lengths[min_accept] = (len(first), proposer.stats.draft_tokens / proposer.stats.drafted_rows)
    # Nothing learned yet (conditional acceptance 0.5 per token): all 8, p >= 0.25: two, p >= 0.5: one,
    # and none above the prior...
    assert [lengths[m][0] for m in (0.0, 0.2, 0.5, 0.9)] == [8, 2, 1, 0]
    # ...but the repeating text taught the model (through probes past the cut, where it cut all): chains grew.
    assert lengths[0.5][1] > 4 and lengths[0.9][1] > 2
    with pytest.raises(SpecDecError, match="min_accept"):
        Proposer(vllm_config({"drafter": "pld", "min_accept": 1.0}))


def test_docstring_examples_run() -> None:
    import doctest

    import specdec.integrations.vllm as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def random_tree(rng: random.Random, size: int) -> DraftTree:
    tokens, parents = [0], [-1]
    children: list[set[int]] = [set()]
    for _ in range(size - 1):
        parent = rng.randrange(len(tokens))
        token = rng.randrange(1, 8)
        if token not in children[parent]:
            children[parent].add(token)
            tokens.append(token)
            parents.append(parent)
            children.append(set())
    return DraftTree(tuple(tokens), tuple(parents), "t", None, tuple(rng.randrange(3) for _ in tokens))


def test_memo_across_trees_keeps_the_acceptance_models_estimate() -> None:
    """One memo of conditional acceptances serves a whole batch of drafts (the model learns
    nothing between them): p equals a fresh estimate's, on a model that learned something."""
    rng = random.Random(0)
    model = AcceptanceModel()
    for _ in range(200):
        tree = random_tree(rng, rng.randrange(2, 12))
        path = tree.path_to(rng.randrange(tree.size))
        model.observe(tree, node_keys(tree), path)
    memo: dict[Any, float] = {}
    for _ in range(100):
        tree = random_tree(rng, rng.randrange(1, 16))
        expected = model.estimate(tree, node_keys(tree))[1]
        assert model.estimate_lists(tree, node_keys(tree), memo)[1] == expected.tolist()
        path = best_path(tree, 8, model).path
        assert path[0] == 0 and all(tree.parents[b] == a for a, b in itertools.pairwise(path))


def test_best_chain_hand_cases() -> None:
    model = AcceptanceModel()
    chain = DraftTree.chain(1, [2, 3, 4, 5])
    assert best_chain(chain, 2, model)[0].tokens == (1, 2, 3)  # a chain is cut, not chosen
    tree = DraftTree((0, 1, 2, 3, 4), (-1, 0, 0, 1, 3))  # root -> 1 -> 3 -> 4 and root -> 2
    found, keys = best_chain(tree, 8, model)
    assert found.tokens == (0, 1, 3, 4) and found.is_chain
    assert keys == [node_keys(tree)[i] for i in (0, 1, 3, 4)]
    assert best_chain(tree, 1, model)[0].tokens == (0, 1)  # equal scores: the drafter's order
    # Once the model has seen first-ranked children fail and second-ranked ones pass, it prefers rank 1.
    for _ in range(50):
        model.observe(DraftTree((0, 1), (-1, 0)), [("", -1, 0, 0), ("", -1, 1, 0)], (0,))
        model.observe(DraftTree((0, 1, 2), (-1, 0, 0)), node_keys(DraftTree((0, 1, 2), (-1, 0, 0))), (0, 2))
    assert best_chain(DraftTree((0, 1, 2), (-1, 0, 0)), 8, model)[0].tokens == (0, 2)


def test_tree_drafters_send_a_root_path(tmp_path: Path, sam_store: tuple[Path, Path, Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """REST and merged composites draft trees: each chain sent is a path of the drafter's tree."""
    from specdec.datastores.rest import build as build_rest

    tokenizer = sam_store[0]
    rng = random.Random(2)
    documents = [np.array(phrase_text(rng, 80), dtype=np.int64) for _ in range(40)]
    build_rest(documents, tmp_path / "c.rest", TokenizerIdentity.of(proposer_tokenizer(tokenizer)), progress=False)
    options = {"mode": "merge", "rest": {"datastore": str(tmp_path / "c.rest")}}
    proposer = Proposer(vllm_config({"drafter": "sam+rest", "options": options}, tokenizer=str(tokenizer)))
    monkeypatch.setattr(proposer.acceptance, "observe", lambda *args: None)  # as in the test above
    spies = SpyFactory(proposer)
    engine = BatchReplay(proposer)
    for _ in range(3):
        text = phrase_text(rng, 200)
        engine.add(text[:40], text[40:])
    assert checked_steps(engine, spies, 30) > 0
    assert engine.accepted > 0


# -- configuration and bad input -----------------------------------------------------------


def proposer_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def write_tokenizer(path: Path, prefix: str) -> Path:
    """A small word-level tokenizer saved as a checkpoint's tokenizer files (no hub)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"{prefix}{i}": i for i in range(VOCAB)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=f"{prefix}0")))
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sam_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A tokenizer directory, a sam datastore built for it and one built for another tokenizer."""
    from transformers import AutoTokenizer

    from specdec.datastores.sam import build

    root = tmp_path_factory.mktemp("vllm")
    ours = write_tokenizer(root / "ours", "w")
    other = write_tokenizer(root / "other", "x")
    rng = random.Random(4)
    documents = [np.array(phrase_text(rng, 60), dtype=np.int64) for _ in range(20)]
    for name, directory in (("ours.sam", ours), ("other.sam", other)):
        build(documents, root / name, TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory)), progress=False)
    return ours, root / "ours.sam", root / "other.sam"


def test_static_datastore_checked_against_the_engines_tokenizer(sam_store: tuple[Path, Path, Path]) -> None:
    tokenizer, good, foreign = sam_store
    proposer = Proposer(vllm_config({"drafter": "sam", "options": {"datastore": str(good)}}, tokenizer=str(tokenizer)))
    engine = BatchReplay(proposer)
    engine.add([2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15])
    engine.step()
    with pytest.raises(DatastoreError, match="another tokenizer"):
        Proposer(vllm_config({"drafter": "sam", "options": {"datastore": str(foreign)}}, tokenizer=str(tokenizer)))
    with pytest.raises(DatastoreError, match="another tokenizer"):
        engine_args("sam", datastore=foreign, tokenizer=tokenizer)
    with pytest.raises(DatastoreError, match="no datastore file"):
        Proposer(vllm_config({"drafter": "sam", "options": {"datastore": str(good) + ".missing"}},
                             tokenizer=str(tokenizer)))
    with pytest.raises(DatastoreError, match="no datastore file"):
        engine_args("sam", datastore=str(good) + ".missing")


@pytest.mark.parametrize(("entry", "message"), [
    ({"drafter": "samm"}, "unknown drafter 'samm'; valid names"),
    ({"drafter": "sam+samm"}, "unknown drafter 'samm' in composite"),
    ({"drafter": "recycling"}, "top-k predictions"),
    ({"drafter": "sam+recycling"}, "top-k predictions"),
    ({"drafter": "sam", "options": {"chain_lenght": 4}}, "has no option 'chain_lenght'"),
    ({"drafter": "sam", "options": [1]}, "must be a dict of drafter options"),
    ({"drafter": "sam", "option": {}}, "has no key 'option'"),
    ({"drafter": 3}, "must be a drafter name"),
    ("sam", "must be a dict"),
    ({"drafter": "rest"}, "needs a datastore"),
    ({"drafter": "pld", "options": {"num_draft": object()}}, "must be JSON values"),
])
def test_bad_input_fails_at_construction(entry: Any, message: str) -> None:
    with pytest.raises(SpecDecError, match=message):
        Proposer(vllm_config(entry))


def test_bad_engine_arguments() -> None:
    with pytest.raises(SpecDecError, match="unknown drafter 'nope'"):
        engine_args("nope")
    with pytest.raises(SpecDecError, match="num_speculative_tokens must be a positive int"):
        engine_args("sam", 0)
    with pytest.raises(SpecDecError, match="min_accept"):
        engine_args("sam", min_accept=-0.1)
    with pytest.raises(SpecDecError, match="num_speculative_tokens must be a positive int"):
        Proposer(vllm_config({"drafter": "sam"}, k=0))
    with pytest.raises(SpecDecError, match="cannot load the tokenizer"):
        engine_args("sam", datastore="x.sam", tokenizer="/nonexistent/checkpoint")
    with pytest.raises(SpecDecError, match="the engine names none"):
        Proposer(vllm_config({"drafter": "sam", "options": {"datastore": "x.sam"}}))


def test_defaults_without_an_entry() -> None:
    assert Proposer(vllm_config()).spec == DrafterSpec()  # sam with its defaults
    assert Proposer(vllm_config(additional=object())).spec.drafter == "sam"  # a non-dict additional_config


def test_engine_args_and_serve_flags(tmp_path: Path, sam_store: tuple[Path, Path, Path],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer, good, _ = sam_store
    monkeypatch.chdir(good.parent)
    args = engine_args("sam+pld", 5, tokenizer=str(tokenizer), stats_path="stats.json",
                       **{"sam.datastore": good.name, "pld": {"num_draft": 3}})
    assert args["speculative_config"] == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 5}
    entry = args["additional_config"][CONFIG_KEY]
    assert entry == {"drafter": "sam+pld", "options": {"sam.datastore": str(good), "pld": {"num_draft": 3}},
                     "stats_path": str(good.parent / "stats.json")}  # paths made absolute for the workers
    assert DrafterSpec.from_json(json.loads(json.dumps(entry))).to_json() == entry
    flags = serve_flags("pld", 3, num_draft=4)
    assert flags[0] == "--speculative-config" and json.loads(flags[1])["num_speculative_tokens"] == 3
    assert json.loads(flags[3]) == {CONFIG_KEY: {"drafter": "pld", "options": {"num_draft": 4}}}
    # The proposer built from what engine_args made runs, and writes its counters where asked.
    proposer = Proposer(vllm_config(entry, k=5, tokenizer=str(tokenizer)))
    engine = BatchReplay(proposer)
    engine.add([2, 3, 4, 2, 3, 4, 2, 3], [4, 2, 3, 4, 2, 3, 4, 2, 3, 4] * 5)
    for _ in range(Proposer.STATS_EVERY):
        engine.step()
    written = json.loads((good.parent / "stats.json").read_text())
    assert written["calls"] == Proposer.STATS_EVERY and written["drafter"] == "sam+pld"
    assert written["us_per_row"] > 0


def test_command_line_prints_serve_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pld", "-k", "4", "num_draft=3"]) == 0
    printed = capsys.readouterr().out
    assert "--speculative-config" in printed and '"num_draft": 3' in printed
    with pytest.raises(SystemExit):
        main(["nope"])
    assert "unknown drafter 'nope'" in capsys.readouterr().err


# -- the vLLM check's own pieces (no vLLM needed) ------------------------------------------------


def test_check_prompts_tables_and_differences(tmp_path: Path) -> None:
    from specdec.commands import vllm_check

    prompts, source = vllm_check.load_prompts(tmp_path / "absent.jsonl")
    assert source.startswith("built-in") and len(prompts) == 8
    assert sorted({p.kind for p in prompts}) == ["chat", "code edit", "math", "summary"]
    assert "def dedent" in prompts[0].text  # a real function to edit
    plain = vllm_check.Run("vllm", outputs=[[1, 2, 3], [4, 5]], seconds=2.0, cpu_s=1.0, prefill_s=1.0, tokens=5)
    other = vllm_check.Run("specdec-sam", outputs=[[1, 2, 3], [4, 6, 7]], seconds=1.0, cpu_s=0.5, prefill_s=0.5,
                           tokens=6, drafts=2, accepted=3, accepted_per_position=[2, 1])
    differences = vllm_check.first_differences(plain, other)
    assert differences == [{"method": "specdec-sam", "prompt": 1, "position": 1, "plain_tokens": [5],
                            "method_tokens": [6, 7]}]
    other.identical = 1
    table = vllm_check.table([plain, other])
    assert "| specdec-sam | 6.0 | 2.40 | - | 8.0 | 12.0 (2.00) | 1/2 | 2.50 | 1.00, 0.50 | 2 | - |" in table
    with pytest.raises(SystemExit):
        vllm_check.parse_args(["--max-num-seqs", "2"])


@pytest.mark.parametrize("repeats", [1, 3])
def test_check_keeps_no_store_across_timed_repeats(tmp_path: Path, repeats: int,
                                                  sam_store: tuple[Path, Path, Path]) -> None:
    """Repeated generations of the same prompts would let a shared store draft each output from its
    own earlier copy: with --repeats > 1 specdec's ``sam`` runs without one."""
    from specdec.commands import vllm_check

    args = vllm_check.parse_args(["--repeats", str(repeats), "--methods", "specdec-sam,specdec-pld",
                                  "--out", str(tmp_path)])
    made = vllm_check.methods(args, str(sam_store[0]), {})  # sam_store[0]: a tokenizer directory
    assert [m.label for m in made] == ["vllm", "specdec-sam", "specdec-pld"]
    built = {m.label: m.kwargs["additional_config"]["specdec"] for m in made if m.specdec}
    assert built["specdec-sam"].get("options", {}).get("store", True) is (repeats == 1)
    assert "store" not in built["specdec-pld"].get("options", {})


def test_check_replays_a_specdec_proposer(tmp_path: Path, sam_store: tuple[Path, Path, Path]) -> None:
    """The check's replay (exact steps, verified and accepted tokens) on a repeating text."""
    from specdec.commands import vllm_check

    tokenizer = str(sam_store[0])
    text = [5, 6, 7, 8, 9, 10, 11, 12] * 30
    proposer = vllm_check.specdec_proposer({"drafter": "pld"}, 6, tokenizer, 512)
    found = vllm_check.replay("pld", proposer, [text[:16], text[:24]], [text[16:120], text[24:100]])
    # Every row-step emits its accepted draft tokens and one more: 104 + 76 output tokens in all.
    assert found["row_steps"] + found["accepted"] == (104 - 1) + (76 - 1)
    assert found["steps"] < 104 and found["verified_tokens"] > found["row_steps"]
    assert "| pld |" in vllm_check.replay_table([found])


# -- Model Runner V2, which refuses custom_class: the check stops with one clear message --------

V2_MESSAGE = "vllm check: vLLM 0.40.0 runs Model Runner V2, which refuses specdec's custom_class proposer; "


def fake_vllm(*, fails_with: Exception | None = None, use_v2: bool = False) -> Any:
    """A stand-in ``vllm`` module: ``LLM`` fails to start with ``fails_with``, or starts with a config that
    says whether it runs Model Runner V2 (what a newer vLLM would signal)."""

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            if fails_with is not None:
                raise fails_with
            self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(use_v2_model_runner=use_v2))

    return SimpleNamespace(__version__="0.40.0", LLM=LLM)


def test_check_reads_model_runner_v2_from_each_signal() -> None:
    from specdec.commands import vllm_check

    message = vllm_check.runner_refusal("0.40.0", use_v2_model_runner=True)
    assert message is not None and message.startswith(V2_MESSAGE)
    assert vllm_check.runner_refusal("0.40.0", error="NotImplementedError: custom_class is not supported yet.") \
        == message
    assert vllm_check.runner_refusal("0.40.0", error="ValidationError: ... input_value='custom_class'") == message
    forced = vllm_check.runner_refusal("0.32.0", forced=True)
    assert forced is not None and forced.endswith("unset VLLM_USE_V2_MODEL_RUNNER (at 1 it forces V2)")
    # The V1 runner, the warning of its fallback in a working engine's log, another failure: no refusal.
    assert vllm_check.runner_refusal("0.32.0", use_v2_model_runner=False) is None
    assert vllm_check.runner_refusal("0.32.0", error=(
        "WARNING Model Runner V2 does not yet support speculative method 'custom_class'; using the V1 model runner "
        "instead.\nRuntimeError: Failed to instantiate custom proposer class: unknown drafter 'samm'")) is None
    assert [vllm_check.forces_v2({"VLLM_USE_V2_MODEL_RUNNER": v}) for v in ("1", " 1", "0", "")] \
        == [True, True, False, False]
    assert not vllm_check.forces_v2({})


def test_check_stops_where_the_engine_runs_model_runner_v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.commands import vllm_check

    custom = {"speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K}}
    refused = NotImplementedError("custom_class is not supported yet.")  # under the engine's own error
    failed = RuntimeError("Engine core initialization failed")
    failed.__cause__ = refused
    for vllm in (fake_vllm(fails_with=failed), fake_vllm(use_v2=True)):
        with pytest.raises(vllm_check.RunnerRefusal, match="^" + re.escape(V2_MESSAGE)):
            vllm_check.start_engine(vllm, custom)
    assert vllm_check.start_engine(fake_vllm(use_v2=True), {}) is not None  # plain vLLM may run V2
    assert vllm_check.start_engine(fake_vllm(), custom) is not None  # the V1 runner
    with pytest.raises(ValueError, match="unknown drafter"):  # another failure stays itself
        vllm_check.start_engine(fake_vllm(fails_with=ValueError("unknown drafter 'samm'")), custom)

    # A child that meets V2 writes the refusal, and the parent raises it; so does a child's log without a result.
    plan = {"model": "m", "dtype": "float32", "max_num_seqs": 8, "max_model_len": 64, "multiprocess": False,
            "methods": [{"label": "specdec-sam", "kwargs": custom, "specdec": True}]}
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    (tmp_path / "children").mkdir()
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(use_v2=True))
    assert vllm_check.child_main("run", plan_path, 0) == 0
    log = tmp_path / "engines.log"
    log.write_text("")
    with pytest.raises(vllm_check.RunnerRefusal, match="^" + re.escape(V2_MESSAGE)):
        vllm_check.child_result("run 0", tmp_path / "children" / "run-0.json", log, 0)
    log.write_text("Traceback ...\nNotImplementedError: custom_class is not supported yet.\n")
    with pytest.raises(vllm_check.RunnerRefusal, match="runs Model Runner V2"):
        vllm_check.child_result("run 1", tmp_path / "children" / "run-1.json", log, 1)
    log.write_text("Traceback ...\nMemoryError\n")
    with pytest.raises(SpecDecError, match="the run 1 child failed") as other:
        vllm_check.child_result("run 1", tmp_path / "children" / "run-1.json", log, 1)
    assert not isinstance(other.value, vllm_check.RunnerRefusal)


def test_check_forced_onto_model_runner_v2_stops_before_any_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from specdec.commands import vllm_check

    for name, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_PLUGINS", ""),
                        ("VLLM_LOGGING_LEVEL", "WARNING"), ("VLLM_USE_V2_MODEL_RUNNER", "1")):
        monkeypatch.setenv(name, value)  # main sets the first three where unset: restored after the test
    monkeypatch.setattr(vllm_check, "check", lambda args: pytest.fail("the check ran"))
    assert vllm_check.main(["--out", str(tmp_path)]) == vllm_check.RUNNER_REFUSED == 2
    assert capsys.readouterr().err.startswith("vllm check: vLLM ")
