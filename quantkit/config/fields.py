"""How a config dataclass is made and filled: `opt` declares a field with its one default and
help (handed on from the leaf quantkit.option, which the method and task entries import);
`section` fills one from a recipe mapping (strict keys, types), `build` from CLI flags over a
base; `coerce` checks a value against a field's type; `check_range` and `at_least_one` check an
option's value (the entries' own options ask them when checked). Pure."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from quantkit.errors import BadInput
from quantkit.option import opt as opt  # declared in a leaf: entry modules use it too

C = TypeVar("C")
SEED_MAX = 2**32 - 1


def check_range(name: str, value: float | None, lo: float, hi: float, hint: str = "") -> None:
    if value is not None and not lo <= value <= hi:
        raise BadInput(f"--{name.replace('_', '-')} {value} is out of range",
                       hint or f"use a value from {lo} to {hi}")


def at_least_one(name: str, value: int | None) -> None:
    """A count that is left out (None: everything) or 1 or more (--limit, --humaneval-limit)."""
    if value is not None and value < 1:
        raise BadInput(f"--{name.replace('_', '-')} {value} must be 1 or more",
                       "leave it out to run everything")


# numpy's and datasketch's seeds are 0 to 2**32 - 1 (a negative one is a ValueError deep in a
# stage), and llama.cpp reads seed -1 as "random": every seed is checked against this range
def check_seed(value: int) -> None:
    check_range("seed", value, 0, SEED_MAX, f"use a seed from 0 to {SEED_MAX}, e.g. --seed 0")


def parse_levels(value: str | tuple[int, ...] | list[int], option: str, example: str) -> tuple[int, ...]:
    """Concurrency levels from `1,2,4` or a sequence: positive integers, ascending, no repeats
    (`quantkit bench --concurrency`, `quantkit auto --load`)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        levels = [int(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise BadInput(f"{option} {value!r} is not a list of positive integers", f"e.g. {example}")
    return tuple(sorted(set(levels)))


def yaml_load(path: Path, text: str, what: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{what} {path} is not valid YAML: {str(exc).splitlines()[0]}",
                       "fix the YAML syntax") from exc


def section(cls: type[C], value: Any, where: str) -> C:
    """A config from a mapping: unknown keys and wrong types are BadInput naming the key."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadInput(f"{where} must be a mapping", "see recipes/demo.yaml")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    clean = {}
    for key, v in value.items():
        if key not in hints:
            raise BadInput(f"{where}: unknown key {key!r}", f"known: {', '.join(names)}")
        clean[key] = coerce(v, hints[key], f"{where}.{key}")
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in clean and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise BadInput(f"{where}: missing {missing[0]!r}", "see recipes/demo.yaml")
    return cls(**clean)


def build(cls: type[C], base: C | None, given: dict[str, Any]) -> C:
    """`base` (a recipe section, or the defaults) with the options given explicitly on top."""
    hints = get_type_hints(cls)
    changes = {k: coerce(v, hints[k], "--" + k.replace("_", "-"))
               for k, v in given.items() if k in hints and v is not None}
    cfg = dataclasses.replace(base if base is not None else cls(), **changes)  # type: ignore[type-var]
    cfg.check()  # type: ignore[attr-defined]
    return cfg


def coerce(value: Any, tp: Any, where: str) -> Any:
    """`value` as type `tp` (ints are floats, lists are tuples), or BadInput naming `where`."""
    ok, out = _coerce(value, tp)
    if not ok:
        raise BadInput(f"{where} = {value!r} is not {_type_name(tp)}", "see recipes/demo.yaml")
    return out


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            ok, out = _coerce(value, arg)
            if ok:
                return True, out
        return False, None
    if tp is type(None):
        return value is None, None
    if tp is Any:
        return True, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else None
    if tp is str:
        return isinstance(value, str), value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False, None
        items = [_coerce(v, get_args(tp)[0]) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if origin is dict:
        key_tp, val_tp = get_args(tp)
        if not isinstance(value, dict):
            return False, None
        pairs = [(_coerce(k, key_tp), _coerce(v, val_tp)) for k, v in value.items()]
        return (all(a[0] and b[0] for a, b in pairs), {a[1]: b[1] for a, b in pairs})
    return False, None


def _type_name(tp: Any) -> str:
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "empty"
    if get_origin(tp) is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if get_origin(tp) is dict:
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp))


def as_dict(obj: Any) -> Any:
    """A config as plain JSON-able data (for step keys and manifests)."""
    return dataclasses.asdict(obj)
