"""Registered entries' own options, as fields of their stage's config: a validation task's join
`ValidateConfig` (`Task.options`), a quantization method's join `QuantizeConfig`
(`Method.options`). Each entry names a frozen dataclass ("module:attribute" or the class) whose
fields are made with `fields.opt`; `with_options` adds them after the config's own fields, so
each stays one flag and one recipe key, and `read` gives them back as that dataclass. Entries of
one family may name the same dataclass: its fields join once. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, get_type_hints

from quantkit.registry import Registry, load

C = TypeVar("C")


def options_class(entry: Any) -> type[Any] | None:
    """A registry entry's options dataclass (imported now), or None where it has none."""
    ref = getattr(entry, "options", None)
    return None if ref is None else load(ref)


def read(cls: type[C], cfg: Any) -> C:
    """Options dataclass `cls` read from config `cfg` (a field the config lacks keeps its default:
    its entry was registered in-process after the config was built)."""
    return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                  if hasattr(cfg, f.name)})


def each(registry: Registry[Any]) -> Iterator[type[Any]]:
    """Every registered entry's options dataclass, each once (a family shares one)."""
    seen: set[type[Any]] = set()
    for name in registry.names():
        opts = options_class(registry[name])
        if opts is not None and opts not in seen:
            seen.add(opts)
            yield opts


def with_options(registry: Registry[Any], section: str) -> Callable[[type[C]], type[C]]:
    """A class decorator: the config with each registered entry's own options after its fields.
    A built-in entry whose options clash or lack a default is a TypeError; a plugin's are left
    out with a warning (a broken plugin must not break quantkit)."""

    def join(cls: type[C]) -> type[C]:
        from quantkit import console

        def refuse(name: str, why: str) -> None:
            if registry.plugin(name) is None:
                raise TypeError(f"{registry.kind} {name}: {why}")
            console.err.print(f"warning: {registry.kind} {name}: {why}", markup=False,
                              soft_wrap=True)

        added: list[tuple[str, Any, Any]] = []
        # field -> who has it: the config's own (its section) or an entry's (its options class)
        taken: dict[str, tuple[str, type | None]] = {
            f.name: (section, None) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for name in registry.names():
            try:
                opts = options_class(registry[name])
                if opts is None:
                    continue
                hints = get_type_hints(opts)
                fields = dataclasses.fields(opts)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break quantkit
                if registry.plugin(name) is None:
                    raise
                console.err.print(f"warning: {registry.kind} {name}'s options could not be read: "
                                  f"{type(exc).__name__}: {exc}", markup=False, soft_wrap=True)
                continue
            for f in fields:
                owner, owner_opts = taken.get(f.name, ("", None))
                if owner_opts is opts:  # the family's dataclass, joined by its first member
                    continue
                missing = (f.default is dataclasses.MISSING
                           and f.default_factory is dataclasses.MISSING)
                if not owner and not missing:
                    taken[f.name] = (name, opts)
                    added.append((f.name, hints[f.name], dataclasses.field(
                        default=f.default, default_factory=f.default_factory, metadata=f.metadata)))
                    continue
                refuse(name, f"option {f.name} is left out: " + (
                    f"{owner} has an option of that name" if owner else "it has no default"))
        made = dataclasses.make_dataclass(cls.__name__, added, bases=(cls,), frozen=True)
        made.__module__, made.__qualname__ = cls.__module__, cls.__qualname__
        made.__doc__ = cls.__doc__
        return made

    return join
