"""The local files `recipes/llama-3.1-8b-instruct-gptq.yaml` needs where a machine has no hub, in
the shapes the recipe names (issue 46), built from the Python standard library (deterministic for
one Python version; no download):
- `chat.jsonl`: multi-turn chats in ultrachat_200k's shape ({"messages": [{role, content}, ...]}),
  a user asking about a module and the assistant answering with its documentation, stands in for
  `hf:HuggingFaceH4/ultrachat_200k:default:train_sft`;
- `my-domain-chats.jsonl`: the domain's chats (a user asking for code, the answer a function's
  source), for `data/my-domain-chats.jsonl`;
- `my-domain-test.jsonl`: the domain set, perplexity lines (`text`) and QA lines (`prompt`,
  `answer`), for `data/my-domain-test.jsonl`.
usage: python3 bench/h200/recipe_data.py OUT_DIR"""
import ast
import json
import sys
import sysconfig
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
lib = Path(sysconfig.get_paths()["stdlib"])
files = sorted(p for p in lib.rglob("*.py") if not {"test", "tests", "site-packages", "idlelib"}
               & set(p.relative_to(lib).parts) and not p.name.startswith("_"))


def defs(path: Path) -> list[tuple[str, str, str]]:
    """(name, docstring, source) of each documented top-level function or class."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node)
            src = ast.get_source_segment(text, node)
            if doc and src and len(doc) > 80:
                found.append((node.name, doc, src))
    return found


chats, domain_chats, texts, qa = [], [], [], []
for f in files:
    items = defs(f)
    if not items:
        continue
    mod = ".".join(f.relative_to(lib).with_suffix("").parts)
    for s in range(0, len(items), 6):
        turns = []
        for name, doc, _ in items[s:s + 6]:
            turns += [{"role": "user", "content": f"What does {mod}.{name} do, and when would I "
                                                  "use it?"},
                      {"role": "assistant", "content": doc}]
        chats.append({"prompt": f"Questions about {mod}", "messages": turns})
    for name, doc, src in items[:4]:
        domain_chats.append({"messages": [
            {"role": "user", "content": f"Write {name} as the {mod} module does. {doc[:200]}"},
            {"role": "assistant", "content": f"```python\n{src}\n```"}]})
        if len(texts) < 120:
            texts.append({"text": " ".join(doc.split())[:600]})
    if len(qa) < 40:
        qa.append({"prompt": f"Which Python standard library module defines {items[0][0]}? "
                             "Answer with the module name.", "answer": mod, "match": "contains"})

for name, rows in (("chat.jsonl", chats), ("my-domain-chats.jsonl", domain_chats),
                   ("my-domain-test.jsonl", texts + qa)):
    (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(name, len(rows), "records", (out / name).stat().st_size // 1024, "KiB")
