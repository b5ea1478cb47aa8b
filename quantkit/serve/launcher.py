"""What every engine's server shares: the `Launch` a launcher returns, the context a model was
trained for, `build_launch` (which asks the engine registry for the engine's launcher) and the
environment the process starts in; what an engine's server functions are called as
(`ServerLauncher`, `ServerProbe`). Each engine's launcher is its entry module's,
`quantkit/serve/engines/<name>.py`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from quantkit.errors import BadInput

if TYPE_CHECKING:
    from quantkit.config import ServeConfig
    from quantkit.engines.choice import Why
    from quantkit.serve.target import Target


@dataclass
class Launch:
    """One engine process to start, on a private port behind quantkit's front."""

    engine: str
    cmd: list[str]
    port: int
    model_id: str                  # the engine's own name for the model
    health_path: str               # answers 200 once the engine has loaded
    metrics_path: str | None       # the engine's own Prometheus endpoint, passed through
    ctx_size: int
    batching: bool                 # continuous batching of concurrent requests
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    draft_model: str | None = None  # speculative decoding's draft, named when the start fails


class ServerLauncher(Protocol):
    """An engine's server (`EngineSpec.launch`, which build_launch calls): what to serve, the
    serve options, the private port and the context size -> the process to start."""

    def __call__(self, target: Target, opts: ServeConfig, port: int, ctx: int, /) -> Launch: ...


class ServerProbe(Protocol):
    """An engine server's install probe (`EngineSpec.server_probe`, which choose_engine asks for
    `quantkit serve`, handing on its serve options; None: the defaults): why the server cannot
    run here."""

    def __call__(self, opts: ServeConfig | None, /) -> Why: ...


def model_context(target: Target) -> int:
    """The context length the model was trained for."""
    from quantkit.checkpoints import call, checkpoint, label

    try:
        return int(call(checkpoint(target.format), "context_length", target.path))
    except (ValueError, OSError, IndexError, KeyError, AttributeError) as exc:
        raise BadInput(f"{target.path} is not a readable {label(target.format)} model: "
                       f"{type(exc).__name__}: {str(exc)[:120]}",
                       "re-run `quantkit quantize`, or pass the right file") from None


def serve_context(target: Target, opts: ServeConfig) -> int:
    """The context per sequence to serve: --ctx-size, or the model's, at most 4096. A --ctx-size
    past what the model was trained for is BadInput before any start: vLLM refuses it after a
    minute of loading, and other engines serve positions the model never saw."""
    trained = model_context(target)
    check_context(opts.ctx_size, trained, str(target.path))
    return opts.ctx_size or min(trained, 4096)


def check_context(ctx_size: int | None, trained: int, model: str,
                  flag: str = "--ctx-size") -> None:
    """BadInput where `ctx_size` (`flag`'s value) is past the `trained` context of `model`."""
    if ctx_size is not None and ctx_size > trained:
        raise BadInput(f"{flag} {ctx_size} is longer than the {trained} tokens {model} was "
                       "trained for", f"set {flag} to {trained} or less")


def build_launch(engine: str, target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    """The server command of `engine` (the engine registry names its launcher) for `target`,
    serving `ctx` tokens a sequence (serve_context)."""
    from quantkit.engines.choice import ENGINES
    from quantkit.registry import load

    opts.check_engine(engine)  # the engine chosen for --engine auto too
    launch: ServerLauncher = load(ENGINES[engine].launch)
    return launch(target, opts, port, ctx)


def engine_env(launch: Launch) -> dict[str, str]:
    env = dict(os.environ)
    env.update(launch.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
