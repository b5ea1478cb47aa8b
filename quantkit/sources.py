"""Calibration sources: parse `--source SPEC[@WEIGHT]` and read documents from files, folders,
`hf:` datasets and the built-in offline corpora."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import BadInput
from quantkit.fsutil import sha256_file

CODE_EXTS = {".py", ".js", ".ts", ".go", ".rs", ".c", ".h", ".cc", ".cpp", ".hpp", ".java",
             ".kt", ".rb", ".php", ".sh", ".swift", ".scala", ".cs", ".lua", ".sql", ".r"}
TEXT_EXTS = {".txt", ".md", ".rst"}
RECORD_EXTS = {".jsonl", ".json", ".parquet", ".csv"}
REASONING_FIELDS = ("reasoning_content", "thinking")  # an assistant turn's reasoning, as datasets name it
_THINK_BLOCK = re.compile(r"\s*<think>(.*?)</think>\s*(.*)\Z", re.S)
BUILTINS = {
    "builtin:stdlib-code": "the Python standard library's own source files (code domain)",
    "builtin:stdlib-docs": "the Python standard library's docstrings (prose domain)",
}


@dataclass(frozen=True)
class SourceSpec:
    """One `--source` argument: where documents come from and their share of the mix."""

    spec: str
    location: str
    weight: float | None


@dataclass(frozen=True)
class Document:
    """A unit of input: plain text, or a chat as role/content messages; `reasoning`, where a
    chat's assistant turns carry it, is each message's reasoning (None for the others)."""

    text: str
    messages: tuple[tuple[str, str], ...] | None
    domain: str  # "chat" | "code" | "prose"
    reasoning: tuple[str | None, ...] | None = None


def parse_source(spec: str) -> SourceSpec:
    """Split `LOCATION@WEIGHT`, check the weight and that the location exists."""
    location, weight = spec, None
    if "@" in spec and not Path(spec).exists():
        location, raw = spec.rsplit("@", 1)
        try:
            weight = float(raw)
        except ValueError:
            raise BadInput(f"weight {raw!r} of source {location} does not parse as a number",
                           "write it as SOURCE@0.5") from None
        if not weight > 0 or weight != weight or weight == float("inf"):
            raise BadInput(f"weight {raw} of source {location} must be a positive number",
                           "write it as SOURCE@0.5, or drop the source")
    if location.startswith("builtin:"):
        if location not in BUILTINS:
            raise BadInput(f"unknown built-in source {location}",
                           "built-ins: " + ", ".join(sorted(BUILTINS)))
    elif not location.startswith("hf:"):
        path = Path(location)
        if not path.exists():
            raise BadInput(f"source {location} does not exist", "check the path")
        if path.is_file() and path.suffix.lower() not in {".parquet"}:
            try:
                with open(path, "rb") as fh:
                    head = fh.read(1 << 16)
            except OSError as exc:
                raise BadInput(f"cannot read source {location}: {exc.strerror}",
                               "check its permissions") from exc
            if _as_text(head, partial=True) is None:
                raise BadInput(f"source {location} is not text (binary or not UTF-8)",
                               "pass text (.txt/.md or any UTF-8 file), .jsonl/.json, "
                               ".parquet/.csv, source code, or a folder of them")
    return SourceSpec(spec, location, weight)


def read_documents(src: SourceSpec) -> list[Document]:
    """All documents of a source, in a stable order."""
    loc = src.location
    if loc == "builtin:stdlib-code":
        return [Document(p.read_text(encoding="utf-8", errors="replace"), None, "code")
                for p in _stdlib_files()]
    if loc == "builtin:stdlib-docs":
        return [Document(d, None, "prose") for p in _stdlib_files() for d in _docstrings(p)]
    if loc.startswith("hf:"):
        rows = (_record_to_doc(r, loc, i + 1) for i, r in enumerate(_hf_rows(loc)))
        return [d for d in rows if d.text.strip()]
    path = Path(loc)
    docs = [d for d in _read_path(path) if d.text.strip()]
    if not docs:
        raise BadInput(f"source {loc} holds no documents (empty, or no readable files)",
                       "check the file's content, or drop the source")
    return docs


def source_sha256(src: SourceSpec) -> str:
    """Identity of a source's content: a file's sha256, or a hash over a folder's files."""
    loc = src.location
    if loc.startswith("hf:"):
        return "hf:" + loc  # the datasets cache fingerprints content; record the name
    files = _stdlib_files() if loc.startswith("builtin:") else (
        [Path(loc)] if Path(loc).is_file() else _walk(Path(loc)))
    if len(files) == 1 and not loc.startswith("builtin:"):
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f.as_posix().encode() if not loc.startswith("builtin:") else f.name.encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def _walk(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(folder).parts))


def _as_text(raw: bytes, partial: bool = False) -> str | None:
    """`raw` as text when it is text: UTF-8 without NUL bytes (`partial`: may end mid-character)."""
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if partial and exc.start >= len(raw) - 3 and exc.reason == "unexpected end of data":
            return raw[:exc.start].decode("utf-8", errors="strict")
        return None


def _read_path(path: Path) -> Iterator[Document]:
    if path.is_dir():  # every file whose content is text, whatever its name; binaries skipped
        for f in _walk(path):
            ext = f.suffix.lower()
            if ext in RECORD_EXTS:
                yield from _read_file(f)
                continue
            try:
                text = _as_text(f.read_bytes())
            except OSError:
                continue
            if text is not None and text.strip():
                yield from _text_docs(text, "code" if ext in CODE_EXTS else "prose")
        return
    yield from _read_file(path)


def _text_docs(text: str, kind: str) -> Iterator[Document]:
    """A code file is one document; prose splits into paragraphs at blank lines."""
    if kind == "code":
        yield Document(text, None, "code")
        return
    for para in re.split(r"\n\s*\n", text):
        if para.strip():
            yield Document(para.strip(), None, "prose")


def _read_file(path: Path) -> Iterator[Document]:
    ext = path.suffix.lower()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}", "check permissions") from exc
    if not raw.strip():
        raise BadInput(f"source file {path} is empty", "fill it or drop the source")
    if ext in {".parquet", ".csv"}:
        yield from _read_table(path)
        return
    text = _as_text(raw)
    if text is None:
        raise BadInput(f"source {path} is not text (binary or not UTF-8)",
                       "convert it to UTF-8 text, or drop the source")
    if ext == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                yield _record_to_doc(_parse_json(line, path, n), str(path), n)
    elif ext == ".json":
        data = _parse_json(text, path, None)
        rows = data if isinstance(data, list) else [data]
        for n, row in enumerate(rows, 1):
            yield _record_to_doc(row, str(path), n)
    else:
        yield from _text_docs(text, "code" if ext in CODE_EXTS else "prose")


def _parse_json(text: str, path: Path, line: int | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{path}:{line}" if line else str(path)
        raise BadInput(f"{where}: corrupt JSON ({exc.msg})",
                       "fix or remove that line") from None


def _record_to_doc(row: Any, where: str, n: int) -> Document:
    """Map a record to a document: `messages` (chat), `prompt`+`completion` (chat), or `text`.
    An assistant turn's reasoning is its `reasoning_content` or `thinking` field (a record's own,
    for prompt+completion) or a leading <think> block of its content."""
    if not isinstance(row, dict):
        raise BadInput(f"{where}:{n}: expected a JSON object, got {type(row).__name__}",
                       "each record must be an object with text, messages or prompt+completion")
    if isinstance(row.get("messages"), list) and row["messages"]:
        msgs = []
        for m in row["messages"]:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise BadInput(f"{where}:{n}: a message lacks a string role or content",
                               'messages look like [{"role": "user", "content": "..."}]')
            msgs.append(_turn(m["role"], m["content"], m, f"{where}:{n}"))
        return _chat(msgs)
    reply = row.get("completion", row.get("answer"))  # `answer`: a domain test set's QA line
    if isinstance(row.get("prompt"), str) and isinstance(reply, str):
        return _chat([("user", row["prompt"], None),
                      _turn("assistant", reply, row, f"{where}:{n}")])
    if isinstance(row.get("text"), str):
        return Document(row["text"], None, "prose")  # empty texts are dropped by read_documents
    raise BadInput(f"{where}:{n}: record has none of the fields text, messages, "
                   f"prompt+completion (has: {', '.join(sorted(map(str, row))) or 'nothing'})",
                   "rename the field, or convert the file")


def _turn(role: str, content: str, fields: dict[str, Any], where: str
          ) -> tuple[str, str, str | None]:
    """(role, answer, reasoning) of one message; only an assistant turn carries reasoning."""
    if role != "assistant":
        return role, content, None
    for key in REASONING_FIELDS:
        value = fields.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise BadInput(f"{where}: the assistant's {key} is a {type(value).__name__}, not a "
                           "string", f"{key} holds the reasoning's text: make it a string or "
                           "drop the field")
        return role, content, value
    block = _THINK_BLOCK.match(content)
    if block:
        return role, block.group(2), block.group(1).strip("\n")
    return role, content, None


def _chat(turns: list[tuple[str, str, str | None]]) -> Document:
    """A chat document; one without reasoning is exactly what it was before reasoning was read."""
    reasoning = tuple(r if r and r.strip() else None for _, _, r in turns)
    if not any(reasoning):
        return Document("\n".join(c for _, c, _ in turns),
                        tuple((role, c) for role, c, _ in turns), "chat")
    text = "\n".join(f"{r}\n{c}" if r else c for (_, c, _), r in zip(turns, reasoning))
    return Document(text, tuple((role, c) for role, c, _ in turns), "chat", reasoning)


def _read_table(path: Path) -> Iterator[Document]:
    import pandas as pd

    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # pyarrow/pandas raise many parser error types
        raise BadInput(f"{path} could not be read as a table ({type(exc).__name__})",
                       "check that the file is complete") from exc
    for n, row in enumerate(frame.to_dict("records"), 1):
        yield _record_to_doc({k: v for k, v in row.items() if isinstance(v, (str, list))},
                             str(path), n)


def _hf_rows(loc: str) -> Iterator[dict[str, Any]]:
    parts = loc[3:].split(":")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "train"
    try:
        import datasets

        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # offline, unknown name or config: all one story for the user
        raise BadInput(f"dataset {name} could not be loaded ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''})",
                       "check the name/config/split; offline, export it to .jsonl and pass the file"
                       ) from exc
    yield from ds


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__",
            "ensurepip", "tkinter", "dist-packages"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    docs = (ast.get_docstring(n) for n in nodes)
    return [d for d in docs if d and len(d) > 40]
