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


def build_launch(engine: str, target: Target, opts: ServeConfig, port: int) -> Launch:
    """The server command of `engine` (the engine registry names its launcher) for `target`."""
    from quantkit.engines.choice import ENGINES
    from quantkit.registry import load

    opts.check_engine(engine)  # the engine chosen for --engine auto too
    ctx = opts.ctx_size or min(model_context(target), 4096)
    launch: ServerLauncher = load(ENGINES[engine].launch)
    return launch(target, opts, port, ctx)


def engine_env(launch: Launch) -> dict[str, str]:
    env = dict(os.environ)
    env.update(launch.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
