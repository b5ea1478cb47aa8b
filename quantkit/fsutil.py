"""Files: atomic output folders, hashes, JSON writing that is byte-stable, and the versioned
JSON documents quantkit writes beside its outputs (quantkit.json, results.json)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from quantkit.errors import BadInput


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def dumps(data: Any) -> str:
    """Deterministic JSON text (sorted keys, trailing newline)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    """`dumps(data)` into `path`."""
    path.write_text(dumps(data), encoding="utf-8")


def read_text(path: Path, what: str, hint: str) -> str:
    """A UTF-8 text file, or BadInput naming it (missing, a folder, unreadable, not UTF-8)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{what} {path} does not exist" if not path.exists()
                       else f"{what} {path} is not a file", hint)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what} {path} is not UTF-8 text (byte {exc.start})",
                       "save it as UTF-8") from exc
    except OSError as exc:
        raise BadInput(f"{what} {path} cannot be read: {exc.strerror}", hint) from exc


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename; the file gets the user's umask (not 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def apply_umask(folder: Path) -> None:
    """Give a finished output folder and everything in it the user's umask: mkdtemp makes 0700
    folders, and some writers (safetensors, tempfile) make 0600 files. A program stays a program
    (a file with any execute bit gets 0777 under the umask, as a built llama-server must)."""
    mask = umask()
    for path in (folder, *Path(folder).rglob("*")):
        if not path.is_symlink():
            runs = path.is_dir() or bool(path.stat().st_mode & 0o111)
            path.chmod((0o777 if runs else 0o666) & ~mask)


def umask() -> int:
    """The process umask (read without changing it for longer than a call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_dir(out: Path, force: bool) -> None:
    """Refuse an output path that exists (unless --force) or cannot be written, before any work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"output path {out} exists and is not a folder",
                       "choose another --out, or remove the file in the way")
    if out.exists() and not force:
        raise BadInput(f"output folder {out} already exists",
                       "choose another --out, or pass --force to replace it")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"cannot create {out}: {parent} is a file, not a folder",
                       "choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write {out}: {parent} is not writable", "choose another --out")
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE_BYTES:
        raise BadInput(f"cannot write {out}: only {free / 2**20:.0f} MiB free on its disk",
                       "free some space or choose --out on another disk")


MIN_FREE_BYTES = 64 << 20


def work_dir(out: Path, purpose: str) -> Path:
    """The one rule for where an output is built: a hidden sibling `.OUT.PURPOSE` (`partial`: a
    quantization that --resume continues; `auto`: auto's candidates; a fresh `tmp-*` for each
    atomic write), so a half-made output is never mistaken for a made one."""
    return out.parent / f".{out.name}.{purpose}"


@contextmanager
def cache_fill(entry: Path) -> Iterator[None]:
    """Held while this process checks, and where it is missing fills, the cache entry `entry` (a
    file or folder under $QUANTKIT_HOME): two quantkit processes sharing the cache (two CI jobs,
    the test suite's workers) take turns, and the second finds the entry the first filled
    instead of filling it again over the first one's readers. The caller checks inside."""
    from filelock import FileLock

    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(entry.parent / f".{entry.name}.lock"):
        yield


@contextmanager
def atomic_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to `out` only when the block succeeds."""
    check_output_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".quantkit-tmp-{out.name}-", dir=out.parent))
    try:
        yield tmp
        apply_umask(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_json_file(file: Path, missing: str, missing_hint: str, hint: str) -> Any:
    """A quantkit output file (quantkit.json, results.json) parsed, or BadInput: `missing` (with
    `missing_hint`) when it is absent, "not valid JSON" (with `hint`) when it is not UTF-8 JSON.
    `check_versioned` then checks what it holds."""
    if not file.is_file():
        raise BadInput(missing, missing_hint)
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{file} is not valid JSON", hint) from exc


def check_versioned(data: Any, where: str, *, kind: str, version: int, fields: set[str],
                    hint: str) -> dict[str, Any]:
    """`data` as a dict of schema `version` with no field outside `fields`, or BadInput naming
    `where` and what is wrong."""
    if not isinstance(data, dict):
        raise BadInput(f"{where} is not a JSON object", hint)
    found = data.get("schema_version")
    if found != version:
        raise BadInput(f"{where} has {kind} schema_version {found!r}; this quantkit reads "
                       f"{version}", hint + " with this quantkit version")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise BadInput(f"{where}: unknown {kind} field {unknown[0]!r}",
                       hint + " with this quantkit version")
    return data


_Doc = TypeVar("_Doc", bound="VersionedFile")


def finite(data: Any) -> Any:
    """`data` with every NaN and infinity made null: strict JSON (RFC 8259), which JavaScript's
    JSON.parse (GitHub Actions' fromJSON), Go and serde read; Python writes NaN unless told."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


class VersionedFile:
    """Base of a dataclass kept as one JSON file in a folder (`FILE`), with a schema version:
    `write`, and `read`/`from_dict` that refuse other versions and unknown fields with a
    BadInput naming the file. A subclass says how a checked dict becomes itself (`_build`)."""

    FILE: ClassVar[str]
    KIND: ClassVar[str]                 # the word in messages: manifest, results
    VERSION: ClassVar[int]
    HINT: ClassVar[str]                 # how to make a current one

    def to_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def write(self, folder: Path) -> None:
        """`folder/FILE`, strict JSON (`finite`): CI jobs read it with parsers that refuse NaN."""
        write_json(Path(folder) / self.FILE, finite(self.to_dict()))

    @classmethod
    def missing(cls, folder: Path) -> tuple[str, str]:
        """The message and hint when `folder` has no `FILE`."""
        raise NotImplementedError

    @classmethod
    def _build(cls: type[_Doc], data: dict[str, Any], where: str) -> _Doc:
        raise NotImplementedError

    @classmethod
    def from_dict(cls: type[_Doc], data: Any, where: str) -> _Doc:
        """Check the schema version and the fields; BadInput naming `where` otherwise."""
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        data = check_versioned(data, where, kind=cls.KIND, version=cls.VERSION, fields=fields,
                               hint=cls.HINT)
        return cls._build(data, where)

    @classmethod
    def read(cls: type[_Doc], folder: Path) -> _Doc:
        """`folder/FILE`, or a BadInput saying why it cannot be used."""
        file = Path(folder) / cls.FILE
        missing, missing_hint = cls.missing(folder)
        return cls.from_dict(read_json_file(file, missing, missing_hint, cls.HINT), str(file))
