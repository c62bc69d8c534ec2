"""Prompt lookup decoding (PLD), the reference.

Saxena, *Prompt Lookup Decoding* (2023, github.com/apoorvumang/prompt-lookup-decoding):
text that a model writes often repeats text it has already seen (the prompt, or its own
output), so the tokens that followed an earlier occurrence of the current ending are a
cheap draft.

Symbols: ``context`` is every token known so far (committed tokens plus the pending
one); an *n-gram* is n consecutive tokens; the *suffix* is the n-gram ending the context.

Rule, for ``n`` from ``max_ngram`` down to ``min_ngram``: find the earliest occurrence of
the n-gram suffix that ends before the last position; the draft is the up to
``num_draft`` tokens that follow it. The first ``n`` with a match wins, since a longer
match predicts better. No match at any ``n`` means no draft.

Cost: O(n * len(context)) per step, the baseline the suffix automaton improves on.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_draft(context: Sequence[int], max_ngram: int = 3, min_ngram: int = 1, num_draft: int = 10) -> list[int]:
    """The PLD draft for ``context`` (committed + pending tokens), possibly empty.

    >>> find_draft([5, 6, 7, 8, 5, 6], max_ngram=2, num_draft=3)
    [7, 8, 5]
    >>> find_draft([1, 2, 3])
    []
    """
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = list(context[length - n :])
        # An occurrence ends at `end`; it must end before the suffix itself does (end < length - 1).
        for end in range(n - 1, length - 1):
            if list(context[end - n + 1 : end + 1]) == suffix:
                return list(context[end + 1 : end + 1 + num_draft])
    return []
