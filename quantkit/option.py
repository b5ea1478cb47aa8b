"""`opt`: one option of a config dataclass, or of a registered entry's own options dataclass (a
method's, a task's), with its one default, its help and its flag. A leaf, importing nothing of
quantkit: an entry module declares its options without importing the config package (whose
QuantizeConfig is built from the registered entries). Pure."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any, help: str, flag: str = "", cli: str = "") -> Any:
    """A config field: its one default, the help text its CLI flag shows, the flag where it is
    not --FIELD-NAME (e.g. "--sym/--asym"), and how the CLI reads it where that is not its type:
    "csv" (a comma-separated list) or "thresholds" (a YAML file of limits)."""
    meta = {"help": help, "flag": flag, "cli": cli}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
