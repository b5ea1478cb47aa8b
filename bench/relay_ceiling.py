"""The front's relay ceiling on this machine: a fake SSE upstream (aiohttp) streaming as fast as it
can, STREAMS clients reading N_CHUNKS each, direct and through quantkit's front (uvicorn, Starlette
and aiohttp, as `quantkit serve` runs it); chunks/s each way, twice, side by side in one run.
usage: python bench/relay_ceiling.py N_CHUNKS STREAMS [STACK ...]
  STACK: the front's event loop and HTTP parser, LOOP-HTTP with LOOP asyncio|uvloop and HTTP
  h11|httptools (default: auto-auto, what `quantkit serve` gets: uvloop and httptools when
  installed)."""
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import sys
import time

import aiohttp
from aiohttp import web

N_CHUNKS, STREAMS = int(sys.argv[1]), int(sys.argv[2])
EVENT = {"id": "x", "object": "text_completion", "model": "m",
         "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": None}]}
CHUNK = b"data: " + json.dumps(EVENT).encode() + b"\n\n"
BODY = {"model": "m", "prompt": "hi", "max_tokens": 16, "stream": True}


def upstream(port: int) -> None:
    async def completions(req: web.Request) -> web.StreamResponse:
        await req.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(req)
        for i in range(N_CHUNKS):
            await resp.write(CHUNK)
            if i % 4 == 0:
                await asyncio.sleep(0.0005)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def front(port: int, up: int, stack: str) -> None:
    import uvicorn

    from quantkit.serve.front import FrontState, create_app

    state = FrontState(upstream=f"http://127.0.0.1:{up}", name="m", engine_model="m",
                       ctx_size=4096, engine="vllm", ready=True)

    @contextlib.asynccontextmanager
    async def life(app):
        state.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None))
        yield
        await state.session.close()

    loop, http = stack.split("-")
    uvicorn.run(create_app(state, lifespan=life), host="127.0.0.1", port=port, loop=loop,
                http=http, log_level="warning", access_log=False)


async def load(port: int) -> tuple[float, int]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one() -> int:
            n = 0
            async with s.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY) as r:
                async for line in r.content:
                    n += line.startswith(b"data: {")
            return n

        t = time.perf_counter()
        counts = await asyncio.gather(*[one() for _ in range(STREAMS)])
        return sum(counts) / (time.perf_counter() - t), sum(counts)


if __name__ == "__main__":
    stacks = sys.argv[3:] or ["auto-auto"]
    mp.Process(target=upstream, args=(18001,), daemon=True).start()
    fronts = {stack: 18002 + i for i, stack in enumerate(stacks)}
    for stack, port in fronts.items():
        mp.Process(target=front, args=(port, 18001, stack), daemon=True).start()
    time.sleep(15)  # the fronts import quantkit and starlette
    rates: dict[str, list[float]] = {}
    for _ in range(int(os.environ.get("ROUNDS", "2"))):
        for name, port in {"direct": 18001, **{f"front {s}": p for s, p in fronts.items()}}.items():
            rate, n = asyncio.run(load(port))
            rates.setdefault(name, []).append(rate)
            print(f"{name}: {rate:.0f} chunks/s ({n} chunks, {STREAMS} streams)", flush=True)
    best = {name: max(r) for name, r in rates.items()}
    for name, rate in best.items():
        print(f"best {name}: {rate:.0f} chunks/s, {rate / best['direct']:.2f}x direct")
