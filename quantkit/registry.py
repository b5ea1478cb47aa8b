"""An explicit, lazy registry: the plug point of a kind of thing (validation tasks, quantization
methods, engines). Entries are registered by one line each; what they run is named as
"module:attribute" and imported only when used, so listing the entries imports no torch. Pure.

Entries can come from outside the package too: an installed distribution declares an entry point in
the registry's group (`quantkit.methods`, `quantkit.tasks`, `quantkit.engines`) whose value is the
same "module:attribute" string, naming a Method, Task or EngineSpec. They are read the first time
the registry is asked anything, after the built-in registrations; a built-in name is never
replaced, and a plugin that fails to load is named in one warning and left out."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from quantkit.errors import BadInput

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> entries, in registration order; an unknown name is BadInput with a guess."""

    def __init__(self, kind: str, flag: str, group: str | None = None) -> None:
        self.kind, self.flag, self.group = kind, flag, group
        self._entries: dict[str, T] = {}
        self._plugins: dict[str, str] | None = None  # name -> its distribution, once read

    @property
    def entries(self) -> dict[str, T]:
        """Every entry, the installed plugins' read on first use."""
        if self._plugins is None:
            # set before reading: a plugin's module may ask this registry while it is imported
            self._plugins = {}
            if self.group:
                self._read_plugins(self.group, self._plugins)
        return self._entries

    def _read_plugins(self, group: str, added: dict[str, str]) -> None:
        from importlib.metadata import entry_points

        from quantkit import console

        builtin = set(self._entries)
        for ep in entry_points(group=group):
            where = f"{ep.name} = {ep.value!r} ({group}, from {ep.dist.name if ep.dist else '?'})"
            try:
                entry = load(ep.value)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break quantkit
                console.err.print(f"warning: plugin {where} could not be loaded: "
                                  f"{type(exc).__name__}: {exc}", markup=False, soft_wrap=True)
                continue
            name = str(getattr(entry, "name", ep.name))
            if name in builtin:
                console.err.print(f"warning: plugin {where} is left out: {self.kind} {name!r} is "
                                  "built in", markup=False, soft_wrap=True)
                continue
            self._entries[name] = entry
            added[name] = ep.dist.name if ep.dist else ep.value

    def plugin(self, name: str) -> str | None:
        """The distribution that added `name`, or None for a built-in entry."""
        return (self._plugins or {}).get(name) if name in self.entries else None

    def register(self, name: str, entry: T) -> T:
        """Add `entry` under `name` (a later registration of the same name replaces it)."""
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove `name` (tests that register a toy entry clean up with this)."""
        self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def get(self, name: str) -> T | None:
        return self.entries.get(name)

    def __getitem__(self, name: str) -> T:
        if name not in self.entries:
            raise self.unknown(name)
        return self.entries[name]

    def unknown(self, name: str, extra: tuple[str, ...] = ()) -> BadInput:
        """The error for a name that is not registered: the closest known name and the list."""
        known = [*self.entries, *extra]
        close = difflib.get_close_matches(name, known, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        return BadInput(f"unknown {self.kind} {name!r}{guess}",
                        f"use {self.flag} " + ", ".join(known))


def load(ref: Any) -> Any:
    """The object a "module:attribute" reference names, imported now (an object is itself)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
