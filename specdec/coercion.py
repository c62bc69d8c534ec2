"""What the user passes, made into what specdec runs: prompts into token ids, ``store=`` into a store.

The public calls (:mod:`specdec.api`) take text, chat messages, token ids or tensors as a
prompt (:func:`prompt_ids`), and ``True``/``False``/a size/a store object as ``store``
(:func:`resolve_store`); bad input is refused here with a message that names it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from specdec.datastores.shared_store import SharedStore
from specdec.errors import SpecDecError
from specdec.models import encode_prompt

Prompt = str | Sequence[int] | Sequence[Mapping[str, str]] | Any


def resolve_store(store: Any) -> SharedStore | Literal[False] | None:
    """The ``DrafterContext.store`` of a ``store`` argument: True -> None (the drafter's factory keeps
    one), False -> False (none), an int -> a store of that many tokens, a ``SharedStore`` as is."""
    if store is True:
        return None
    if store is False or isinstance(store, SharedStore):
        return store
    if isinstance(store, int) and not isinstance(store, bool):
        return SharedStore(store)
    raise SpecDecError(f"store must be True, False, a token budget (int) or a specdec.SharedStore, got {store!r}")


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str] | None:
    """Token ids to text by ``tokenizer``, special tokens skipped; None without a tokenizer."""
    if tokenizer is None:
        return None
    return lambda tokens: str(tokenizer.decode(tokens, skip_special_tokens=True))


def prompt_ids(prompt: Any, tokenizer: Any, chat_template: bool | None) -> list[int]:
    """Token ids from text, chat messages, a list of ids or a ``[1, L]``/``[L]`` tensor."""
    if hasattr(prompt, "tolist") and hasattr(prompt, "shape"):  # torch or NumPy array
        if len(prompt.shape) == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if len(prompt.shape) != 1:
            raise SpecDecError(f"a tensor prompt must be [L] or [1, L] (one sequence), got shape {tuple(prompt.shape)}")
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        if not prompt:
            raise SpecDecError("the prompt is empty")
        if tokenizer is None:
            raise SpecDecError("a text prompt needs a tokenizer: pass tokenizer=... or token ids")
        ids = encode_prompt(tokenizer, prompt, chat_template)
    elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, Mapping) for m in prompt):
        if tokenizer is None:
            raise SpecDecError("chat messages need a tokenizer")
        ids = encode_prompt(tokenizer, list(prompt), chat_template)
    elif isinstance(prompt, Sequence):
        # Any integer type is a token id (NumPy's, torch's 0-d tensors are not: .tolist() them); bools are not.
        bad = next(((i, t) for i, t in enumerate(prompt) if isinstance(t, bool) or not isinstance(t, numbers.Integral)),
                   None)
        if bad is not None:
            raise SpecDecError(f"a prompt list must hold token ids (ints) or chat messages (dicts), got {bad[1]!r} "
                               f"({type(bad[1]).__name__}) at index {bad[0]}")
        ids = [int(t) for t in prompt]
    else:
        raise SpecDecError(f"unsupported prompt type {type(prompt).__name__}: give text, token ids or chat messages")
    if not ids:
        raise SpecDecError("the prompt is empty: give at least one token")
    return ids
