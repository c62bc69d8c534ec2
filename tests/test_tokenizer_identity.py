"""The tokenizer identity's cache (specdec.cachefiles.TokenizerIdentity.of).

The identity (a hash of the vocabulary) names the tokenizer that planner statistics and datastores
were made for; a one-off ``run`` computed it in every process (~50 ms on the default model's 49k
vocabulary). A tokenizer loaded from a local folder now reads it back from the ``tokenizers`` cache,
keyed by its files and the tokens added to it: these tests check that the cached identity is the
computed one, that a changed file or an added token gives a fresh hash, and that a bad cache entry
is computed again, never trusted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specdec.cachefiles import TokenizerIdentity, folder


def saved_tokenizer(path: Path, words: int = 50) -> Path:
    """A word-level tokenizer saved as a checkpoint's tokenizer files (no hub)."""
    vocab = {f"t{i}": i for i in range(words)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")))
    fast.save_pretrained(path)
    return path


def no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make computing an identity fail: what passes after this was read from the cache."""

    def refuse(cls: Any, tokenizer: Any) -> TokenizerIdentity:
        raise AssertionError("hashed the vocabulary again")

    monkeypatch.setattr(TokenizerIdentity, "hashed", classmethod(refuse))


def test_a_folder_tokenizer_is_hashed_once_then_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    directory = saved_tokenizer(tmp_path / "tok")
    first = TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory))
    assert first == TokenizerIdentity.hashed(AutoTokenizer.from_pretrained(directory))
    assert len(list(folder("tokenizers").iterdir())) == 1
    no_hashing(monkeypatch)
    again = TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory))  # another object, another "process"
    assert again == first


def test_a_changed_file_or_an_added_token_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    directory = saved_tokenizer(tmp_path / "tok")
    first = TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory))
    # An added token (in memory): another key, and the hash sees the new token.
    grown = AutoTokenizer.from_pretrained(directory)
    grown.add_tokens(["brand-new"])
    assert TokenizerIdentity.of(grown) == TokenizerIdentity.hashed(grown) != first
    # The folder's files replaced by another vocabulary: another key (size and time), another hash.
    saved_tokenizer(directory, words=60)
    stamp = (directory / "tokenizer.json").stat()
    os.utime(directory / "tokenizer.json", ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000))
    replaced = AutoTokenizer.from_pretrained(directory)
    assert TokenizerIdentity.of(replaced) == TokenizerIdentity.hashed(replaced) != first
    assert len(list(folder("tokenizers").iterdir())) == 3


def test_a_same_size_rewrite_at_the_same_time_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file rewritten with as many bytes within one timestamp tick (mtime put back, as a coarse clock
    would leave it) is another vocabulary: the key is on the files' bytes, not on their size and time."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    directory = saved_tokenizer(tmp_path / "tok")
    first = TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory))
    path = directory / "tokenizer.json"
    stamp = path.stat()
    text = path.read_text()
    swapped = text.replace('"t1": 1,', '"t1": #,').replace('"t2": 2,', '"t2": 1,').replace('"t1": #,', '"t1": 2,')
    assert swapped != text and len(swapped) == len(text)  # t1 and t2 trade ids: same size, another vocabulary
    path.write_text(swapped)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stamp.st_size, stamp.st_mtime_ns)
    rewritten = AutoTokenizer.from_pretrained(directory)
    assert rewritten.convert_tokens_to_ids("t1") == 2
    assert TokenizerIdentity.of(rewritten) == TokenizerIdentity.hashed(rewritten) != first


@pytest.mark.parametrize("body", ["{not json", '{"fingerprint": "abc", "vocab_size": 50}',
                                  '{"fingerprint": "' + "0" * 24 + '", "vocab_size": true}', "[]"])
def test_a_bad_cache_entry_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    directory = saved_tokenizer(tmp_path / "tok")
    first = TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory))
    (entry,) = folder("tokenizers").iterdir()
    entry.write_text(body)
    assert TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory)) == first
    assert TokenizerIdentity.of(AutoTokenizer.from_pretrained(directory)) == first  # and rewritten whole


def test_a_tokenizer_not_from_a_folder_is_hashed_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    vocab = {f"t{i}": i for i in range(50)}
    built = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")))
    assert TokenizerIdentity.of(built) == TokenizerIdentity.hashed(built)
    assert not folder("tokenizers").exists() or not any(folder("tokenizers").iterdir())


def test_an_unwritable_cache_still_gives_the_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(blocked))
    directory = saved_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert TokenizerIdentity.of(tokenizer) == TokenizerIdentity.hashed(tokenizer)
