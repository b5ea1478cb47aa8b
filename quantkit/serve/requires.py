"""What an engine started from this Python needs importable, checked before it starts: a missing
package is one error naming it and the pip command (exit 2), not a line in the engine's log.
(vLLM runs in its own environment and is asked there; llama-server is a program.)"""

from __future__ import annotations

import re
from importlib import metadata
from importlib.util import find_spec

from quantkit.errors import BadInput

# (module the engine imports, the distribution that provides it), per engine:
# - `transformers serve`: transformers.utils.import_utils.is_serve_available (its `serving` extra)
# - llama_cpp.server: llama-cpp-python's `server` extra (llama_cpp/server/app.py, settings.py)
ENGINE_MODULES: dict[str, tuple[tuple[str, str], ...]] = {
    "transformers": (("transformers", "transformers"), ("pydantic", "pydantic"),
                     ("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("openai", "openai")),
    "llama_cpp.server": (("llama_cpp", "llama-cpp-python"), ("fastapi", "fastapi"),
                         ("uvicorn", "uvicorn"), ("pydantic_settings", "pydantic-settings"),
                         ("sse_starlette", "sse-starlette"),
                         ("starlette_context", "starlette-context")),
}
# what installs a distribution the way quantkit declares it (an extra), where it is not quantkit's
# own dependency
EXTRA_OF = {"llama-cpp-python": "llama-cpp-python[server]", "pydantic-settings":
            "llama-cpp-python[server]", "sse-starlette": "llama-cpp-python[server]",
            "starlette-context": "llama-cpp-python[server]"}


def missing(modules: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
    """The first (module, distribution) whose module cannot be imported, or None."""
    for module, dist in modules:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):  # a broken parent package, or a module without a spec
            found = False
        if not found:
            return module, dist
    return None


def pip_requirement(dist: str) -> str:
    """`dist` with the version range quantkit declares for it (the installed quantkit's metadata),
    else its extra or its bare name."""
    if dist in EXTRA_OF:
        return EXTRA_OF[dist]
    try:
        declared = metadata.requires("quantkit") or []
    except metadata.PackageNotFoundError:
        declared = []
    for req in declared:
        name = re.match(r"[A-Za-z0-9._-]+", req)
        if name and "extra ==" not in req and _norm(name.group(0)) == _norm(dist):
            return req.split(";")[0].strip().replace(" ", "")
    return dist


def require(engine: str, modules: tuple[tuple[str, str], ...] | None = None) -> None:
    """BadInput naming the first package `engine` needs that is not installed, and how to
    install it; nothing when all are there."""
    gap = missing(ENGINE_MODULES.get(engine, ()) if modules is None else modules)
    if gap is None:
        return
    module, dist = gap
    raise BadInput(f"{engine} cannot start: it needs the Python package {dist} "
                   f"(module {module!r} is not installed)", f"pip install '{pip_requirement(dist)}'")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
