"""Results go to stdout, progress and logs to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from rich.console import Console

T = TypeVar("T")

err = Console(stderr=True, highlight=False)
_quiet = False


def set_quiet(quiet: bool) -> None:
    """Silence logs and progress (results still print)."""
    global _quiet
    _quiet = quiet


def log(message: str) -> None:
    """A progress or info line on stderr."""
    if not _quiet:
        err.print(message, soft_wrap=True)


def warn(message: str) -> None:
    """A warning on stderr; never silenced by --quiet."""
    err.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)


def result_json(data: Any) -> None:
    """Machine-readable result on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def result_text(text: str) -> None:
    """Human-readable result on stdout, unwrapped."""
    sys.stdout.write(text.rstrip("\n") + "\n")


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a rich progress bar (with ETA) on stderr."""
    if _quiet or not err.is_terminal:
        yield from items
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)
