"""quantkit's front: the OpenAI-compatible door in front of the engine. It checks what the engines
check unevenly (API key, JSON, model name, max_tokens against the context), answers 503 until the
engine is warm, counts requests/errors/TTFT/tokens for /metrics, and streams everything else
through byte for byte. The engine's own /metrics text is appended, not rewritten."""

from __future__ import annotations

import hmac
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from quantkit.engines.choice import Check

GENERATE = ("/v1/completions", "/v1/chat/completions")
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ServerInfo(TypedDict, total=False):
    """What quantkit serve tells of itself under its card's `quantkit` key (/v1/models), which
    `quantkit doctor` reads (and an engine's doctor hook): the artifact served and how."""

    artifact: str
    format: str                     # its checkpoint format (quantkit.checkpoints)
    model_file: str | None          # a one-file format's file (GGUF), resolved
    size_bytes: int
    engine_command: list[str]
    bits_per_weight: float | None
    method: str | None
    batching: bool
    kernels: list[str]              # the weight-only kernels the engine logged (vLLM)
    max_num_seqs: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kernel_requested: str           # engines with `kernels`: --kernel as vLLM is steered
    kv_cache_dtype: str             # engines with `kv_cache_fp8`: the KV cache served
    engine_pid: int | None          # once the engine process has started


class DoctorHook(Protocol):
    """An engine's doctor hook (`EngineSpec.doctor`, which `quantkit doctor` asks per check): a
    check's name, the server card's `quantkit` info and its /metrics summed by name -> (status,
    reason, fix), or None where the engine has nothing to say."""

    def __call__(self, check: str, info: ServerInfo, totals: dict[str, float], /
                 ) -> Check | None: ...


@dataclass
class FrontState:
    """What the front knows about the engine behind it."""

    upstream: str                  # http://127.0.0.1:PORT
    name: str                      # the served model id
    engine_model: str              # the engine's own id (the body's model is rewritten to it)
    ctx_size: int
    engine: str
    root: str | None = None        # what the model loads from (vLLM's card: clients read it)
    api_key: str | None = None
    metrics_path: str | None = None
    ready: bool = False
    failed: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    info: ServerInfo = field(default_factory=ServerInfo)  # what `quantkit doctor` reads
    session: aiohttp.ClientSession | None = None


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("quantkit_requests", "Requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("quantkit_errors", "Requests answered with an error", ["reason"],
                              registry=r)
        self.ttft = Histogram("quantkit_time_to_first_token_seconds",
                              "Time to the first streamed chunk", buckets=TTFT_BUCKETS, registry=r)
        self.tokens = Counter("quantkit_generated_tokens", "Generated tokens (streamed chunks when "
                              "the engine sends no usage)", registry=r)
        self.tps = Gauge("quantkit_tokens_per_second", "Generated tokens per second of the last "
                         "completed request", registry=r)
        self.in_flight = Gauge("quantkit_requests_in_flight", "Requests being answered", registry=r)
        self.ready = Gauge("quantkit_ready", "1 once the engine is warm", registry=r)
        self.kernel = Gauge("quantkit_weight_kernel", "1 for each weight-only kernel the engine "
                            "logged that it uses (vLLM: Marlin, Machete, ...)", ["kernel"],
                            registry=r)


def error(status: int, message: str, code: str, param: str | None = None,
          etype: str = "invalid_request_error") -> JSONResponse:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def check_body(raw: bytes, state: FrontState) -> tuple[dict[str, Any] | None, JSONResponse | None]:
    """The parsed request, or the 4xx answer it deserves."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, error(400, f"could not parse the JSON body: {exc}", "invalid_json")
    if not isinstance(body, dict):
        return None, error(400, "the JSON body must be an object", "invalid_json")
    model = body.get("model")
    if model not in (None, state.name, state.engine_model):
        return None, error(404, f"the model {model!r} does not exist; this server serves "
                           f"{state.name!r}", "model_not_found", "model")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None, error(400, f"{key} must be a positive integer, got {value!r}",
                               "invalid_value", key)
        if value > state.ctx_size:
            return None, error(400, f"{key}={value} is beyond the model's context of "
                               f"{state.ctx_size} tokens", "context_length_exceeded", key)
    body["model"] = state.engine_model
    return body, None


def create_app(state: FrontState, lifespan: Any = None) -> Starlette:
    metrics = Metrics()

    def authorized(request: Request) -> bool:
        if not state.api_key:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {state.api_key}".encode())

    def unauthorized() -> JSONResponse:
        metrics.errors.labels("unauthorized").inc()
        return error(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer KEY'.",
                     "invalid_api_key")

    async def health(request: Request) -> Response:
        if state.failed:
            return JSONResponse({"status": "error", "reason": state.failed}, status_code=503)
        if not state.ready:
            return JSONResponse({"status": "warming up"}, status_code=503)
        return JSONResponse({"status": "ok", "engine": state.engine})

    async def models(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        # vLLM's ModelCard beside OpenAI's fields: `vllm bench serve` loads its tokenizer from
        # `root`; `parent` names the base model of an adapter (none here)
        card = {"id": state.name, "object": "model", "created": state.created,
                "owned_by": "quantkit", "root": state.root or state.name, "parent": None,
                "max_model_len": state.ctx_size, "permission": [], "engine": state.engine,
                "quantkit": state.info}
        return JSONResponse({"object": "list", "data": [card]})

    async def prometheus(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        metrics.ready.set(1 if state.ready else 0)
        for kernel in state.info.get("kernels") or []:
            metrics.kernel.labels(kernel=kernel).set(1)
        text = generate_latest(metrics.registry)
        if state.metrics_path and state.session is not None:
            try:
                async with state.session.get(state.upstream + state.metrics_path,
                                             headers=_auth(state)) as r:
                    if r.status == 200:
                        text += b"# engine metrics (" + state.engine.encode() + b")\n" + await r.read()
            except aiohttp.ClientError:
                pass
        return Response(text, media_type="text/plain; version=0.0.4")

    async def generate(request: Request) -> Response:
        endpoint = request.url.path
        if not authorized(request):
            return unauthorized()
        if not state.ready or state.session is None:
            metrics.errors.labels("not_ready").inc()
            return error(503, "the model is warming up; retry when /health answers 200",
                         "model_not_ready", etype="service_unavailable")
        body, bad = check_body(await request.body(), state)
        if bad is not None:
            metrics.errors.labels("bad_request").inc()
            metrics.requests.labels(endpoint, str(bad.status_code)).inc()
            return bad
        assert body is not None
        start = time.perf_counter()
        metrics.in_flight.inc()
        try:
            upstream = await state.session.post(state.upstream + endpoint, json=body,
                                                headers=_auth(state))
        except aiohttp.ClientError as exc:
            metrics.in_flight.dec()
            metrics.errors.labels("engine_unreachable").inc()
            return error(502, f"the engine did not answer: {exc}", "engine_error", etype="server_error")
        status = str(upstream.status)
        if upstream.status >= 400 or not body.get("stream"):
            data = await upstream.read()
            upstream.release()
            metrics.in_flight.dec()
            metrics.requests.labels(endpoint, status).inc()
            if upstream.status >= 400:
                metrics.errors.labels(f"engine_{status}").inc()
            else:
                _count_usage(metrics, data, time.perf_counter() - start)
            return Response(data, status_code=upstream.status,
                            media_type=upstream.headers.get("content-type", "application/json"))

        async def relay():
            first, chunks = None, 0
            try:
                async for data in upstream.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                        metrics.ttft.observe(first - start)
                    chunks += data.count(b"data: ")
                    yield data
            finally:
                upstream.close()
                metrics.in_flight.dec()
                metrics.requests.labels(endpoint, status).inc()
                tokens = max(chunks - 2, 0)  # the role chunk and [DONE] carry no token
                metrics.tokens.inc(tokens)
                if first is not None and tokens > 1:
                    metrics.tps.set(tokens / max(time.perf_counter() - start, 1e-9))

        return StreamingResponse(relay(), status_code=upstream.status,
                                 media_type=upstream.headers.get("content-type", "text/event-stream"))

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/metrics", prometheus)]
    routes += [Route(p, generate, methods=["POST"]) for p in GENERATE]
    async def not_found(request: Request, exc: Exception) -> Response:
        return error(404, f"no route {request.method} {request.url.path}; this server answers "
                     "/v1/models, /v1/completions, /v1/chat/completions, /health, /metrics",
                     "not_found")

    async def bad_method(request: Request, exc: Exception) -> Response:
        return error(405, f"{request.method} is not allowed on {request.url.path}",
                     "method_not_allowed")

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: bad_method})
    app.state.front = state
    app.state.metrics = metrics
    return app


def _auth(state: FrontState) -> dict[str, str]:
    return {"Authorization": f"Bearer {state.api_key}"} if state.api_key else {}


def _count_usage(metrics: Metrics, data: bytes, seconds: float) -> None:
    try:
        tokens = int(json.loads(data).get("usage", {}).get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return
    metrics.tokens.inc(tokens)
    if tokens:
        metrics.tps.set(tokens / max(seconds, 1e-9))
