"""A GGUF file's header: its metadata and tensor table, read without the arrays.

gguf-py's `GGUFReader` builds a numpy view of every element of every array field, the tokenizer's
49,152 strings among them: 2-5 s for the demo model on 2 cores, paid twice at each `quantkit
serve` start before this reader. Here an array is stepped over (a string array by its lengths)
and kept as `Array(item_type, count)`; the tensor table is checked against the file's size, so
a truncated file fails here as it does in `GGUFReader`. Types and block sizes are gguf-py's.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # gguf-py's GGUFValueType ids
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Array:
    """An array field, not read: its item type (GGUFValueType id) and length."""

    item_type: int
    count: int


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the row length first
    type_name: str          # gguf-py's GGMLQuantizationType name: F16, Q4_K, ...
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class Header:
    fields: dict[str, Any]  # scalars and strings as Python values, arrays as `Array`
    tensors: list[Tensor]

    def scalar(self, suffix: str) -> Any:
        """The first field whose key ends with `suffix` (".context_length"), or None."""
        return next((v for k, v in self.fields.items() if k.endswith(suffix)), None)


class _Cursor:
    def __init__(self, buf: Any, order: str) -> None:
        self.buf, self.pos, self.order = buf, 0, order

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(self.order + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self.take("I"), self.take("Q")
        if item == _STRING:
            for _ in range(count):
                self.pos += 8 + self.take("Q")
        elif item in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item])
        else:
            raise ValueError(f"an array of GGUF value type {item}")
        if self.pos > len(self.buf):
            raise ValueError("an array runs past the end of the file")
        return Array(item, count)


def read_header(path: Path, gguf: Any = None) -> Header:
    """The header of the GGUF file at `path`; ValueError where it is not one or is cut short.
    `gguf`: the gguf-py module whose tensor types to know (default: the one installed; the
    converter's own, `llamacpp_source.gguf_module()`, knows the newest)."""
    if gguf is None:
        import gguf
    sizes, types = gguf.GGML_QUANT_SIZES, gguf.GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != MAGIC:
            raise ValueError("no GGUF magic bytes")
        version = struct.unpack_from("<I", buf, 4)[0]
        order = "<" if version & 0xFFFF else ">"  # a big-endian file reads as version << 24
        cur = _Cursor(buf, order)
        cur.pos = 4
        try:
            version = cur.take("I")
            if version < 2:
                raise ValueError(f"GGUF version {version} (llama.cpp reads 2 and later)")
            n_tensors, n_fields = cur.take("Q"), cur.take("Q")
            fields = {}
            for _ in range(n_fields):
                key = cur.string()
                fields[key] = cur.value(cur.take("I"))
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                shape = tuple(cur.take("Q") for _ in range(cur.take("I")))
                infos.append((name, shape, cur.take("I"), cur.take("Q")))
        except struct.error as exc:
            raise ValueError(f"the header is cut short ({exc})") from None
        align = int(fields.get("general.alignment", 32))
        start = -(-cur.pos // align) * align
        tensors = []
        for name, shape, kind, offset in infos:
            qtype = types(kind)
            block, size = sizes[qtype]
            n = math.prod(shape)
            tensor = Tensor(name, shape, qtype.name, n, n // block * size)
            if start + offset + tensor.n_bytes > len(buf):
                raise ValueError(f"tensor {name} runs past the end of the file (cut short?)")
            tensors.append(tensor)
    return Header(fields, tensors)
