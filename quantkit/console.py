"""Results go to stdout, progress and logs to stderr."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

T = TypeVar("T")

err = Console(stderr=True, highlight=False)
_quiet = False


# Progress bars and info logs of the libraries under us: off on the terminal (quantkit draws one
# progress display per stage), kept in the log file. Environment variables, because tqdm and the
# Hugging Face libraries read them when first imported, which is after this runs.
QUIET_ENV = {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
             "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false",
             "DATASETS_VERBOSITY": "error"}
THIRD_PARTY_LOGGERS = ("lm-eval", "lm_eval", "datasets", "transformers", "huggingface_hub",
                       "accelerate", "compressed_tensors", "urllib3", "httpx", "filelock",
                       "llama_cpp", "evaluate", "absl")


DETAIL_LOGGER = "quantkit.detail"  # our per-item lines: the log file only (`detail`)

_log_handler: logging.Handler | None = None


def silence_third_party(log_file: Path | None) -> None:
    """Third-party progress bars off; their log records (INFO and up) and Python warnings go to
    `log_file` instead of the terminal. quantkit's own lines are unchanged."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    handler: logging.Handler = logging.NullHandler()
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(log_file, mode="w", encoding="utf-8", delay=True)
        except OSError:
            pass
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    global _log_handler
    if _log_handler is not None:  # a second command in one process (tests): close the first log
        _log_handler.close()
    _log_handler = handler
    for name in (*THIRD_PARTY_LOGGERS, "py.warnings", DETAIL_LOGGER):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.propagate = False
        lg.setLevel(logging.INFO)
    # llama-cpp-python prints llama.cpp's C log through its own callback while this logger's
    # level lets it (NOTSET until a `Llama(verbose=...)` sets it): the quantizer's and the
    # model loader's hundreds of lines, errors aside, stay off the terminal
    # (its map of llama.cpp's log levels is one off: WARN counts as ERROR there)
    logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)
    logging.captureWarnings(True)
    warnings.simplefilter("default")
    # what a library leaves unclosed is reported at exit, after the log file is closed
    warnings.filterwarnings("ignore", category=ResourceWarning)
    _quiet_tqdm()


_TQDM_DISABLE_AT = 10  # `disable`'s place among tqdm.__init__'s positional arguments


def _quiet_tqdm() -> None:
    """tqdm's bars off even where a library passes `disable=False` itself, which TQDM_DISABLE
    does not override: compressed-tensors' "Applying quantization config" and "Dispatching
    model" bars do, each time a compressed-tensors model loads."""
    try:
        import tqdm
    except ImportError:
        return
    init = tqdm.tqdm.__init__
    if getattr(init, "quantkit_quiet", False):
        return

    @functools.wraps(init)
    def quiet(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > _TQDM_DISABLE_AT:
            args = (*args[:_TQDM_DISABLE_AT], True, *args[_TQDM_DISABLE_AT + 1:])
        else:
            kwargs["disable"] = True
        init(self, *args, **kwargs)

    quiet.quantkit_quiet = True  # type: ignore[attr-defined]
    tqdm.tqdm.__init__ = quiet


def set_quiet(quiet: bool) -> None:
    """Silence logs and progress (results still print)."""
    global _quiet
    _quiet = quiet


def log(message: str) -> None:
    """A progress or info line on stderr."""
    if not _quiet:
        err.print(message, soft_wrap=True)


def detail(message: str) -> None:
    """A per-item line (one per layer, say) for the command's log file, not the terminal, where
    a progress bar and one summary line stand for them."""
    logging.getLogger(DETAIL_LOGGER).info(message)


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
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)
