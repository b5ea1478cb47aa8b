"""docs/ARCHITECTURE.md names the modules a newcomer opens: each one it names exists (a path from
the repository's root, or from the package's), so the page cannot describe a house that moved."""

from __future__ import annotations

import re

from _serving import ROOT


def test_every_module_the_architecture_page_names_exists() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = {m for m in re.findall(r"`([\w./-]+)`", text)
             if m.endswith((".py", "/")) or m.startswith(("quantkit/", "tests/", "bench/"))}
    assert len(named) >= 15  # the page names its rooms
    missing = [m for m in sorted(named)
               if not (ROOT / m).exists() and not (ROOT / "quantkit" / m).exists()]
    assert not missing, f"docs/ARCHITECTURE.md names what does not exist: {missing}"
