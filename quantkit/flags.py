"""The bridge between the stage configs and the command line: every config field becomes a flag
(its name, type, help and one default, read from the dataclass), and the flags given become the
config over a recipe's section. Typer, no torch."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args, get_origin, get_type_hints

import typer

from quantkit.config import Recipe, build, recipe_section

C = TypeVar("C")


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def flag(cls: type, name: str) -> Any:
    """A Typer option for config field `name`: its flag, its help text and its one default."""
    f = _fields(cls)[name]
    make: Any = f.default_factory
    default = f.default if f.default is not dataclasses.MISSING else make()
    shown = "" if default in (None, (), {}) else f" [default: {show(default)}]"
    flag = f.metadata.get("flag") or "--" + name.replace("_", "-")
    if cli_type(cls, name) is bool and "/" not in flag:
        flag += "/--no-" + flag[2:]
    return typer.Option(flag, help=f.metadata["help"] + shown, show_default=False)


def cli_type(cls: type, name: str) -> Any:
    """The type a field's flag takes: its own where it is a plain one, else a string or a list."""
    f = _fields(cls)[name]
    if f.metadata.get("cli") == "thresholds":
        return Path
    tp = _hints(cls)[name]
    if get_origin(tp) is tuple and f.metadata.get("cli") != "csv":
        return list[str]
    plain = [a for a in (get_args(tp) or (tp,)) if a is not type(None)]
    return plain[0] if len(plain) == 1 and plain[0] in (bool, int, float, str) else str


def config_flags(cls: type, *only: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command a flag (default None: not given) for each of `cls`'s fields (or those named
    in `only`) that it does not declare itself; they reach the command in its `**flags`."""

    def add(fn: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        extra = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=Annotated[cli_type(cls, f.name) | None,
                                                        flag(cls, f.name)])
                 for f in dataclasses.fields(cls)
                 if f.name not in names and (not only or f.name in only)]
        fn.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        return fn

    return add


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def config_from(cls: type[C], recipe: Path | None, section: str, flags: dict[str, Any]
            ) -> tuple[C, Recipe | None]:
    """The recipe's section (or the defaults) with the flags given explicitly on top (a
    comma-separated flag split, a thresholds file read)."""
    given = dict(flags)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value, how = given.get(f.name), f.metadata.get("cli")
        if value is not None and how == "csv":
            given[f.name] = tuple(v.strip() for v in value.split(",") if v.strip())
        elif value is not None and how == "thresholds":
            from quantkit.gate import read_thresholds

            given[f.name] = read_thresholds(value)
    base, r = recipe_section(recipe, section)
    return build(cls, base, given), r
