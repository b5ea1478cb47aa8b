"""calibrate --self-traces (issue 48, item 2): the trained thinking model (tests/_thinking.py)
answers N of the sources' chat prompts with thinking on, and those answers, thinking in its own
markers, join the set; the manifest says how many samples and tokens came from where. A model
without a chat template cannot be asked: one error, one hint, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _thinking import corpus


def _source(path: Path) -> Path:
    """Chats without reasoning: the traces are the only thinking in the set."""
    path.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
        for q, _, a in corpus(24, seed=11)))
    return path


def test_self_traces_join_the_set_with_their_thinking(cli, thinking_model, tmp_path):
    src = _source(tmp_path / "chats.jsonl")
    out = tmp_path / "set"
    code, stdout, err = cli("calibrate", str(thinking_model), "--source", str(src), "--out",
                            str(out), "--samples", "6", "--min-tokens", "32", "--max-tokens",
                            "128", "--self-traces", "4", "--trace-max-tokens", "96")
    assert code == 0, stdout + err
    manifest = json.loads((out / "manifest.json").read_text())
    origins = manifest["origins"]
    t = origins["self-traces"]
    assert t["prompts"] == 4 and t["samples"] >= 1 and t["thinking"] == "on"
    assert origins["sources"]["samples"] == 6
    assert manifest["counts"]["samples"] == 6 + t["samples"]
    assert manifest["counts"]["tokens"] == origins["sources"]["tokens"] + t["tokens"]
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    traces = [r for r in rows if r["source"] == "self-traces"]
    assert len(traces) == t["samples"]
    # the model thought, in its own markers, and closed its thinking before answering
    assert all("<think>" in r["text"] and "</think>" in r["text"] for r in traces)
    assert "self-traces: 4 answers of the model (thinking on)" in stdout
    code, stdout, err = cli("inspect", str(out))
    assert code == 0 and f"self-traces: {t['samples']} samples, {t['tokens']} tokens" in stdout, err


def test_self_traces_need_a_chat_template(cli, thinking_model, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(thinking_model, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "set"
    code, _, err = cli("calibrate", str(plain), "--source", str(_source(tmp_path / "c.jsonl")),
                       "--out", str(out), "--samples", "4", "--min-tokens", "32",
                       "--self-traces", "2")
    lines = [x for x in err.strip().splitlines() if not x.startswith("warning:")]  # --samples 4
    assert code == 2 and lines[0].startswith("error: --self-traces:")
    assert "no chat template" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("hint:") and not out.exists()
