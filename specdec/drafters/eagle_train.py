"""Training an EAGLE head (:mod:`specdec.drafters.eagle_head`) on a corpus, against a fixed target.

The recipe (``specdec train-head``; docs/algorithms/eagle.md has the command and its result):

1. **Corpus** (:func:`corpus_windows`): chat-formatted documents cut into windows of ``window``
   tokens. Sources: a JSONL file of ``{"question", "answer"}`` rows (GSM8K's training set, with its
   ``<<calculator>>`` annotations removed: the user asks, the assistant answers) and ``stdlib``, the
   Python standard library's own source (a user asks for a module, the assistant writes it). Each
   source gets an equal share of ``tokens``; windows are drawn by ``seed``; the last ``holdout``
   share of each source's documents is the validation set, never trained on.
2. **Features, once** (:func:`extract`): the target runs every window once; its feature (hidden state
   after the final norm) at every position, in float16, and its argmax there, int32, go to a cache
   file named by everything they depend on, so a second run (other epochs, another seed) skips it.
3. **Draft vocabulary**: the ``draft_vocab`` ids the target predicted most often on the training windows.
4. **Training** (:func:`train`): for every window position ``t``, the head reads ``(f_t, x_{t+1})`` and
   predicts ``f_{t+1}``; loss = smooth L1 between prediction and ``f_{t+1}`` + ``ce_weight`` x the
   cross-entropy of the draft logits against the target's argmax at ``t + 1`` (positions whose argmax
   is outside the draft vocabulary add no cross-entropy). AdamW, warm-up then cosine decay. The
   head's layer starts from the target's last decoder layer (a better start than noise for a small
   corpus), ``fc`` from noise.
5. **Validation**: top-1 agreement, the share of held-out positions where the head's argmax (given the
   target's true features) is the target's own next token.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.cachefiles import cache_dir
from specdec.drafters.eagle_head import EagleHead
from specdec.errors import SpecDecError

_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a trained head depends on (stored in its file's ``trained`` metadata)."""

    corpora: tuple[str, ...] = ("stdlib",)
    tokens: int = 400_000
    window: int = 512
    epochs: int = 2
    seed: int = 0
    draft_vocab: int = 8192
    lr: float = 1e-3
    batch: int = 2
    ce_weight: float = 0.1
    holdout: float = 0.05

    def __post_init__(self) -> None:
        for name in ("tokens", "window", "epochs", "draft_vocab", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecDecError(f"train-head: {name} must be a positive int, got {value!r}")
        if not 0.0 < self.holdout < 0.5:
            raise SpecDecError(f"train-head: holdout must be in (0, 0.5), got {self.holdout!r}")


# -- 1. the corpus -------------------------------------------------------------------------------
def _chat(tokenizer: Any, user: str, assistant: str) -> list[int]:
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    encoded: Any = tokenizer.apply_chat_template(messages, tokenize=True)
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return [int(t) for t in encoded]


def _documents(source: str) -> list[tuple[str, str]]:
    """``(user, assistant)`` pairs of corpus ``source`` (a ``.jsonl`` path or ``stdlib``), in a fixed order."""
    if source == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in root.glob("*.py") if p.stat().st_size < 200_000)
        pairs = []
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            pairs.append((f"Write the Python module `{path.stem}`.", text))
        return pairs
    path = Path(source)
    if not path.is_file():
        raise SpecDecError(f"train-head: corpus {source!r} is neither 'stdlib' nor a JSONL file")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pairs.append((str(row["question"]), _CALCULATOR.sub("", str(row["answer"]))))
        except (ValueError, KeyError, TypeError) as error:
            raise SpecDecError(f"train-head: {source}, line {number}: not a {{'question', 'answer'}} row") from error
    return pairs


def corpus_windows(config: TrainConfig, tokenizer: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Training and validation windows of ``config.window`` tokens each (module docstring, step 1)."""
    train: list[list[int]] = []
    valid: list[list[int]] = []
    share = config.tokens // len(config.corpora)
    for source in config.corpora:
        documents = _documents(source)
        random.Random(f"{config.seed}-{source}").shuffle(documents)
        cut = max(1, int(len(documents) * (1 - config.holdout)))
        for part, out, budget in ((documents[:cut], train, share),
                                  (documents[cut:], valid, max(config.window, int(share * config.holdout)))):
            stream: list[int] = []
            for user, assistant in part:
                stream.extend(_chat(tokenizer, user, assistant))
                if len(stream) >= budget:
                    break
            usable = min(len(stream), budget) // config.window * config.window
            out.extend(stream[i : i + config.window] for i in range(0, usable, config.window))
    return train, valid


# -- 2. the target's features, computed once ------------------------------------------------------
def _cache_path(config: TrainConfig, model: Any, windows: Sequence[Sequence[int]]) -> Path:
    digest = hashlib.sha256()
    digest.update(json.dumps([type(model).__name__, int(model.config.hidden_size),
                              str(next(model.parameters()).dtype)]).encode())  # fmt: skip
    digest.update(np.asarray(windows, dtype=np.int32).tobytes())
    for parameter in list(model.parameters())[:3]:  # the weights, cheaply: a change anywhere near the input shows
        digest.update(parameter.detach().flatten()[:4096].float().numpy().tobytes())
    return cache_dir() / "eagle-features" / f"{digest.hexdigest()[:16]}.pt"


@torch.no_grad()
def extract(
    model: Any, windows: Sequence[Sequence[int]], config: TrainConfig,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(tokens int64 [W, T], features float16 [W, T, H], argmax int32 [W, T])`` of the target on ``windows``,
    read from the cache when computed before."""
    path = _cache_path(config, model, windows)
    tokens = torch.tensor(windows, dtype=torch.long)
    if path.is_file():
        saved = torch.load(path)
        return tokens, saved["features"], saved["argmax"]
    count, length = tokens.shape
    features = torch.empty(count, length, int(model.config.hidden_size), dtype=torch.float16)
    argmax = torch.empty(count, length, dtype=torch.int32)
    step = 4  # windows per forward: 4 x 512 tokens keep the logits at ~400 MB
    for start in range(0, count, step):
        out = model(input_ids=tokens[start : start + step], output_hidden_states=True)
        features[start : start + step] = out.hidden_states[-1].to(torch.float16)  # after the final norm
        argmax[start : start + step] = out.logits.argmax(-1).to(torch.int32)
        if progress is not None:
            progress(min(start + step, count), count)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"features": features, "argmax": argmax}, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return tokens, features, argmax


def draft_vocabulary(argmax: torch.Tensor, size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` ids the target predicted most often in ``argmax`` (ties: the lower id), sorted: int64."""
    counts = torch.bincount(argmax.flatten().to(torch.long), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))[: min(size, vocab_size)]
    return torch.tensor(sorted(order), dtype=torch.long)


# -- 4. training ----------------------------------------------------------------------------------
def _losses(
    head: EagleHead, tokens: torch.Tensor, features: torch.Tensor, argmax: torch.Tensor, index: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:  # fmt: skip
    """Smooth-L1 and cross-entropy losses of a batch, its top-1 hits and position count.

    ``tokens`` int64 ``[B, T]``, ``features`` float ``[B, T, H]``, ``argmax`` int64 ``[B, T]``; ``index`` int64
    ``[V]`` maps a token id to its draft-vocabulary index (-1: outside it).
    """
    batch, length = tokens.shape
    positions = torch.arange(length - 1).expand(batch, -1)
    predicted = head(features[:, :-1], tokens[:, 1:], positions)  # [B, T-1, H]: f^_{t+1}
    regression = torch.nn.functional.smooth_l1_loss(predicted, features[:, 1:])
    logits = head.logits(predicted)  # [B, T-1, V_d]
    wanted = index[argmax[:, 1:]]  # [B, T-1]: the target's next token, in the draft vocabulary (-1: outside)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), wanted.flatten(), ignore_index=-1)
    hits = (head.draft_vocab[logits.argmax(-1)] == argmax[:, 1:]).sum()
    return regression, ce, hits, batch * (length - 1)


def init_from_target(head: EagleHead, model: Any, seed: int) -> None:
    """The head's layer from the target's last decoder layer; ``fc`` from noise (seeded)."""
    head.layer.load_state_dict(model.model.layers[-1].state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bound = 1 / math.sqrt(head.fc.in_features)
        head.fc.weight.copy_(torch.rand(head.fc.weight.shape, generator=generator) * 2 * bound - bound)
        head.fc.bias.zero_()


def train(
    model: Any, config: TrainConfig, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    valid: tuple[torch.Tensor, torch.Tensor, torch.Tensor], log: Callable[[str], None] = print,
) -> tuple[EagleHead, dict[str, Any]]:  # fmt: skip
    """A head trained on ``data`` (``extract``'s triple) and its validation result on ``valid``."""
    tokens, features, argmax = data
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    vocab = draft_vocabulary(argmax, config.draft_vocab, vocab_size)
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[vocab] = torch.arange(vocab.numel())
    torch.manual_seed(config.seed)
    head = EagleHead(model, vocab)
    init_from_target(head, model, config.seed)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    steps = config.epochs * math.ceil(tokens.shape[0] / config.batch)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    generator = torch.Generator().manual_seed(config.seed)
    started, step = time.perf_counter(), 0
    for epoch in range(config.epochs):
        order = torch.randperm(tokens.shape[0], generator=generator)
        for first in range(0, len(order), config.batch):
            rows = order[first : first + config.batch]
            regression, ce, hits, count = _losses(head, tokens[rows], features[rows].float(), argmax[rows].long(),
                                                  index)  # fmt: skip
            loss = regression + config.ce_weight * ce
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step % 50 == 0 or step == steps:
                log(f"epoch {epoch + 1} step {step}/{steps}: smooth-L1 {float(regression.detach()):.4f} "
                    f"CE {float(ce.detach()):.3f} top-1 {int(hits) / count:.3f} "
                    f"({time.perf_counter() - started:.0f} s)")
    result = evaluate(head, valid, index)
    coverage = float((index[argmax.flatten().long()] >= 0).float().mean())
    result.update(train_s=round(time.perf_counter() - started, 1), train_windows=int(tokens.shape[0]),
                  draft_vocab_coverage=round(coverage, 4))  # fmt: skip
    log(f"validation: {result}")
    head.eval()
    return head, result


@torch.no_grad()
def evaluate(head: EagleHead, valid: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
             index: torch.Tensor) -> dict[str, Any]:  # fmt: skip
    """Top-1 agreement with the target on held-out windows (the head reads the target's true features)."""
    tokens, features, argmax = valid
    hits = total = 0
    regression = 0.0
    for first in range(0, tokens.shape[0], 4):
        part = slice(first, first + 4)
        loss, _, h, count = _losses(head, tokens[part], features[part].float(), argmax[part].long(), index)
        hits, total, regression = hits + int(h), total + count, regression + float(loss) * count
    return {"valid_top1": round(hits / max(total, 1), 4), "valid_smooth_l1": round(regression / max(total, 1), 5),
            "valid_positions": total}


def settings(config: TrainConfig) -> dict[str, Any]:
    """``config`` as the JSON a head file's ``trained`` metadata holds."""
    out = asdict(config)
    out["corpora"] = [Path(c).name if c != "stdlib" else c for c in config.corpora]
    return out
