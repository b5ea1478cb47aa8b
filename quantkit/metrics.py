"""Small shared numerics for benchmarks and validators: perplexity over fixed-length windows."""

from __future__ import annotations

import math
from typing import Any


def token_windows(tok: Any, texts: list[str], length: int, limit: int) -> Any:
    """Concatenate texts (EOS between them) and cut `limit` windows of `length` tokens."""
    import torch

    ids: list[int] = []
    for text in texts:
        ids += tok(text)["input_ids"] + [tok.eos_token_id]
        if len(ids) >= length * limit:
            break
    usable = min(limit, len(ids) // length)
    return torch.tensor(ids[: usable * length]).view(usable, length)


def perplexity(model: Any, windows: Any, device: Any = "cpu") -> float:
    """exp(mean next-token NLL) of a causal LM over the windows, one window at a time."""
    import torch

    nll, count = 0.0, 0
    with torch.no_grad():
        for row in windows:
            ids = row[None].to(device)
            logits = model(input_ids=ids).logits.float()
            nll += float(torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:],
                                                           reduction="sum"))
            count += ids.shape[1] - 1
    return math.exp(nll / count)
