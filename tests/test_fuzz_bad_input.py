"""Random invalid input to the compiled ops (hypothesis), in child processes: an error naming it, never a signal.

Each example starts from a random *valid* call (batch, tree sizes, vocabulary, cache shapes and
dtypes; any index tensor may be a non-contiguous view; with or without a status) and breaks
exactly one thing: a value (negative or too-large parents, tokens, choices, path nodes, lengths,
destinations, slots; int64's extremes among them), a dtype, a rank, a batch size, an empty
tree or vocabulary, a device, a non-contiguous cache, mixed element sizes, a bad status. With
one fault the first fault is known, so each broken call must raise a RuntimeError whose message
names that very value (or argument); the valid call it came from must return, which shows the
breakage and nothing else made it fail.

The examples are drawn here, derandomized (the same examples on every run, so CI is
reproducible), and every call runs in one child process per device, in each of the harness's
modes (``child_cases.py``): a crash fails the test with the signal's name and the example.
``EXAMPLES_PER_KIND`` examples of each kind of breakage of each op (39 kinds), two calls each.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from child_cases import DEVICE_MISMATCH, OTHER, Case, T, failures, run_cases
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_bad_input import DEVICES, ext  # noqa: F401 (ext: the session fixture)

EXAMPLES_PER_KIND = 8
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
WRONG_INDEX_DTYPES = [torch.int32, torch.int16, torch.uint8, torch.float32, torch.float64, torch.bool]
LAYOUTS = st.sampled_from(["contiguous", "strided", "transposed"])

# What an example breaks, per op (each example breaks exactly one).
SHARED_BREAKS = ["dtype", "device", "rank", "batch", "no nodes", "status"]
BREAKS = {
    "tree_mask": ["parent value", "committed value", "tree_start below committed", "negative tree_start",
                  "overflowing tree_start", "additive dtype", *SHARED_BREAKS],
    "tree_accept": ["parent value", "token value", "choice value", "topk", "logits dtype", "vocab", *SHARED_BREAKS],
    "compact_kv": ["path_len value", "dest value", "path order", "slot", "short cache tensor", "cache rank",
                   "element sizes", "cache not contiguous along head_dim", "negative tree_start", *SHARED_BREAKS],
}  # fmt: skip

BAD_STATUSES = {
    "7 words": T([0] * 7),
    "9 words": T([0] * 9),
    "[2, 4]": T([[0] * 4] * 2),
    "int32": T([0] * 8, dtype=torch.int32),
    "float64": T([0] * 8, dtype=torch.float64),
    "strided": T([0] * 8, layout="strided"),
}

Draw = Callable[[st.SearchStrategy[Any]], Any]
Break = tuple[str, dict[str, Any], str]  # what was broken, the broken arguments, the message regex


def said(text: str) -> str:
    """A regex matching ``text`` literally (spaces left readable)."""
    return re.escape(text).replace("\\ ", " ")


@st.composite
def trees(draw: Draw, nodes: int) -> list[int]:
    """parents[N] of a valid tree: -1 at the root, then an earlier node or -1 (padding)."""
    return [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, nodes)]


def index(values: Any, draw: Draw) -> T:
    return T(values, layout=draw(LAYOUTS))


def with_value(tensor: T, at: tuple[int, ...], value: int) -> T:
    values = copy.deepcopy(tensor.values)
    row = values
    for axis in at[:-1]:
        row = row[axis]
    row[at[-1]] = value
    return replace(tensor, values=values)


def flattened(values: list[list[int]]) -> list[int]:
    return [v for row in values for v in row]


# -- breaks more than one op shares ------------------------------------------------------------------


def break_parent(draw: Draw, args: dict[str, Any], op: str) -> Break:
    """One parent out of order: not -1 at a root, or not in [-1, i) at node i."""
    parents = args["parents"].values
    b, i = draw(st.integers(0, len(parents) - 1)), draw(st.integers(0, len(parents[0]) - 1))
    if i == 0:
        value = draw(st.sampled_from([0, 1, -2, len(parents[0]), I64_MIN, I64_MAX]))
        message = said(f"specdec::{op}: parents[{b}, 0] must be -1 (node 0 is the root), got {value}")
    else:
        value = draw(st.one_of(st.integers(i, i + 3), st.sampled_from([-2, -9, 2**40, I64_MIN, I64_MAX])))
        message = said(f"specdec::{op}: parents[{b}, {i}] = {value}: every parent must precede its child")
    return "parent value", {**args, "parents": with_value(args["parents"], (b, i), value)}, message


def break_row_value(draw: Draw, args: dict[str, Any], what: str, name: str, values: list[int], bounds: str) -> Break:
    """One entry of the [B] tensor ``name`` set to one of ``values``, all outside ``bounds``."""
    b = draw(st.integers(0, len(args[name].values) - 1))
    value = draw(st.sampled_from(values))
    return (
        what,
        {**args, name: with_value(args[name], (b,), value)},
        said(f"{name}[{b}] = {value} must lie in {bounds}"),
    )


def break_dtype(draw: Draw, args: dict[str, Any], names: list[str], op: str) -> Break:
    name = draw(st.sampled_from(names))
    dtype = draw(st.sampled_from(WRONG_INDEX_DTYPES))
    return (
        f"dtype: {name} {dtype}",
        {**args, name: replace(args[name], dtype=dtype)},
        rf"specdec::{op}: {name} must be int64",
    )


def break_device(draw: Draw, args: dict[str, Any], names: list[str], op: str) -> Break:
    name = draw(st.sampled_from(names))
    return f"device: {name}", {**args, name: replace(args[name], device=OTHER)}, rf"specdec::{op}: .*{DEVICE_MISMATCH}"


def break_status(draw: Draw, args: dict[str, Any], op: str) -> Break:
    label, bad = draw(st.sampled_from(list(BAD_STATUSES.items())))
    return (
        f"status: {label}",
        {**args, "status": bad},
        rf"specdec::{op}: status must be a contiguous int64 \[8\] tensor",
    )


# -- tree_mask ---------------------------------------------------------------------------------------


@st.composite
def mask_examples(draw: Draw, what: str) -> tuple[Case, Case]:
    batch, nodes = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    lowest = 1 if what == "tree_start below committed" else 0  # that break needs a committed length above 0
    tree_start = draw(st.integers(lowest, 9))
    parents = [draw(trees(nodes)) for _ in range(batch)]
    committed = [draw(st.integers(lowest if b == 0 else 0, tree_start)) for b in range(batch)]
    args: dict[str, Any] = {
        "parents": index(parents, draw),
        "committed_lens": index(committed, draw),
        "tree_start": tree_start,
        "additive_dtype": draw(st.sampled_from([None, torch.float32, torch.bfloat16, torch.float64, torch.bool])),
        "status": draw(st.booleans()),
    }
    op = "tree_mask"
    broken: Break | None = None  # None: the status (the one break every op shares last)
    if what == "parent value":
        broken = break_parent(draw, args, op)
    elif what == "committed value":
        values = [-1, tree_start + 1, tree_start + 40, I64_MAX, I64_MIN]
        broken = break_row_value(draw, args, what, "committed_lens", values, f"[0, tree_start = {tree_start}]")
    elif what == "tree_start below committed":
        lower = draw(st.integers(0, max(committed) - 1))
        b = next(b for b, c in enumerate(committed) if c > lower)
        message = said(f"committed_lens[{b}] = {committed[b]} must lie in [0, tree_start = {lower}]")
        broken = (what, {**args, "tree_start": lower}, message)
    elif what == "negative tree_start":
        value = draw(st.sampled_from([-1, -7, I64_MIN]))
        broken = (what, {**args, "tree_start": value}, said(f"tree_start must be >= 0, got {value}"))
    elif what == "overflowing tree_start":
        value = I64_MAX - draw(st.integers(0, nodes - 1))
        broken = (what, {**args, "tree_start": value}, said(f"tree_start = {value} is too large"))
    elif what == "additive dtype":
        dtype = draw(st.sampled_from([torch.int32, torch.int64, torch.uint8, torch.complex64]))
        broken = (what, {**args, "additive_dtype": dtype}, r"additive_dtype must be a floating dtype")
    elif what == "dtype":
        broken = break_dtype(draw, args, ["parents", "committed_lens"], op)
    elif what == "device":
        broken = break_device(draw, args, ["parents", "committed_lens"], op)
    elif what == "rank":
        if draw(st.booleans()):
            tensor = replace(args["parents"], values=draw(st.sampled_from([flattened(parents), [parents]])))
            broken = (what, {**args, "parents": tensor}, r"parents must be a \[B, N\] tensor")
        else:
            tensor = replace(args["committed_lens"], values=[committed])
            broken = (
                what,
                {**args, "committed_lens": tensor},
                rf"committed_lens must be a \[B\] tensor with B = {batch}",
            )
    elif what == "batch":
        tensor = replace(args["committed_lens"], values=[*committed, 0])
        broken = (what, {**args, "committed_lens": tensor}, rf"committed_lens must be a \[B\] tensor with B = {batch}")
    elif what == "no nodes":
        broken = (what, {**args, "parents": T([[] for _ in range(batch)])}, r"parents needs at least one node")

    return example(draw, op, what, args, broken)


# -- tree_accept -------------------------------------------------------------------------------------


@st.composite
def accept_examples(draw: Draw, what: str) -> tuple[Case, Case]:
    batch, nodes, vocab = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 12))
    parents = [draw(trees(nodes)) for _ in range(batch)]
    tokens = [[draw(st.integers(0, vocab - 1)) for _ in range(nodes)] for _ in range(batch)]
    choices = [[draw(st.integers(0, vocab - 1)) for _ in range(nodes)] for _ in range(batch)]
    logits_dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    args: dict[str, Any] = {
        "logits": T(
            shape=(batch, nodes, vocab), dtype=logits_dtype, layout=draw(st.sampled_from(["contiguous", "strided"]))
        ),
        "tokens": index(tokens, draw),
        "parents": index(parents, draw),
        "topk": draw(st.integers(0, min(vocab, 4))),
        "choices": index(choices, draw) if draw(st.booleans()) else None,
        "status": draw(st.booleans()),
    }
    op = "tree_accept"
    present = [name for name in ("tokens", "parents", "choices") if args[name] is not None]
    broken: Break | None = None  # None: the status (the one break every op shares last)
    if what == "parent value":
        broken = break_parent(draw, args, op)
    elif what in ("token value", "choice value"):
        name = "tokens" if what == "token value" else "choices"
        base = args[name] or index(choices, draw)
        b, i = draw(st.integers(0, batch - 1)), draw(st.integers(0, nodes - 1))
        value = draw(st.one_of(st.integers(vocab, vocab + 3), st.sampled_from([-1, -100, I64_MIN, I64_MAX])))
        message = said(f"{name}[{b}, {i}] = {value} must be a token id in [0, V = {vocab})")
        broken = (what, {**args, name: with_value(base, (b, i), value)}, message)
    elif what == "topk":
        value = draw(st.sampled_from([-1, -8, vocab + 1, vocab + 50]))
        broken = (what, {**args, "topk": value}, said(f"topk must lie in [0, V = {vocab}], got {value}"))
    elif what == "logits dtype":
        dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.bool, torch.uint8]))
        broken = (what, {**args, "logits": replace(args["logits"], dtype=dtype)}, r"logits must be floating")
    elif what == "vocab":
        logits = replace(args["logits"], shape=(batch, nodes, 0))
        broken = (
            what,
            {**args, "logits": logits},
            said(f"logits need at least one token, got shape [{batch}, {nodes}, 0]"),
        )
    elif what == "dtype":
        broken = break_dtype(draw, args, present, op)
    elif what == "device":
        broken = break_device(draw, args, ["logits", *present], op)
    elif what == "rank":
        name = draw(st.sampled_from(["logits", *present]))
        if name == "logits":
            broken = (
                what,
                {**args, "logits": replace(args["logits"], shape=(batch * nodes, vocab))},
                r"logits must be \[B, N, V\]",
            )
        else:
            tensor = replace(args[name], values=flattened(args[name].values))
            expected = r"choices must be int64 \[B, N\]" if name == "choices" else rf"{name} must be a \[B, N\] tensor"
            broken = (what, {**args, name: tensor}, expected)
    elif what == "batch":
        name = draw(st.sampled_from(present))
        tensor = replace(args[name], values=[*args[name].values, [0] * nodes])
        expected = r"choices must be int64 \[B, N\]" if name == "choices" else r"disagree on \[B, N\]"
        broken = (what, {**args, name: tensor}, expected)
    elif what == "no nodes":
        empty = {name: T([[] for _ in range(batch)]) for name in present}
        broken = (
            what,
            {**args, **empty, "logits": replace(args["logits"], shape=(batch, 0, vocab))},
            r"tokens needs at least one node",
        )

    return example(draw, op, what, args, broken)


# -- compact_kv --------------------------------------------------------------------------------------


@st.composite
def compact_examples(draw: Draw, what: str) -> tuple[Case, Case]:
    batch, width, nodes = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 8))
    tree_start = draw(st.integers(0, 6))
    paths, lengths = [], []
    for b in range(batch):
        chosen = sorted(draw(st.lists(st.integers(0, nodes - 1), unique=True, min_size=1 if b == 0 else 0,
                                      max_size=min(width, nodes))))  # fmt: skip
        paths.append(chosen + [-1] * (width - len(chosen)))
        lengths.append(len(chosen))
    dest = [draw(st.integers(0, tree_start)) for _ in range(batch)]
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
    heads = draw(st.integers(1, 2))
    head_dim = draw(st.sampled_from([2, 4] if what == "cache not contiguous along head_dim" else [1, 2, 4]))
    least = {"slot": 1, "short cache tensor": 1, "cache rank": 1, "element sizes": 2}.get(what, 0)  # cache tensors
    least = 1 if what == "cache not contiguous along head_dim" else least
    slots = [tree_start + nodes + draw(st.integers(0, 2)) for _ in range(draw(st.integers(least, 4)))]
    cache = [T(shape=(batch, heads, s, head_dim), dtype=dtype) for s in slots]
    args: dict[str, Any] = {
        "cache": cache,
        "path": index(paths, draw),
        "path_len": index(lengths, draw),
        "dest_starts": index(dest, draw),
        "tree_start": tree_start,
        "status": draw(st.booleans()),
    }
    op = "compact_kv"
    names = ["path", "path_len", "dest_starts"]
    broken: Break | None = None  # None: the status (the one break every op shares last)
    if what == "path_len value":
        broken = break_row_value(
            draw, args, what, "path_len", [-1, width + 1, width + 9, I64_MAX, I64_MIN], f"[0, {width}]"
        )
    elif what == "dest value":
        values = [-1, tree_start + 1, I64_MAX, I64_MIN]
        broken = break_row_value(draw, args, what, "dest_starts", values, f"[0, tree_start = {tree_start}]")
    elif what == "path order":
        b = draw(st.sampled_from([b for b in range(batch) if lengths[b] > 0]))
        i = draw(st.integers(0, lengths[b] - 1))
        if i == 0:
            value = draw(st.sampled_from([-1, -6, I64_MIN]))
            message = said(f"path[{b}, 0] = {value}: a path is node indices, from 0 up")
        else:
            previous = paths[b][i - 1]
            value = draw(st.one_of(st.integers(previous - 3, previous), st.just(I64_MIN)))
            message = said(f"path[{b}, {i}] = {value}: a path must be strictly increasing node indices from 0 up "
                           f"(the previous one is {previous})")  # fmt: skip
        broken = (what, {**args, "path": with_value(args["path"], (b, i), value)}, message)
    elif what == "slot":
        b = draw(st.sampled_from([b for b in range(batch) if lengths[b] > 0]))
        i = lengths[b] - 1
        smallest = min(slots)
        value = draw(st.one_of(st.integers(smallest - tree_start, smallest - tree_start + 3), st.just(I64_MAX)))
        message = said(f"path[{b}, {i}] = {value} is past the cache: the tree starts at slot {tree_start} and "
                       f"cache[{slots.index(smallest)}] holds {smallest} slots")  # fmt: skip
        broken = (what, {**args, "path": with_value(args["path"], (b, i), value)}, message)
    elif what == "short cache tensor":
        t = draw(st.integers(0, len(cache) - 1))
        highest = max(paths[b][lengths[b] - 1] for b in range(batch) if lengths[b] > 0)
        short = draw(st.integers(0, tree_start + highest))  # slot tree_start + highest is then past it
        b, i = next((b, i) for b in range(batch) for i in range(lengths[b]) if tree_start + paths[b][i] >= short)
        message = said(f"path[{b}, {i}] = {paths[b][i]} is past the cache: the tree starts at slot {tree_start} and "
                       f"cache[{t}] holds {short} slots")  # fmt: skip
        shortened = [*cache[:t], replace(cache[t], shape=(batch, heads, short, head_dim)), *cache[t + 1 :]]
        broken = (what, {**args, "cache": shortened}, message)
    elif what == "cache rank":
        t = draw(st.integers(0, len(cache) - 1))
        shape = draw(st.sampled_from([(heads, slots[t], head_dim), (batch + 1, heads, slots[t], head_dim)]))
        changed = [*cache[:t], replace(cache[t], shape=shape), *cache[t + 1 :]]
        broken = (what, {**args, "cache": changed}, said(f"cache[{t}] must be [B = {batch}, H, S, D]"))
    elif what == "element sizes":
        t = draw(st.integers(1, len(cache) - 1))
        other = torch.float64 if dtype != torch.float64 else torch.float32
        changed = [*cache[:t], replace(cache[t], dtype=other), *cache[t + 1 :]]
        size, size0 = other.itemsize, dtype.itemsize
        broken = (what, {**args, "cache": changed}, said(f"cache[{t}] has {size}-byte elements, cache[0] has {size0}"))
    elif what == "cache not contiguous along head_dim":
        t = draw(st.integers(0, len(cache) - 1))
        changed = [*cache[:t], replace(cache[t], layout="strided"), *cache[t + 1 :]]  # head_dim stride 2
        broken = (what, {**args, "cache": changed}, said(f"cache[{t}] must be contiguous along head_dim"))
    elif what == "negative tree_start":
        value = draw(st.sampled_from([-1, -5, I64_MIN]))
        broken = (what, {**args, "tree_start": value}, said(f"tree_start must be >= 0, got {value}"))
    elif what == "dtype":
        broken = break_dtype(draw, args, names, op)
    elif what == "device":
        name = draw(st.sampled_from([*names, *(["cache"] if cache else [])]))
        if name == "cache":
            t = draw(st.integers(0, len(cache) - 1))
            changed = [*cache[:t], replace(cache[t], device=OTHER), *cache[t + 1 :]]
            broken = (f"device: cache[{t}]", {**args, "cache": changed}, rf"specdec::{op}: .*{DEVICE_MISMATCH}")
        else:
            broken = break_device(draw, args, [name], op)
    elif what == "rank":
        name = draw(st.sampled_from(names))
        if name == "path":
            tensor, expected = replace(args["path"], values=flattened(paths)), r"path must be a \[B, N\] tensor"
        else:
            tensor, expected = replace(args[name], values=[args[name].values]), rf"{name} must be a \[B\] tensor"
        broken = (what, {**args, name: tensor}, expected)
    elif what == "batch":
        name = draw(st.sampled_from(["path_len", "dest_starts"]))
        tensor = replace(args[name], values=[*args[name].values, 0])
        broken = (what, {**args, name: tensor}, rf"{name} must be a \[B\] tensor with B = {batch}")
    elif what == "no nodes":
        empty = {"path": T([[] for _ in range(batch)]), "path_len": T([0] * batch)}
        broken = (what, {**args, **empty}, r"path needs at least one node")

    return example(draw, op, what, args, broken)


# The ops' positional arguments, in order (the status goes by keyword).
ARGUMENTS = {
    "tree_mask": ("parents", "committed_lens", "tree_start", "additive_dtype"),
    "tree_accept": ("logits", "tokens", "parents", "topk", "choices"),
    "compact_kv": ("cache", "path", "path_len", "dest_starts", "tree_start"),
}


def example(draw: Draw, op: str, what: str, valid: dict[str, Any], broken: Break | None) -> tuple[Case, Case]:
    """The broken call, which must raise naming what was broken, and the valid call it came from.

    ``broken`` None: ``what`` must be ``"status"``, which every op breaks the same way.
    """
    if broken is None:
        if what != "status":
            raise ValueError(f"unknown break {what!r} of {op}")
        broken = break_status(draw, valid, op)
    label, arguments, match = broken

    def call(given: dict[str, Any]) -> Case:
        return Case("", op, tuple(given[name] for name in ARGUMENTS[op]), None, given["status"])

    return replace(call(arguments), name=label, match=match), replace(call(valid), name="valid")


def draw_examples(strategy: st.SearchStrategy[tuple[Case, Case]], count: int) -> list[tuple[Case, Case]]:
    """``count`` examples of ``strategy``, the same ones on every run (derandomized, no database)."""
    drawn: list[tuple[Case, Case]] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(strategy)
    def collect(example: tuple[Case, Case]) -> None:
        drawn.append(example)

    collect()
    return drawn


STRATEGIES = {"tree_mask": mask_examples, "tree_accept": accept_examples, "compact_kv": compact_examples}


@functools.cache
def fuzz_cases() -> list[Case]:
    """Every example's broken call and its valid call, named ``"<op> <kind> #<example>: <what was broken>"``."""
    cases = []
    for op, kinds in BREAKS.items():
        for kind in kinds:
            for number, pair in enumerate(draw_examples(STRATEGIES[op](kind), EXAMPLES_PER_KIND)):
                cases += [replace(case, name=f"{op} {kind} #{number}: {case.name}") for case in pair]
    return cases


@pytest.mark.usefixtures("ext")  # built here, once, before the children load it
@pytest.mark.parametrize("device", DEVICES)
def test_random_invalid_input_raises_naming_it_and_never_crashes(device: str) -> None:
    cases = fuzz_cases()
    problems = failures(run_cases(cases, device))
    assert not problems, f"{len(problems)} problems in {len(cases)} calls:\n" + "\n".join(problems[:40])
