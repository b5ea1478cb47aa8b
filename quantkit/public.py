"""What is published names nothing of the user's machine. The manifest, results.json, the report
and the card record local paths (the calibration sources, the model folder, the cache), which on
the Hub would tell the world the user's name and folder layout: in a published copy each absolute
local path becomes its last component (`/home/alice/data/chats.jsonl@0.7` -> `chats.jsonl@0.7`),
while hub ids (`org/name`, `hf:org/name`), URLs and paths relative to the recipe stay as the user
wrote them. The local files keep the full paths. Pure: text in, text out."""

from __future__ import annotations

import re
from pathlib import Path

# an absolute POSIX path (or ~/...) inside any text: one or more folders, then the last
# component; not inside a URL (`https://host/a/b`), a hub id (`org/name`) or a relative path
_PATH = r"(?:~/|/)(?:[^\s/'\"<>|`]+/)+(?P<last>[^\s/'\"<>|`@,;)\]]*)"
_ABS = re.compile(r"(?:file://|(?<![\w:/.~-]))" + _PATH)
# text-like files small enough to read: the rest (weights) is published as it is
TEXT_SUFFIXES = (".json", ".html", ".md", ".txt", ".yaml", ".yml", ".jinja", ".xml")
MAX_TEXT_BYTES = 64 * 2**20


def scrub_text(text: str) -> str:
    """`text` with every absolute local path reduced to its last component."""
    return _ABS.sub(lambda m: m.group("last") or "", text)


def is_text(path: Path) -> bool:
    """Whether a published file is one whose paths are scrubbed (by its suffix and size)."""
    return path.suffix in TEXT_SUFFIXES and path.stat().st_size <= MAX_TEXT_BYTES
