"""`quantkit serve`: the validated artifact behind an OpenAI-compatible server.

quantkit checks that the artifact passed validation, starts the production engine for its format
(llama-server, vLLM or `transformers serve`) on a private port, warms it with typical requests,
and fronts it on --host:--port (503 on /health until warm). Ctrl-C stops the engine too."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit import console
from quantkit.errors import EngineError
from quantkit.serve.target import find_validation, resolve_target

if TYPE_CHECKING:
    from quantkit.config import ServeConfig
    from quantkit.serve.launcher import Launch

LOAD_TIMEOUT_S = 900.0
WARM_PROMPT = ("Summarise the following notes for a colleague who missed the meeting. " * 12)


def prepare(artifact: Path, *, cfg: ServeConfig | None = None, allow_unvalidated: bool = False,
            reports: Path = Path("reports")) -> dict[str, Any]:
    """Everything checked before a process starts: target, validation, engine, command."""
    from quantkit.config import ServeConfig as Defaults
    from quantkit.engines.choice import checkpoint_of, choose_engine
    from quantkit.serve.engines.vllm import check_split
    from quantkit.serve.launcher import build_launch, serve_context
    from quantkit.serve.process import check_port, free_port

    opts = cfg or Defaults()
    opts.check()

    target = resolve_target(artifact)
    split = check_split(target, opts)  # the shapes must split over the GPUs before any start
    ctx = serve_context(target, opts)
    if allow_unvalidated:
        validation: dict[str, Any] = {"verdict": "unvalidated"}
        console.warn(f"serving {artifact} without checking its validation (--allow-unvalidated)")
    else:
        validation = find_validation(target, reports)
        if validation["verdict"] != "pass":
            console.warn(f"{validation['results']} has no thresholds (verdict "
                         f"{validation['verdict']!r}); serving anyway")
    if opts.host not in ("127.0.0.1", "localhost", "::1") and not opts.api_key:
        console.warn(f"listening on {opts.host} without --api-key: anyone who can reach it can use it")
    check_port(opts.host, opts.port)
    # the engine validation chose for this checkpoint, reached as a server program here
    name = choose_engine(checkpoint_of(target.path), opts.engine, "serve", opts)
    launch = build_launch(name, target, opts, free_port(), ctx)
    launch.notes += split
    launch.draft_model = opts.draft_model or None
    return {"target": target, "validation": validation, "engine": name, "launch": launch}


async def wait_healthy(session: Any, launch: Launch, proc: Any, headers: dict[str, str],
                       timeout: float = LOAD_TIMEOUT_S) -> None:
    """Poll the engine's readiness path until 200; fail fast if the process dies."""
    import aiohttp

    url = f"http://127.0.0.1:{launch.port}{launch.health_path}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.exited() is not None:
            draft = launch.draft_model
            said = proc.last_lines(40).lower()
            if draft and any(word in said for word in ("draft", "speculative")):
                raise EngineError(f"{launch.engine} could not start with the draft model "
                                  f"{draft} (exit code {proc.exited()}): {proc.last_lines()}",
                                  "serve without draft_model, or with a draft of the same "
                                  "family and tokenizer")
            raise EngineError(f"{launch.engine} exited with code {proc.exited()} while loading: "
                              f"{proc.last_lines()}", "see the engine's log lines above")
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.25)
    raise EngineError(f"{launch.engine} did not become ready in {timeout:.0f} s",
                      "check the engine's log (--log-file)")


async def warm_up(session: Any, launch: Launch, slots: int, headers: dict[str, str]
                  ) -> dict[str, float]:
    """Typical requests before traffic: a chat turn, a long prompt, then `slots` at once."""
    base = f"http://127.0.0.1:{launch.port}"

    async def one(path: str, body: dict[str, Any]) -> None:
        body = {"model": launch.model_id, "max_tokens": 8, "temperature": 0, **body}
        async with session.post(base + path, json=body, headers=headers) as r:
            text = await r.text()
            if r.status != 200:
                raise EngineError(f"warm-up request to {launch.engine} failed ({r.status}): "
                                  f"{text[:200]}", "check the engine's log (--log-file)")

    timings = {}
    t = time.perf_counter()
    await one("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello!"}]})
    timings["chat_s"] = time.perf_counter() - t
    t = time.perf_counter()
    await one("/v1/completions", {"prompt": WARM_PROMPT})
    timings["long_prompt_s"] = time.perf_counter() - t
    t = time.perf_counter()
    n = max(1, min(slots, 8))
    await asyncio.gather(*[one("/v1/completions", {"prompt": f"{i + 1}. A list of ", "max_tokens": 16})
                           for i in range(n)])
    timings[f"concurrent_{n}_s"] = time.perf_counter() - t
    return {k: round(v, 3) for k, v in timings.items()}


def serve(artifact: Path, *, cfg: ServeConfig | None = None, allow_unvalidated: bool = False,
          reports: Path = Path("reports"), log_file: Path | None = None,
          ready_file: Path | None = None) -> dict[str, Any]:
    """Serve until interrupted; returns how it ended. Raises EngineError if the engine dies."""
    import aiohttp
    import uvicorn

    from quantkit.config import ServeConfig as Defaults
    from quantkit.engines.choice import ENGINES
    from quantkit.serve.engines.vllm import kernel_from_log, kernel_warning, served_kv_cache
    from quantkit.serve.front import FrontState, _auth, create_app
    from quantkit.serve.process import EngineProcess

    opts = cfg or Defaults()
    plan = prepare(artifact, cfg=opts, allow_unvalidated=allow_unvalidated, reports=reports)
    launch: Launch = plan["launch"]
    spec = ENGINES[plan["engine"]]
    for note in launch.notes:
        console.warn(note)
    kernels: list[str] = []

    def on_line(line: str) -> None:
        kernel = kernel_from_log(line) if spec.kernels else None
        if kernel and kernel not in kernels:
            kernels.append(kernel)
            if (msg := kernel_warning(kernel, opts)):
                console.warn(msg)

    proc = EngineProcess(launch, log_file=log_file, on_line=on_line)
    state = FrontState(upstream=f"http://127.0.0.1:{launch.port}", name=plan["target"].name,
                       engine_model=launch.model_id, ctx_size=launch.ctx_size,
                       engine=launch.engine, root=plan["target"].root, api_key=opts.api_key,
                       metrics_path=launch.metrics_path)
    target = plan["target"]
    state.info = {"artifact": str(target.artifact), "format": target.format,
                  "model_file": str(target.path.resolve()) if target.path.is_file() else None,
                  "size_bytes": target.size_bytes, "engine_command": launch.cmd,
                  "bits_per_weight": target.manifest and target.manifest.bits_per_weight,
                  "method": target.manifest and target.manifest.method, "batching": launch.batching,
                  "kernels": kernels, "max_num_seqs": opts.max_num_seqs,
                  "tensor_parallel_size": opts.tensor_parallel_size,
                  "pipeline_parallel_size": opts.pipeline_parallel_size}
    if spec.kernels:
        state.info["kernel_requested"] = opts.vllm_kernel
    if spec.kv_cache_fp8:
        state.info["kv_cache_dtype"] = served_kv_cache(target, opts)
    outcome: dict[str, Any] = {"engine": launch.engine, "command": launch.cmd,
                               "validation": plan["validation"]}
    server: uvicorn.Server | None = None

    async def bring_up() -> None:
        try:
            headers = _auth(state)
            await wait_healthy(state.session, launch, proc, headers)
            t = time.perf_counter()
            outcome["warm_up"] = await warm_up(state.session, launch, opts.max_num_seqs, headers)
            state.ready = True
            url = f"http://{opts.host}:{opts.port}/v1"
            console.log(f"ready: {state.name} on {launch.engine} at {url} "
                        f"(warm-up {time.perf_counter() - t:.1f} s)")
            if ready_file:
                ready_file.write_text(url + "\n", encoding="utf-8")
            while proc.exited() is None:
                await asyncio.sleep(0.5)
            raise EngineError(f"{launch.engine} exited with code {proc.exited()}: "
                              f"{proc.last_lines()}", "see the engine's log (--log-file)")
        except Exception as exc:  # noqa: BLE001 - any failure here ends serving, with its reason
            err = exc if isinstance(exc, EngineError) else EngineError(
                f"{launch.engine} failed while starting: {type(exc).__name__}: {exc}; "
                f"{proc.last_lines()}", "see the engine's log (--log-file)")
            state.failed = err.message
            outcome["error"] = err
            if server is not None:
                server.should_exit = True

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        # force_close: llama-server drops idle keep-alive sockets, and a write into one fails
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        state.session = aiohttp.ClientSession(connector=connector,
                                              timeout=aiohttp.ClientTimeout(total=None))
        proc.start()
        state.info["engine_pid"] = proc.proc.pid if proc.proc else None
        task = asyncio.create_task(bring_up())
        try:
            yield
        finally:
            task.cancel()
            proc.stop()
            await state.session.close()

    app = create_app(state, lifespan=lifespan)
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level="warning",
                            timeout_graceful_shutdown=5, access_log=False)
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        outcome["stopped_by"] = "interrupt"
    finally:
        proc.stop()
    outcome["kernels"] = kernels
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome
