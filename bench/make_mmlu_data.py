"""Build the MMLU copy that ships inside the package: quantkit/data/mmlu/{dev,test}.jsonl.gz.

  python bench/make_mmlu_data.py ../shared/data/mmlu/jsonl

SRC holds {test,dev}/SUBJECT.jsonl in the hub's cais/mmlu schema (question, subject, choices[4],
answer 0-3). Each output is one JSON object a line, subjects in name order and each subject's
rows in file order, gzip'd with mtime 0 and no file name, so the same input gives the same
bytes. SOURCE.md beside them gets the origin, the license and the sha256 of every input file and
of both outputs. Only this script reads SRC; the package reads what it writes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "quantkit" / "data" / "mmlu"
SPLITS = ("dev", "test")
KEYS = ["question", "subject", "choices", "answer"]

SOURCE_MD = """\
# MMLU, the complete release (dev + test, 57 subjects)

Hendrycks et al., "Measuring Massive Multitask Language Understanding", ICLR 2021.

License: MIT (Copyright (c) 2020 Dan Hendrycks), the LICENSE of github.com/hendrycks/test, the
original release; the data is the release's `data.tar`.

## Origin
- The original CSVs (`data/mmlu/{{dev,test}}/*.csv` of the release) as vendored by the public
  GitHub repository `stanford-cs336/assignment5-alignment`, commit
  eb2c562e05802d3c9ee4c4ec2eec43b104d77e9e ("data for a5 optional assignment"); its
  `test/abstract_algebra_test.csv` is byte-identical to the file hendrycks/test committed itself.
- Converted losslessly to the hub's `cais/mmlu` schema, one JSONL file per split and subject:
  `{{"question": str, "subject": str, "choices": [4 str], "answer": int 0-3}}`,
  answer = "ABCD".index(letter), row order kept. The `val` split is not shipped.
- `{{dev,test}}.jsonl.gz` here join those files: subjects in name order, each subject's rows in
  file order, compact JSON (UTF-8), gzip level 9 with mtime 0.
  Rebuild: `python bench/make_mmlu_data.py DIR` (DIR holding `{{test,dev}}/SUBJECT.jsonl`).

## Contents
{counts}

## sha256 of what ships
```
{shipped}
```

## sha256 of the input files (`{{dev,test}}/SUBJECT.jsonl`)
```
{inputs}
```
{csv}"""

CSV_MD = """
## sha256 of the release's original CSVs these were converted from (`{{dev,test}}/*.csv`)
```
{sums}
```
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_split(src: Path, split: str) -> tuple[list[dict], dict[str, int], list[str]]:
    """Rows of one split (checked), count per subject, and `sha256  path` of each input."""
    files = sorted((src / split).glob("*.jsonl"))
    if not files:
        sys.exit(f"error: no {split}/*.jsonl in {src}")
    rows: list[dict] = []
    counts: dict[str, int] = {}
    sums: list[str] = []
    for f in files:
        data = f.read_bytes()
        sums.append(f"{sha256(data)}  {split}/{f.name}")
        n = 0
        # split on "\n" only: str.splitlines() also splits at U+2028 etc. inside questions
        for i, line in enumerate(data.decode("utf-8").split("\n"), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            ok = (list(r) == KEYS and isinstance(r["question"], str) and r["subject"] == f.stem
                  and isinstance(r["choices"], list) and len(r["choices"]) == 4
                  and all(isinstance(c, str) for c in r["choices"])
                  and type(r["answer"]) is int and 0 <= r["answer"] <= 3)
            if not ok:
                sys.exit(f"error: {f}:{i} is not {{question, subject, choices[4], answer 0-3}}")
            rows.append(r)
            n += 1
        counts[f.stem] = n
    return rows, counts, sums


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path, help="folder with {test,dev}/SUBJECT.jsonl")
    p.add_argument("--csv", type=Path, help="folder with the original {dev,test}/*.csv, to "
                   "record their sha256 (default: SRC/../csv where it exists)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    csv_dir = args.csv or (args.src.parent / "csv")
    if args.csv and not csv_dir.is_dir():
        sys.exit(f"error: {csv_dir} is not a folder")
    args.out.mkdir(parents=True, exist_ok=True)
    shipped, inputs, counts = [], [], {}
    for split in SPLITS:
        rows, counts[split], sums = read_split(args.src, split)
        inputs += sums
        text = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                       for r in rows)
        gz = gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)
        (args.out / f"{split}.jsonl.gz").write_bytes(gz)
        shipped.append(f"{sha256(gz)}  {split}.jsonl.gz")
        shipped.append(f"{sha256(text.encode('utf-8'))}  {split}.jsonl (uncompressed)")
        print(f"{split}: {len(rows)} questions, {len(counts[split])} subjects, "
              f"{len(gz):,} bytes")
    if set(counts["dev"]) != set(counts["test"]):
        sys.exit("error: dev and test name different subjects")
    table = ", ".join(f"{s} {len(counts[s])} subjects / {sum(counts[s].values())} questions"
                      for s in SPLITS)
    (args.out / "SOURCE.md").write_text(SOURCE_MD.format(
        counts=f"- {table}.", shipped="\n".join(shipped), inputs="\n".join(inputs),
        csv=CSV_MD.format(sums="\n".join(csv_sums(csv_dir))) if csv_dir.is_dir() else ""))


def csv_sums(folder: Path) -> list[str]:
    """`sha256  split/name.csv` of the original CSVs of the shipped splits."""
    return [f"{sha256(f.read_bytes())}  {split}/{f.name}"
            for split in SPLITS for f in sorted((folder / split).glob("*.csv"))]


if __name__ == "__main__":
    main()
