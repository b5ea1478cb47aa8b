"""An explicit, lazy registry: the plug point of a kind of thing (validation tasks, quantization
methods, engines). Entries are registered by one line each; what they run is named as
"module:attribute" and imported only when used, so listing the entries imports no torch. Pure."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from quantkit.errors import BadInput

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> entries, in registration order; an unknown name is BadInput with a guess."""

    def __init__(self, kind: str, flag: str) -> None:
        self.kind, self.flag = kind, flag
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add `entry` under `name` (a later registration of the same name replaces it)."""
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove `name` (tests that register a toy entry clean up with this)."""
        self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries[name]

    def unknown(self, name: str, extra: tuple[str, ...] = ()) -> BadInput:
        """The error for a name that is not registered: the closest known name and the list."""
        known = [*self._entries, *extra]
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
