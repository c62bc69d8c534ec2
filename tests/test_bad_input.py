"""Bad input to the compiled ops raises a RuntimeError naming the bad value, and never crashes (issue 15).

Every argument check of ``tree_mask``, ``tree_accept`` and ``compact_kv`` (``csrc/checks.h``)
and every value check (``csrc/faults.h``) has a hand case here, with the message it must give.
The cases run in child processes (``child_cases.py``): all of them in one child per device, each
in three modes (torch on one thread, on several, and called from a Python thread), so that a
crash fails the case that caused it, named with its signal, instead of killing the suite. The
same cases run on the CPU and, when there is one, on a CUDA device, where they also show that the
CUDA context still works after each. Cases with ``status=True`` take the fast path: the op records
the fault in a status and ``check_status`` raises it afterwards, as ``ExtTreeOps`` does at its sync.
Random invalid input (hypothesis): ``test_fuzz_bad_input.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from child_cases import DEVICE, DEVICE_MISMATCH, OTHER, Case, T, Verdict, run_cases

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)


@pytest.fixture(scope="session")
def ext() -> Any:
    from conftest import native_or_skip  # here, not at the top: the children import this module for its scenarios

    from specdec.backends.cuda_ext import load

    return native_or_skip("cuda_ext", load)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
    ),
]


def ix(values: Any, **options: Any) -> T:
    """An index tensor (int64 unless told otherwise) with these values."""
    return T(values, **options)


def floats(*shape: int, **options: Any) -> T:
    return T(shape=shape, dtype=options.pop("dtype", torch.float32), **options)


ONE = ix([0])
TREE = ix([[-1, 0, 0, 1]])  # node 0 the root, 1 and 2 its children, 3 under 1
TOKENS = ix([[1, 2, 3, 1]])
LOGITS = floats(1, 4, 5)  # V = 5


def mask(name: str, parents: T, committed: T, tree_start: int, match: str | None, **extra: Any) -> Case:
    args = (parents, committed, tree_start, *(() if "additive" not in extra else (extra.pop("additive"),)))
    return Case(f"tree_mask: {name}", "tree_mask", args, match, **extra)


def accept(name: str, logits: T, tokens: T, parents: T, topk: int, match: str | None, **extra: Any) -> Case:
    choices = extra.pop("choices", None)
    return Case(f"tree_accept: {name}", "tree_accept", (logits, tokens, parents, topk, choices), match, **extra)


def compact(name: str, cache: list[T], path: T, path_len: T, dest: T, tree_start: int, match: str | None,
            **extra: Any) -> Case:  # fmt: skip
    return Case(f"compact_kv: {name}", "compact_kv", (cache, path, path_len, dest, tree_start), match, **extra)


def kv(slots: int = 6, **options: Any) -> T:
    """One layer's keys or values, [B = 1, H = 2, S, D = 3]."""
    return floats(1, 2, slots, 3, **options)


MASK_CASES = [
    mask("parents of rank 1", ix([-1]), ONE, 0,
         r"specdec::tree_mask: parents must be a \[B, N\] tensor, got shape \[1\]"),
    mask("parents int32", ix([[-1]], dtype=torch.int32), ONE, 0, r"parents must be int64, got Int"),
    mask("parents without nodes", ix([[]]), ONE, 0,
         r"parents needs at least one node \(the root\) per tree, got shape \[1, 0\]"),
    mask("committed_lens of another batch", TREE, ix([0, 0]), 0,
         r"committed_lens must be a \[B\] tensor with B = 1, got shape \[2\]"),
    mask("committed_lens float", TREE, ix([0], dtype=torch.float32), 0, r"committed_lens must be int64, got Float"),
    mask("committed_lens on another device", TREE, ix([0], device=OTHER), 0, DEVICE_MISMATCH),
    mask("parents on another device", ix([[-1, 0]], device=OTHER), ONE, 0, DEVICE_MISMATCH),
    mask("negative tree_start", TREE, ONE, -1, r"tree_start must be >= 0, got -1"),
    mask("tree_start overflowing the width", TREE, ONE, I64_MAX - 2, rf"tree_start = {I64_MAX - 2} is too large"),
    mask("integer additive_dtype", TREE, ONE, 0,
         r"additive_dtype must be a floating dtype .*, got Int", additive=torch.int32),
    mask("root with a parent", ix([[0, 0]]), ONE, 0, r"parents\[0, 0\] must be -1 \(node 0 is the root\), got 0"),
    mask("parent after its child", ix([[-1, 1]]), ONE, 0, r"parents\[0, 1\] = 1: every parent must precede its child"),
    mask("parent below -1", ix([[-1, -2]]), ONE, 0, r"parents\[0, 1\] = -2: every parent"),
    mask("int64 max as a parent, second tree", ix([[-1, 0, 1], [-1, 0, I64_MAX]]), ix([0, 0]), 0,
         rf"parents\[1, 2\] = {I64_MAX}: every parent"),
    mask("int64 min as the root's parent", ix([[I64_MIN]]), ONE, 0, rf"parents\[0, 0\] must be -1 .*got {I64_MIN}"),
    mask("committed beyond tree_start", ix([[-1]]), ix([5]), 3,
         r"committed_lens\[0\] = 5 must lie in \[0, tree_start = 3\]"),
    mask("negative committed, second tree", ix([[-1], [-1]]), ix([0, -1]), 3, r"committed_lens\[1\] = -1 must lie in"),
    mask("the first of two faults is named", ix([[-1, 0, 7]]), ix([9]), 3, r"parents\[0, 2\] = 7"),
    mask("bad parent, fast path", ix([[-1, 0, 3]]), ONE, 0, r"parents\[0, 2\] = 3: every parent", status=True),
    mask("bad committed, fast path", ix([[-1]]), ix([4]), 3, r"committed_lens\[0\] = 4", status=True),
    mask("status of 7 words", TREE, ONE, 0, r"status must be a contiguous int64 \[8\] tensor, got Long \[7\]",
         status=ix([0] * 7)),
    mask("status int32", TREE, ONE, 0,
         r"status must be a contiguous int64 \[8\] tensor, got Int", status=ix([0] * 8, dtype=torch.int32)),
    mask("status not contiguous", TREE, ONE, 0, r"\(not contiguous\)", status=ix([0] * 8, layout="strided")),
    mask("status on another device", TREE, ONE, 0, DEVICE_MISMATCH, status=ix([0] * 8, device=OTHER)),
    # Controls: valid calls return (non-contiguous inputs, padding nodes, an empty batch, the fast path).
    mask("valid, strided", ix([[-1, 0, -1, 1]], layout="strided"), ix([2], layout="strided"), 3, None),
    mask("valid, transposed", ix([[-1, 0], [-1, -1]], layout="transposed"), ix([0, 1]), 1, None, status=True),
    mask("valid, empty batch", T(shape=(0, 3)), T(shape=(0,)), 0, None),
]  # fmt: skip

ACCEPT_CASES = [
    accept("logits of rank 2", floats(4, 5), TOKENS, TREE, 0, r"logits must be \[B, N, V\], got shape \[4, 5\]"),
    accept("integer logits", floats(1, 4, 5, dtype=torch.int64), TOKENS, TREE, 0, r"logits must be floating, got Long"),
    accept("tokens int32", LOGITS, ix([[1, 2, 3, 1]], dtype=torch.int32), TREE, 0, r"tokens must be int64, got Int"),
    accept("parents of rank 3", LOGITS, TOKENS, ix([[[-1, 0, 0, 1]]]), 0, r"parents must be a \[B, N\] tensor"),
    accept("tokens shorter than the logits", LOGITS, ix([[1, 2, 3]]), ix([[-1, 0, 0]]), 0,
           r"logits \[1, 4, 5\], tokens \[1, 3\] and parents \[1, 3\] disagree on \[B, N\]"),
    accept("parents of another batch", LOGITS, TOKENS, ix([[-1, 0, 0, 1]] * 2), 0, r"disagree on \[B, N\]"),
    accept("trees without nodes", floats(1, 0, 5), ix([[]]), ix([[]]), 0, r"tokens needs at least one node"),
    accept("empty vocabulary", floats(1, 4, 0), TOKENS, TREE, 0,
           r"logits need at least one token, got shape \[1, 4, 0\]"),
    accept("topk above V", LOGITS, TOKENS, TREE, 6, r"topk must lie in \[0, V = 5\], got 6"),
    accept("negative topk", LOGITS, TOKENS, TREE, -1, r"topk must lie in \[0, V = 5\], got -1"),
    accept("tokens on another device", LOGITS, ix([[1, 2, 3, 1]], device=OTHER), TREE, 0, DEVICE_MISMATCH),
    accept("logits on another device", floats(1, 4, 5, device=OTHER), TOKENS, TREE, 0, DEVICE_MISMATCH),
    accept("choices of another shape", LOGITS, TOKENS, TREE, 0, r"choices must be int64 \[B, N\] = \[1, 4\]",
           choices=ix([[0, 1]])),
    accept("choices int32", LOGITS, TOKENS, TREE, 0,
           r"choices must be int64", choices=ix([[0] * 4], dtype=torch.int32)),
    accept("choices on another device", LOGITS, TOKENS, TREE, 0, DEVICE_MISMATCH, choices=ix([[0] * 4], device=OTHER)),
    accept("root with a parent", LOGITS, TOKENS, ix([[3, 0, 0, 1]]), 2,
           r"specdec::tree_accept: parents\[0, 0\] must be -1 \(node 0 is the root\), got 3"),
    accept("parent after its child", LOGITS, TOKENS, ix([[-1, 0, 3, 1]]), 0, r"parents\[0, 2\] = 3: every parent"),
    accept("token equal to V", LOGITS, ix([[1, 5, 3, 1]]), TREE, 0,
           r"tokens\[0, 1\] = 5 must be a token id in \[0, V = 5\)"),
    accept("negative root token", LOGITS, ix([[-1, 2, 3, 1]]), TREE, 0, r"tokens\[0, 0\] = -1 must be a token id"),
    accept("int64 min token, second tree", floats(2, 2, 5), ix([[0, 1], [2, I64_MIN]]), ix([[-1, 0]] * 2), 0,
           rf"tokens\[1, 1\] = {I64_MIN} must be a token id in \[0, V = 5\)"),
    accept("choice beyond V", LOGITS, TOKENS, TREE, 0, r"choices\[0, 3\] = 9 must be a token id in \[0, V = 5\)",
           choices=ix([[0, 1, 2, 9]])),
    accept("parents before tokens", LOGITS, ix([[1, 7, 3, 1]]), ix([[-1, 0, 0, 9]]), 0, r"parents\[0, 3\] = 9"),
    accept("bad token, fast path", LOGITS, ix([[1, 2, 3, 99]]), TREE, 3, r"tokens\[0, 3\] = 99", status=True),
    accept("bad choice, fast path", LOGITS, TOKENS, TREE, 0, r"choices\[0, 0\] = -4", status=True,
           choices=ix([[-4, 0, 0, 0]])),
    accept("status of 9 words", LOGITS, TOKENS, TREE, 0, r"status must be a contiguous int64 \[8\] tensor",
           status=ix([0] * 9)),
    accept("valid, strided, top-3", floats(1, 4, 5, layout="strided"), ix([[1, 2, 3, 1]], layout="strided"),
           ix([[-1, 0, 0, 1]], layout="strided"), 3, None, status=True),
    accept("valid, given choices, bf16", floats(1, 4, 5, dtype=torch.bfloat16), TOKENS, TREE, 2, None,
           choices=ix([[2, 1, 0, 4]])),
]  # fmt: skip

CACHE = [kv(), kv()]
PATH = ix([[0, 1, 3]])
COMPACT_CASES = [
    compact("path of rank 1", CACHE, ix([0, 1]), ix([2]), ONE, 1, r"path must be a \[B, N\] tensor, got shape \[2\]"),
    compact("path float", CACHE, ix([[0, 1]], dtype=torch.float64), ix([2]), ONE, 1, r"path must be int64, got Double"),
    compact("path without nodes", CACHE, ix([[]]), ix([0]), ONE, 1, r"path needs at least one node"),
    compact("path_len of another batch", CACHE, PATH, ix([3, 3]), ONE, 1,
            r"path_len must be a \[B\] tensor with B = 1"),
    compact("dest_starts int32", CACHE, PATH, ix([3]), ix([0], dtype=torch.int32), 1,
            r"dest_starts must be int64, got Int"),
    compact("negative tree_start", CACHE, PATH, ix([3]), ONE, -3, r"tree_start must be >= 0, got -3"),
    compact("cache on another device", [kv(), kv(device=OTHER)], PATH, ix([3]), ONE, 1, DEVICE_MISMATCH),
    compact("path_len on another device", CACHE, PATH, ix([3], device=OTHER), ONE, 1, DEVICE_MISMATCH),
    compact("cache of rank 3", [floats(2, 6, 3)], PATH, ix([3]), ONE, 1,
            r"cache\[0\] must be \[B = 1, H, S, D\], got shape \[2, 6, 3\]"),
    compact("cache of another batch", [kv(), floats(2, 2, 6, 3)], PATH, ix([3]), ONE, 1,
            r"cache\[1\] must be \[B = 1, H, S, D\]"),
    compact("cache strided along head_dim", [kv(layout="strided")], PATH, ix([3]), ONE, 1,
            r"cache\[0\] must be contiguous along head_dim, got strides \[72, 36, 6, 2\]"),
    compact("cache of two element sizes", [kv(), kv(dtype=torch.float64)], PATH, ix([3]), ONE, 1,
            r"cache\[1\] has 8-byte elements, cache\[0\] has 4"),
    compact("path_len beyond the path", CACHE, ix([[0]]), ix([2]), ONE, 1, r"path_len\[0\] = 2 must lie in \[0, 1\]"),
    compact("negative path_len", CACHE, PATH, ix([-1]), ONE, 1, r"path_len\[0\] = -1 must lie in \[0, 3\]"),
    compact("dest_starts beyond tree_start", CACHE, ix([[0]]), ix([1]), ix([3]), 1,
            r"dest_starts\[0\] = 3 must lie in \[0, tree_start = 1\]"),
    compact("int64 min dest_starts", CACHE, PATH, ix([3]), ix([I64_MIN]), 1, rf"dest_starts\[0\] = {I64_MIN} must lie"),
    compact("path going back", CACHE, ix([[0, 2, 1]]), ix([3]), ONE, 1,
            r"path\[0, 2\] = 1: a path must be strictly increasing node indices from 0 up \(the previous one is 2\)"),
    compact("path padding inside path_len", CACHE, ix([[0, -1]]), ix([2]), ONE, 1,
            r"path\[0, 1\] = -1: .*previous one is 0"),
    compact("negative first node", CACHE, ix([[-5, 1]]), ix([2]), ONE, 1, r"path\[0, 0\] = -5: a path is node indices"),
    compact("slot past the cache", [floats(1, 1, 4, 2)], ix([[0, 3]]), ix([2]), ONE, 1,
            r"path\[0, 1\] = 3 is past the cache: the tree starts at slot 1 and cache\[0\] holds 4 slots"),
    compact("int64 max node", CACHE, ix([[0, I64_MAX]]), ix([2]), ONE, 1,
            rf"path\[0, 1\] = {I64_MAX} is past the cache"),
    compact("the smallest tensor bounds the slots", [kv(9), kv(5), kv(7)], ix([[0, 4]]), ix([2]), ONE, 1,
            r"path\[0, 1\] = 4 is past the cache: .*cache\[1\] holds 5 slots"),
    compact("second sequence", [floats(2, 1, 6, 2)], ix([[0, 1], [0, 2]]), ix([2, 2]), ix([1, 4]), 1,
            r"dest_starts\[1\] = 4 must lie in \[0, tree_start = 1\]"),
    compact("values are checked without a cache", [], ix([[1, 0]]), ix([2]), ONE, 1, r"path\[0, 1\] = 0: a path must"),
    compact("bad node, fast path: nothing moves", CACHE, ix([[0, 2, 2]]), ix([3]), ONE, 1,
            r"path\[0, 2\] = 2: a path must", status=True),
    compact("slot past the cache, fast path", CACHE, ix([[0, 5]]), ix([2]), ONE, 1,
            r"path\[0, 1\] = 5 is past", status=True),
    compact("status on another device", CACHE, PATH, ix([3]), ONE, 1,
            DEVICE_MISMATCH, status=ix([0] * 8, device=OTHER)),
    compact("valid, strided path, fast path", CACHE, ix([[0, 1, 3]], layout="strided"), ix([3]), ix([1]), 1, None,
            status=True),
    compact("valid, nothing to move", CACHE, ix([[0, -1]]), ix([0]), ONE, 2, None),
]  # fmt: skip

STATUS_CASES = [
    Case("check_status: unknown fault code", "check_status", (ix([99, 0, 0, 0, 0, 0, 0, 0]),),
         r"a status holds fault code 99, which no op writes"),
    Case("check_status: a recorded fault", "check_status", (ix([5, 2, 3, 0, 3, 0, 0, 0]),),
         r"specdec::tree_accept: parents\[2, 3\] = 0: every parent must precede"),
    Case("check_status: float status", "check_status", (ix([0] * 8, dtype=torch.float32),),
         r"status must be a contiguous int64"),
    Case("check_status: no fault", "check_status", (ix([0] * 8),), None),
]  # fmt: skip


def expect_raise(call: Any, wanted: str) -> None:
    """``call()`` must raise a RuntimeError whose message contains ``wanted``; AssertionError otherwise."""
    try:
        call()
    except RuntimeError as error:
        assert wanted in str(error), f"expected {wanted!r}, got {error}"
    else:
        raise AssertionError(f"expected a RuntimeError naming {wanted!r}, the call returned")


def fast_path_defers_faults_without_a_sync(device: str) -> None:
    """With a status, a CUDA op records a bad value without synchronizing or raising; check_status
    raises it later, the first fault standing, and compact_kv moves nothing meanwhile. On the CPU
    the op raises at once and leaves the status alone."""
    from specdec.backends.cuda_ext import ops

    status = ops.new_status(device)
    parents, committed = torch.tensor([[-1, 5]], device=device), torch.tensor([0], device=device)
    keys = torch.randn(1, 1, 4, 2, device=device)
    path, one, zero = (torch.tensor(v, device=device) for v in ([[0, 3]], [2], [0]))
    before = keys.clone()
    if device == "cpu":
        expect_raise(lambda: ops.tree_mask(parents, committed, 0, None, status), "parents[0, 1] = 5: every parent")
        assert not status.any(), status
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronization raises
    try:
        ops.tree_mask(parents, committed, 0, None, status)  # records the bad parent
        ops.compact_kv([keys], path, one, zero, 0, status)  # valid, but a fault is recorded: moves nothing
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expect_raise(lambda: ops.check_status(status), "specdec::tree_mask: parents[0, 1] = 5: every parent")
    assert torch.equal(keys, before), "compact_kv moved keys while the status recorded a fault"


def backend_reports_faults_then_recovers(device: str) -> None:
    """ExtTreeOps: a token outside the vocabulary raises at accept, and the next step works.

    On the CPU the op raises at once; on CUDA the fault travels home in accept's one copy.
    Then a compaction over a cache too small for the path: on the CPU compact raises, on CUDA
    it moves nothing and the next accept reports it. Raises AssertionError when any of that fails.
    """
    from types import SimpleNamespace

    from specdec.backends.cuda_ext import ExtTreeOps
    from specdec.sampling import Greedy
    from specdec.types import DraftTree

    backend = ExtTreeOps(device)
    logits = torch.zeros(2, 5, device=device)
    logits[0, 2] = 1.0  # the root chooses token 2: the child carrying it is accepted
    positions = torch.zeros(2, dtype=torch.int64, device=device)

    expect_raise(lambda: backend.accept(DraftTree((1, 7), (-1, 0)), logits, positions, Greedy(), 0),
                 "tokens[0, 1] = 7 must be a token id in [0, V = 5)")  # fmt: skip
    good = backend.accept(DraftTree((1, 2), (-1, 0)), logits, positions, Greedy(), 2)
    assert good.path == (0, 1) and good.bonus == 0, good

    keys = torch.arange(2 * 4 * 3, dtype=torch.float32, device=device).view(1, 2, 4, 3)  # S = 4
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=keys.clone(), values=keys.clone())])
    wanted = "path[0, 1] = 2 is past the cache: the tree starts at slot 2 and cache[0] holds 4 slots"
    if device == "cpu":
        expect_raise(lambda: backend.compact(cache, 2, (0, 2)), wanted)
    else:
        backend.compact(cache, 2, (0, 2))  # recorded on the device; nothing moves
        expect_raise(lambda: backend.accept(DraftTree((1, 2), (-1, 0)), logits, positions, Greedy(), 0), wanted)
    assert torch.equal(cache.layers[0].keys[:, :, :4], keys), "the cache changed"
    assert backend.accept(DraftTree((1, 2), (-1, 0)), logits, positions, Greedy(), 0).path == (0, 1)


SCENARIOS = [  # functions of this module, called in the child with the device's name
    Case("ops: the fast path defers a fault without a sync",
         "test_bad_input:fast_path_defers_faults_without_a_sync", (DEVICE,), None),
    Case("ExtTreeOps: a fault raises at accept, then the backend goes on",
         "test_bad_input:backend_reports_faults_then_recovers", (DEVICE,), None),
]  # fmt: skip

CASES = [*MASK_CASES, *ACCEPT_CASES, *COMPACT_CASES, *STATUS_CASES, *SCENARIOS]


@pytest.fixture(scope="module", params=DEVICES)
def verdicts(request: pytest.FixtureRequest, ext: Any) -> dict[str, Verdict]:
    """Every case's verdict on one device: one child process runs them all (more only after a crash)."""
    if request.param == "cuda" and not ext.has_cuda_kernels():
        pytest.fail("a CUDA device is present but the extension was built without its CUDA kernels")
    return run_cases(CASES, request.param)


@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_bad_input_raises_naming_the_value(verdicts: dict[str, Verdict], name: str) -> None:
    problems = verdicts[name].problems()
    assert not problems, "\n".join(problems)


def test_every_check_has_a_case() -> None:
    """Each fault code of faults.h, and each argument of the ops, appears in some case's expectation."""
    expectations = " ".join(case.match or "" for case in CASES)
    faults = ("must be -1", "every parent must precede", r"committed_lens\[", r"tokens\[", r"choices\[")
    faults += (r"path_len\[", r"dest_starts\[", "strictly increasing", "a path is node indices", "is past the cache")
    faults += ("which no op writes",)
    for needle in faults:
        assert needle in expectations, needle


def test_harness_names_a_crash_and_goes_on(ext: Any) -> None:
    """A case that kills its child is named with the signal; the cases after it still run; a wrong
    expectation is reported (the harness can fail)."""
    cases = [
        mask("fine before", TREE, ONE, 0, None),
        Case("segfault", "ctypes:string_at", (0,), None),
        mask("fine after", TREE, ONE, 0, None),
        mask("valid but expected to raise", TREE, ONE, 0, r"parents"),
    ]
    verdicts = run_cases(cases, "cpu")
    assert verdicts["tree_mask: fine before"].problems() == []
    assert verdicts["tree_mask: fine after"].problems() == []
    assert [p.split(" | ")[0] for p in verdicts["segfault"].problems()] == ["segfault: killed the child with SIGSEGV"]
    wrong = verdicts["tree_mask: valid but expected to raise"].problems()
    assert len(wrong) == 3 and all("must raise a RuntimeError matching 'parents', returned" in p for p in wrong)
