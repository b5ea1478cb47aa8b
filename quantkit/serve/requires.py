"""What an engine started from this Python needs importable, checked before it starts: a missing
package is one error naming it and the pip command (exit 2), not a line in the engine's log.
Each launcher (`quantkit.serve.engines.<name>`) names the modules its server imports; the
engine's server probe asks `why_missing` before it is chosen. (vLLM runs in its own environment
and is asked there; llama-server is a program.)"""

from __future__ import annotations

import re
from importlib import metadata
from importlib.util import find_spec

from quantkit.errors import BadInput

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


def why_missing(program: str, modules: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
    """(message, hint) naming the first package `program` needs that is not installed, and how
    to install it; None when all are there."""
    gap = missing(modules)
    if gap is None:
        return None
    module, dist = gap
    return (f"{program} cannot start: it needs the Python package {dist} (module {module!r} is "
            "not installed)", f"pip install '{pip_requirement(dist)}'")


def require(program: str, modules: tuple[tuple[str, str], ...]) -> None:
    """BadInput (`why_missing`) when a package `program` needs is not installed."""
    why = why_missing(program, modules)
    if why is not None:
        raise BadInput(*why)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
