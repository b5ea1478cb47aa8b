"""The HTTP side of `quantkit bench`: streamed requests, one concurrency level, the server's model.

Every chunk of a stream is timed with perf_counter as it arrives; nothing here computes statistics.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from quantkit import console
from quantkit.errors import BadInput, EngineError
from quantkit.loadtest.prompts import Prompt
from quantkit.loadtest.stats import RequestRecord, summarize_level
from quantkit.loadtest.wire import (
    ENDPOINTS,
    OPTIONAL_FIELDS,
    OPTIONAL_NAMES,
    OptionalFields,
    Server,
    request_body,
)

if TYPE_CHECKING:
    from quantkit.records import BenchLevel, BenchRow, GpuWindow

# -- one streamed request --------------------------------------------------------------------------

# A streamed event (and a /v1/models card) is the server's open JSON: read with .get, checked.

def _text_of(event: dict[str, Any]) -> str:
    out = []
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        out.append(str(choice.get("text") or delta.get("content") or delta.get("reasoning_content")
                       or delta.get("reasoning") or ""))
    return "".join(out)


def _is_token(event: dict[str, Any]) -> bool:
    """A chunk that carries a generated token: text, or an empty piece (a token whose UTF-8 is
    not complete yet) that is neither the chat role chunk nor the final one."""
    if _text_of(event):
        return True
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") is None and "role" not in delta and (
                choice.get("text") is not None or delta.get("content") is not None):
            return True
    return False


async def stream_request(session: Any, target: Server, prompt: Prompt,
                         extra: OptionalFields | None = None) -> tuple[int | None, RequestRecord]:
    """Send one streamed request; (HTTP status or None, what it measured)."""
    import aiohttp

    perf = time.perf_counter
    start = perf()
    first = last = None
    gaps: list[float] = []
    chunks, events, usage, finish = 0, 0, None, None
    try:
        async with session.post(target.url, json=request_body(target, prompt, extra)) as resp:
            if resp.status != 200:
                detail = (await resp.text(errors="replace")).strip()
                return resp.status, RequestRecord(prompt.prompt_class,
                                                  f"HTTP {resp.status}: {detail[:300]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if not isinstance(event, dict) or event.get("error"):
                    error = event.get("error") if isinstance(event, dict) else event
                    return 200, RequestRecord(prompt.prompt_class, f"stream error: {error}"[:300])
                events += 1
                usage = event.get("usage") or usage
                finish = next((c["finish_reason"] for c in event.get("choices") or []
                               if isinstance(c, dict) and c.get("finish_reason")), finish)
                if _is_token(event):
                    now = perf()
                    if last is not None:
                        gaps.append(now - last)
                    first = first if first is not None else now
                    last, chunks = now, chunks + 1
        end = perf()
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return None, RequestRecord(prompt.prompt_class, f"{type(exc).__name__}: {exc}"[:300])
    usage = usage if isinstance(usage, dict) else {}
    tokens, prompt_tokens = usage.get("completion_tokens"), usage.get("prompt_tokens")
    counted = isinstance(tokens, int) and not isinstance(tokens, bool)
    if first is None:
        if counted and tokens and finish:
            # tokens were generated, but their bytes never completed a UTF-8 character, so the
            # server held the text back (a random-weight model repeating a partial byte token)
            return 200, RequestRecord(prompt.prompt_class, None, None, end - start, (), tokens,
                                      prompt_tokens if isinstance(prompt_tokens, int) else None,
                                      True, no_text=True)
        return 200, RequestRecord(prompt.prompt_class, f"the server streamed no text ({events} "
                                  f"events, finish_reason {finish!r}, usage {usage or None})")
    return 200, RequestRecord(
        prompt.prompt_class, None, first - start, end - start, tuple(gaps),
        tokens if isinstance(tokens, int) and counted else chunks,
        prompt_tokens if isinstance(prompt_tokens, int) else None, counted)


@dataclass
class _Level:
    """One repeat of a level in progress: what was sent and what the counted requests took."""

    count: int
    min_seconds: float
    sent: int = 0
    counted: int = 0
    pending: int = 0
    start: float | None = None
    end: float = 0.0
    busy: float = 0.0

    def counting(self) -> bool:
        """Whether the next request is counted: until `count` were sent and `min_seconds` ran."""
        return self.counted < self.count or self.start is None or (
            time.perf_counter() - self.start < self.min_seconds)


async def run_level(session: Any, target: Server, prompts: Iterator[Prompt], concurrency: int,
                    warmup: int = 0, count: int = 1, min_seconds: float = 0.0
                    ) -> tuple[list[RequestRecord], dict[str, float]]:
    """One repeat of a level at steady state: `concurrency` requests always in flight; the first
    `warmup` not counted; then counted ones until `count` were sent and `min_seconds` passed; then
    uncounted ones until every counted request finished (and those are cancelled). So every
    counted request ran under the full load. Returns the counted records and
    {"wall_s": first counted sent to last counted done, "held_s": the seconds the counted
    requests held their slots, over the slots}: held_s is the window they filled at exactly
    `concurrency` in flight, throughput's denominator (Little's law), free of the ramp and the
    drain."""
    state = _Level(count, min_seconds)
    records: list[RequestRecord] = []
    finished = asyncio.Event()
    done: asyncio.Queue[RequestRecord | None] = asyncio.Queue()
    perf = time.perf_counter

    errors: list[BaseException] = []

    def finish() -> None:
        if not finished.is_set():
            finished.set()
            done.put_nowait(None)

    async def worker() -> None:
        while not finished.is_set():
            prompt = next(prompts)
            counted = state.sent >= warmup and state.counting()
            state.sent += 1
            began = perf()
            if counted:
                state.counted += 1
                state.pending += 1
                state.start = began if state.start is None else state.start
            elif state.sent > warmup and state.pending == 0:
                return finish()  # nothing counted is left to hold the load for
            record = (await stream_request(session, target, prompt))[1]
            if not counted:
                continue
            state.pending -= 1
            state.end = perf()
            state.busy += state.end - began
            records.append(record)
            done.put_nowait(record)
            if state.pending == 0 and not state.counting():
                finish()

    async def guarded() -> None:
        try:
            await worker()
        except Exception as exc:  # noqa: BLE001 - raised again below, in the caller's task
            errors.append(exc)
            finish()

    tasks = [asyncio.ensure_future(guarded()) for _ in range(concurrency)]

    def completions() -> Iterator[asyncio.Future[RequestRecord | None]]:
        while True:
            yield asyncio.ensure_future(done.get())

    try:
        for item in console.progress(completions(), f"concurrency {concurrency}", total=count):
            if await item is None:
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if errors:
        raise errors[0]
    wall = state.end - (state.start or state.end)
    return records, {"wall_s": wall, "held_s": state.busy / concurrency}


# -- the server ----------------------------------------------------------------------------------

async def find_model(session: Any, base: str, model: str | None, timeout: float
                     ) -> tuple[str, dict[str, Any]]:
    """The model to ask for (`model`, else the first one GET /v1/models lists) and the server's
    card of it (quantkit serve's names its engine; {} when it lists none)."""
    import aiohttp

    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(base + "/v1/models") as resp:
                status = resp.status
                try:
                    payload = await resp.json(content_type=None) if status == 200 else None
                except ValueError:
                    payload = None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise BadInput(f"cannot reach a server at {base} ({type(exc).__name__}: {exc})",
                           "start it with `quantkit serve ARTIFACT`, or check --url") from None
        if status != 503 or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)  # llama-server answers 503 while it loads the model
    if status in (401, 403):
        raise BadInput(f"{base} refused the request (HTTP {status})",
                       "pass the server's key with --api-key")
    cards = (payload or {}).get("data") if isinstance(payload, dict) else None
    listed = [m for m in cards or [] if isinstance(m, dict) and m.get("id")]
    if model:
        return model, next((m for m in listed if m["id"] == model), {})
    ids = [str(m["id"]) for m in listed]
    if not ids:
        raise BadInput(f"{base}/v1/models listed no model (HTTP {status})",
                       "is this an OpenAI-compatible server? name the model with --model")
    if len(ids) > 1:
        console.warn(escape(f"{base} serves {len(ids)} models; benchmarking {ids[0]!r} "
                            "(pick with --model)"))
    return ids[0], listed[0]


async def warm_up(session: Any, target: Server, timeout: float) -> Server:
    """One request before measuring: waits out a loading server, drops fields it refuses."""
    extra = target.extra.copy()
    prompt = Prompt("short", "Write a short story about a lighthouse keeper.", 8)
    deadline = time.monotonic() + timeout
    while True:
        status, record = await stream_request(session, target, prompt, extra)
        refused = [k for k in extra if status in (400, 422) and k in (record.error or "")]
        if refused:
            console.log(f"the server refuses {', '.join(refused)}; sending requests without it")
            for name in OPTIONAL_NAMES:
                if name in refused:
                    del extra[name]
        elif status == 503 and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
        else:
            break
    if record.error and status in (400, 401, 403, 404, 422):
        raise BadInput(f"the server refused the warm-up request: {record.error}",
                       "check --model, --endpoint and --api-key")
    if record.error:
        raise EngineError(f"the warm-up request to {target.url} failed: {record.error}",
                          "read the server's log")
    return Server(target.url, target.endpoint, target.model, extra)


async def tokens_per_word(session: Any, target: Server, guess: float) -> float:
    """How many tokens the server's tokenizer makes of one word of the benchmark's prose, from the
    prompt_tokens it reports for a medium prompt; `guess` when it reports none. Prompts are then
    sized by the server's tokenizer: a code-trained vocabulary may need twice the tokens, and a
    prompt sized by the guess would then overflow a 2k context."""
    import random

    from quantkit.loadtest.prompts import PROMPT_TOKENS, prompt_text

    text = prompt_text("medium", random.Random("calibrate"), guess)
    body = Prompt("medium", text, 1)
    _, record = await stream_request(session, target, body)
    if record.error or not record.prompt_tokens:
        return guess
    measured = guess * record.prompt_tokens / PROMPT_TOKENS["medium"]
    return round(measured, 3) if abs(measured / guess - 1) > 0.1 else guess


@dataclass(frozen=True)
class Measured:
    """What `measure` hands `quantkit bench`: the model asked for, the server's card of it, the
    optional fields it took, the levels (combined over the repeats), every counted request, the
    warm-up's seconds, the tokenizer's tokens per word and the seconds a repeat ran at least."""

    model: str
    card: dict[str, Any]  # the server's /v1/models entry: open JSON
    sent: dict[str, Any]  # the OptionalFields the server took; BenchSettings.sent_fields' type
    levels: list[BenchLevel]
    records: list[RequestRecord]
    warmup_s: float
    tokens_per_word: float
    min_seconds: float


@dataclass(frozen=True)
class Protocol:
    """How each level is measured: `repeats` runs, each `warmup` uncounted requests (None: one
    wave), then counted ones until `requests` (None: 4 waves) were sent and `min_seconds` (None:
    `min_seconds_for(card)`, by the server's engine) passed."""

    repeats: int = 1
    warmup: int | None = 0
    requests: int | None = None
    min_seconds: float | None = 0.0
    seed: int = 0


WAVES = 4  # counted requests per repeat of a level, at least, in waves of its concurrency


async def measure(base: str, model: str | None, endpoint: str, api_key: str | None,
                  levels: Sequence[int], prompts: Callable[[float, int, int], Iterator[Prompt]],
                  timeout: float, protocol: Protocol,
                  min_seconds_for: Callable[[dict[str, Any]], float] = lambda card: 0.0,
                  gpu: Callable[[float, float], GpuWindow | None] | None = None) -> Measured:
    """Find the model, warm up, size the prompts by the server's tokenizer, run every level
    `protocol.repeats` times (sweep after sweep, repeat r with seed + r: `prompts(tokens_per_word,
    level, seed)`); the rows (combined over the repeats), the raw records and what was sent.
    `gpu(t0, t1)`: how busy the server's GPU was over a repeat's counted stretch (its row's
    `gpu`)."""
    import aiohttp

    from quantkit.loadtest.stats import combine_repeats

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
    # force_close: servers (llama-server) drop idle keep-alive sockets between levels
    connector = aiohttp.TCPConnector(limit=max(levels), force_close=True)
    async with aiohttp.ClientSession(headers=headers, timeout=limits, connector=connector) as s:
        name, card = await find_model(s, base, model, timeout)
        target = Server(base + ENDPOINTS[endpoint], endpoint, name, OPTIONAL_FIELDS.copy())
        min_seconds = (protocol.min_seconds if protocol.min_seconds is not None
                       else min_seconds_for(card))
        console.log(escape(f"warming up {target.model} at {base}"))
        started = time.perf_counter()
        target = await warm_up(s, target, timeout)
        warmup_s = time.perf_counter() - started
        from quantkit.loadtest.prompts import TOKENS_PER_WORD

        ratio = await tokens_per_word(s, target, TOKENS_PER_WORD)
        if ratio != TOKENS_PER_WORD:
            console.log(f"the server's tokenizer makes {ratio:.2f} tokens of a word (not "
                        f"{TOKENS_PER_WORD}): prompts are sized by it")
        runs: dict[int, list[tuple[BenchRow, list[RequestRecord], int]]] = {}
        seen: list[RequestRecord] = []
        for r in range(protocol.repeats):
            seed = protocol.seed + r
            failed = False
            for c in levels:
                records, times = await run_level(
                    s, target, prompts(ratio, c, seed), c,
                    warmup=c if protocol.warmup is None else protocol.warmup,
                    count=protocol.requests or WAVES * c, min_seconds=min_seconds)
                row = summarize_level(c, records, times["wall_s"], times["held_s"])
                if gpu is not None:  # the counted stretch: wall_s up to now
                    now = time.time()
                    row["gpu"] = gpu(now - times["wall_s"], now)
                runs.setdefault(c, []).append((row, records, seed))
                seen += records
                console.log(_describe(row) + (f" (repeat {r + 1} of {protocol.repeats})"
                                              if protocol.repeats > 1 else ""))
                if not row["completed"]:
                    console.warn(f"every request failed at concurrency {c}; stopping here")
                    failed = True
                    break
            if failed:
                break
        rows = [combine_repeats([x[0] for x in runs[c]], [rec for x in runs[c] for rec in x[1]],
                                [x[2] for x in runs[c]]) for c in levels if c in runs]
    return Measured(target.model, card, dict(target.extra), rows, seen, warmup_s, ratio,
                    min_seconds)


def _describe(row: BenchRow) -> str:
    ttft = row["ttft_s"]

    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v * 1000:.0f} ms"

    return (f"concurrency {row['concurrency']}: {row['request_throughput']:.2f} req/s, "
            f"{row['output_token_throughput']:.1f} tok/s, TTFT P50 {ms(ttft['p50'])} "
            f"P99 {ms(ttft['p99'])}, errors {row['errors']}")
