"""The tests' thinking model: a tiny llama trained on the CPU (about a minute, seed fixed) on
synthetic `<think> reasoning </think> answer` dialogues rendered through Qwen3's own chat template
(tests/data/chat_templates/qwen3.jinja: thinking on by default, `enable_thinking` switches it off),
so that with thinking on it opens <think>, writes a few reasoning tokens, closes </think> and
answers in a few tokens. A random-weight model cannot think; this one can, and a quantization that
damages it shows as thinking that loops or never closes.
Bench scripts put tests/ on sys.path and import it: `from _thinking import build_thinking_model`."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

QWEN3_TEMPLATE = Path(__file__).parent / "data" / "chat_templates" / "qwen3.jinja"
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen twenty").split()
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
QUESTIONS = ("What is {a} {op} {b}?", "Tell me {a} {op} {b}.", "Compute {a} {op} {b}, please.",
             "How much is {a} {op} {b}?")
SEED, STEPS, BATCH, OFF_EVERY = 0, 420, 24, 5


def dialogue(rng: random.Random) -> tuple[str, str, str]:
    """(question, reasoning, answer) of one synthetic sum: the reasoning names the numbers,
    says the operation in words, then the result; the answer is the result alone."""
    a, b = rng.randrange(1, 11), rng.randrange(1, 11)
    op = rng.choice(sorted(OPS))
    if op == "minus" and b > a:
        a, b = b, a
    c = OPS[op](a, b)
    question = rng.choice(QUESTIONS).format(a=a, op=op, b=b)
    said = f"{WORDS[a]} {op} {WORDS[b]}"
    reasoning = (f"The user asks for {a} {op} {b}. In words that is {said}. "
                 f"Working it out gives {c}. So the answer is {c}.")
    return question, reasoning, f"It is {c}."


def corpus(n: int, seed: int = SEED) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    return [dialogue(rng) for _ in range(n)]


def thinking_tokenizer(path: Path) -> Any:
    """A byte-level BPE of 512 tokens trained on the dialogues, with Qwen's <|im_start|>,
    <|im_end|> and <|endoftext|> specials, <think> and </think> as added (not special) tokens
    as Qwen3 has them, and Qwen3's chat template; saved to `path`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    texts = [f"user\n{q}\nassistant\n{r}\n{a}\n" for q, r, a in corpus(2000, seed=SEED + 1)]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    tok.chat_template = QWEN3_TEMPLATE.read_text(encoding="utf-8")
    tok.save_pretrained(path)
    return tok


def _examples(tok: Any, n: int) -> list[tuple[list[int], int]]:
    """(ids, where the assistant's turn starts) of `n` dialogues: one in OFF_EVERY rendered with
    thinking off (the prompt closes an empty <think></think>: only the answer follows), the rest
    with thinking on (the model opens <think> itself)."""
    out = []
    for i, (q, r, a) in enumerate(corpus(n)):
        on = i % OFF_EVERY != 0
        user = [{"role": "user", "content": q}]
        prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=on)
        whole = tok.apply_chat_template(
            [*user, {"role": "assistant", "content": a, "reasoning_content": r if on else ""}],
            tokenize=False, enable_thinking=on)
        ids = tok(whole, add_special_tokens=False)["input_ids"]
        out.append((ids, len(tok(prompt, add_special_tokens=False)["input_ids"])))
    return out


def build_thinking_model(path: Path, *, steps: int = STEPS, seed: int = SEED) -> dict[str, Any]:
    """Train the thinking model into `path` (tokenizer, weights, config); returns how long it took
    and its last loss, also written to `path`/training.json. The loss counts the assistant's turn
    only (the questions are noise)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from quantkit.threads import use_torch_threads

    started = time.perf_counter()
    threads = torch.get_num_threads()
    used = use_torch_threads()  # the idle cores: a pool wider than them spins (quantkit/threads.py)
    tok = thinking_tokenizer(path)
    data = _examples(tok, 3000)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=96, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps,
                                                pct_start=0.1)
    rng = random.Random(seed)
    model.train()
    last = 0.0
    for _ in range(steps):
        batch = rng.sample(data, BATCH)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((BATCH, width), tok.pad_token_id)
        labels = torch.full((BATCH, width), -100)
        mask = torch.zeros((BATCH, width), dtype=torch.long)
        for i, (seq, start) in enumerate(batch):
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, start:len(seq)] = torch.tensor(seq[start:])
            mask[i, :len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        last = loss.item()
    model.eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    torch.set_num_threads(threads)
    info = {"seconds": round(time.perf_counter() - started, 1), "loss": round(last, 4),
            "steps": steps, "batch": BATCH, "seed": seed, "threads": used}
    (path / "training.json").write_text(json.dumps(info) + "\n")
    return info


def generate(path: Path, questions: list[str], *, mode: str = "auto",
             max_new_tokens: int = 96) -> list[tuple[str, str]]:
    """(prompt, greedy continuation) of each question through transformers, in `mode`
    (the template's switch as quantkit.thinking reads it); special tokens kept."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.thinking import tokenizer_thinking

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    kwargs = tokenizer_thinking(tok).template_kwargs(mode)
    out = []
    for q in questions:
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True, **kwargs)
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        out.append((prompt, tok.decode(gen[0, ids["input_ids"].shape[1]:],
                                       skip_special_tokens=True)))
    return out
