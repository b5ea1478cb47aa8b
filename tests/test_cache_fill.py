"""Two processes sharing $QUANTKIT_HOME fill a cache entry once: the second waits for the first and
finds the entry filled (the test suite's workers, or two CI jobs, convert the demo model once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FILL = """
import os, sys, time
from pathlib import Path
from quantkit.fsutil import cache_fill

entry, log = Path(sys.argv[1]), Path(sys.argv[2])
Path(sys.argv[3]).touch()                       # this process is ready
while len(list(Path(sys.argv[3]).parent.glob("ready-*"))) < 2:
    time.sleep(0.01)                            # both start filling together
with cache_fill(entry):
    if not entry.exists():
        time.sleep(1.0)                         # a slow conversion
        with log.open("a") as fh:
            fh.write(f"{os.getpid()}\\n")
        entry.write_text("filled")
print(entry.read_text())
"""


def test_two_processes_fill_an_entry_once(tmp_path: Path) -> None:
    entry, log = tmp_path / "cache" / "model", tmp_path / "fills.log"
    procs = [subprocess.Popen([sys.executable, "-c", FILL, str(entry), str(log),
                               str(tmp_path / f"ready-{i}")], stdout=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == ["filled\n", "filled\n"]
    assert len(log.read_text().splitlines()) == 1
