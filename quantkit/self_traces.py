"""`quantkit calibrate --self-traces N`: the original model answers N of the sources' chat prompts
with thinking on (greedy, or sampled at --trace-temperature), and each prompt with its answer,
thinking included in the model's own markers as it generated them, joins the calibration set.
A model quantized on its own reasoning sees the activations it will see when it thinks.
Generation is transformers' generate, batched, on the GPU where there is one, else the CPU."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Final

from quantkit import console
from quantkit.errors import BadInput
from quantkit.records import SelfTracesRecord
from quantkit.sources import SourceSpec, read_documents
from quantkit.thinking import Thinking

BATCH = 8  # prompts per generate call: a batch of 8 costs about one prompt's time on a CPU
ORIGIN: Final = "self-traces"  # a sample's source, and its key in the origins


def check_traceable(tok: Any, model: str) -> None:
    """A model without a chat template cannot be asked a chat prompt: BadInput before any work."""
    if not tok.chat_template:
        raise BadInput(f"--self-traces: {model} has no chat template, so it cannot be asked the "
                       "sources' prompts", "leave --self-traces out, or use a chat model")


def trace_prompts(specs: list[SourceSpec], n: int, seed: int) -> list[list[dict[str, str]]]:
    """N chats of the sources, each cut after its last user turn, picked with `seed`."""
    chats = []
    for spec in specs:
        for doc in read_documents(spec):
            msgs = list(doc.messages or [])
            last = max((i for i, (role, _) in enumerate(msgs) if role == "user"), default=-1)
            if last >= 0:
                chats.append([{"role": r, "content": c} for r, c in msgs[:last + 1]])
    if len(chats) < n:
        raise BadInput(f"--self-traces {n}: the sources hold {len(chats)} chat prompts",
                       f"use --self-traces {len(chats)} or fewer, or add a chat source"
                       if chats else "add a chat source (messages or prompt/completion)")
    random.Random(f"{seed}:self-traces").shuffle(chats)
    return chats[:n]


def generate_traces(model_dir: Path, tok: Any, th: Thinking, chats: list[list[dict[str, str]]],
                    *, max_new_tokens: int, temperature: float, top_p: float, seed: int
                    ) -> list[list[int]]:
    """Each chat's prompt and the model's answer as token ids, thinking on where it thinks."""
    import torch

    from quantkit.models import load_model

    mode = "on" if th.thinks else "auto"
    prompts = []
    for chat in chats:
        msgs, kwargs = th.with_mode(chat, mode)
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(model_dir, device=device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = tok.eos_token_id
    out: list[list[int]] = []
    torch.manual_seed(seed)
    sampling = ({"do_sample": True, "temperature": temperature, "top_p": top_p}
                if temperature > 0 else {"do_sample": False})
    starts = console.progress(range(0, len(prompts), BATCH), "self-traces",
                              total=-(-len(prompts) // BATCH))
    for start in starts:
        batch = prompts[start:start + BATCH]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, **sampling)
        for p, row in zip(batch, gen[:, width:].tolist(), strict=True):
            answer = row[:row.index(eos) + 1] if eos in row else row
            out.append(p + answer)
    return out


def pack(traces: list[list[int]], sep: int, min_tokens: int, max_tokens: int) -> list[list[int]]:
    """Samples of the traces as the sources' are made: a long one cut at max_tokens, short ones
    packed with the separator until min_tokens."""
    samples: list[list[int]] = []
    buf: list[int] = []
    for ids in traces:
        if len(ids) >= min_tokens:
            samples.append(ids[:max_tokens])
            continue
        buf = buf + [sep] + ids if buf else list(ids)
        if len(buf) >= min_tokens:
            samples.append(buf[:max_tokens])
            buf = []
    return samples


def record(th: Thinking, n: int, samples: list[list[int]], cfg: Any) -> SelfTracesRecord:
    """The manifest's record of the self-traces: how many, how generated, samples and tokens."""
    return {"prompts": n, "samples": len(samples), "tokens": sum(map(len, samples)),
            "thinking": "on" if th.thinks else "off (no thinking mode)",
            "temperature": cfg.trace_temperature, "top_p": cfg.trace_top_p,
            "max_new_tokens": cfg.trace_max_tokens}
