"""Bad input found before the work: one error line, exit 2, nothing left behind; exit codes that
mean one thing; outputs that follow the user's umask."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from quantkit import fsutil


def _one_error(err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    hints = [ln for ln in err.splitlines() if ln.startswith("hint:")]
    assert len(lines) == 1 and len(hints) == 1, err
    assert "Traceback" not in err


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: compared before and after a refused command."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_output_path_in_the_way(tmp_path: Path, cli: Any, tiny_model: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        code, _, err = cli("calibrate", str(tiny_model), "--source", "builtin:stdlib-docs",
                           "--samples", "2", "--min-tokens", "16", "--max-tokens", "32",
                           "--out", str(out))
        assert code == 2, err
        _one_error(err)
    assert blocker.read_text() == "x"


def test_output_checks_before_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ro").mkdir()
    fsutil.check_output_dir(tmp_path / "ro" / "new" / "deeper", force=False)  # creatable: fine
    monkeypatch.setattr(fsutil, "MIN_FREE_BYTES", shutil.disk_usage(tmp_path).free * 2)
    with pytest.raises(fsutil.BadInput, match="MiB free"):
        fsutil.check_output_dir(tmp_path / "o", force=False)
    monkeypatch.undo()
    if os.geteuid() != 0:  # root writes into read-only folders
        (tmp_path / "ro").chmod(0o555)
        with pytest.raises(fsutil.BadInput, match="not writable"):
            fsutil.check_output_dir(tmp_path / "ro" / "o", force=False)


def test_malformed_model_folders(tmp_path: Path, cli: Any, tiny_model: Path) -> None:
    broken = tmp_path / "m"
    shutil.copytree(tiny_model, broken)
    (broken / "config.json").write_text("{not json")
    code, _, err = cli("inspect", str(broken))
    assert code == 2 and "config.json is not valid JSON" in err
    _one_error(err)
    (broken / "config.json").write_bytes(b"\xff\xfe{}")
    code, _, err = cli("inspect", str(broken))
    assert code == 2 and "not UTF-8" in err
    shutil.copy(tiny_model / "config.json", broken / "config.json")
    for f in broken.glob("*.safetensors"):
        f.unlink()
    code, _, err = cli("calibrate", str(broken), "--source", "builtin:stdlib-docs",
                       "--out", str(tmp_path / "c"))
    assert code == 2 and "no weight files" in err
    assert not (tmp_path / "c").exists()


def test_thresholds_files(tmp_path: Path, cli: Any) -> None:
    from quantkit.gate import load_thresholds

    empty = tmp_path / "t.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(fsutil.BadInput, match="empty: it would gate nothing"):
        load_thresholds(empty)
    empty.write_bytes(b"mmlu: {retention: 0.9}\n\xff")
    with pytest.raises(fsutil.BadInput, match="not UTF-8"):
        load_thresholds(empty)
    empty.write_text("mmlu: {retention: high}\n")
    with pytest.raises(fsutil.BadInput, match="out of range"):
        load_thresholds(empty)
    empty.write_text("")
    code, _, err = cli("validate", str(tmp_path / "a"), "--baseline", "x", "--out",
                       str(tmp_path / "o"), "--thresholds", str(empty))
    assert code == 2 and "empty" in err
    _one_error(err)


def test_results_and_manifest_schema(tmp_path: Path, cli: Any) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    example = json.loads((Path(__file__).parent / "data" / "results-example.json").read_text())
    (folder / "results.json").write_text(json.dumps({**example, "schema_version": 1}))
    code, _, err = cli("report", str(folder))
    assert code == 2 and "results schema_version 1" in err
    (folder / "results.json").write_bytes(b"\xff\xfe")
    code, _, err = cli("report", str(folder))
    assert code == 2 and "not valid JSON" in err
    (folder / "results.json").write_text(json.dumps({**example, "tasks": []}))
    code, _, err = cli("report", str(folder))
    assert code == 2 and "tasks has the wrong type" in err
    art = tmp_path / "art"
    art.mkdir()
    (art / "quantkit.json").write_text(json.dumps({"schema_version": 1, "checkpoint": "gguf"}))
    code, _, err = cli("serve", str(art))
    assert code == 2 and "manifest schema_version 1" in err
    _one_error(err)


def test_folder_sources_read_text_by_content(tmp_path: Path) -> None:
    from quantkit.sources import parse_source, read_documents

    src = tmp_path / "corpus"
    src.mkdir()
    (src / "LICENSE").write_text("Permission is hereby granted, free of charge.\n")
    (src / "notes").write_text("An extensionless corpus file.\n\nIts second paragraph.\n")
    (src / "main.py").write_text("def f():\n    return 1\n")
    (src / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    docs = read_documents(parse_source(str(src)))
    texts = sorted(d.text for d in docs)
    assert "Permission is hereby granted, free of charge." in texts
    assert "Its second paragraph." in texts
    assert any(d.domain == "code" and "return 1" in d.text for d in docs)
    assert not any("PNG" in t for t in texts)
    with pytest.raises(fsutil.BadInput, match="is not text"):
        parse_source(str(src / "logo.png"))
    latin1 = tmp_path / "old.txt"
    latin1.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(fsutil.BadInput, match="not text"):
        parse_source(str(latin1))


def test_unexpected_errors_exit_3_not_1(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import quantkit.inspect

    def boom(_target: str) -> None:
        raise ZeroDivisionError("division by zero in a place nobody expected")

    monkeypatch.setattr(quantkit.inspect, "inspect_path", boom)
    code, _, err = cli("inspect", "anything")
    assert code == 3
    _one_error(err)
    assert "ZeroDivisionError: division by zero" in err and "--debug" in err


def test_outputs_follow_the_umask(tmp_path: Path, cli: Any, tiny_model: Path,
                                  tiny_artifact: Path, corpus: dict[str, Path]) -> None:
    for f in (tiny_artifact, *tiny_artifact.iterdir()):  # safetensors writes 0600 by itself
        assert stat.S_IMODE(f.stat().st_mode) == (0o755 if f.is_dir() else 0o644), f
    old = os.umask(0o022)
    try:
        out = tmp_path / "calib"
        code, _, err = cli("calibrate", str(tiny_model), "--source", str(corpus["prose"]),
                           "--samples", "4", "--min-tokens", "16", "--max-tokens", "64",
                           "--out", str(out))
        assert code == 0, err
        assert stat.S_IMODE(out.stat().st_mode) == 0o755
        for f in out.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
        page = tmp_path / "page.html"
        fsutil.atomic_write_text(page, "<p>")
        assert stat.S_IMODE(page.stat().st_mode) == 0o644
        # a built program keeps its execute bits (llama-server from `quantkit setup`)
        with fsutil.atomic_dir(tmp_path / "bin") as built:
            (built / "prog").write_text("#!/bin/sh\n")
            (built / "prog").chmod(0o700)
            (built / "data").write_text("x")
        assert stat.S_IMODE((tmp_path / "bin" / "prog").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "bin" / "data").stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_seeds_out_of_range(tmp_path: Path, cli: Any, tiny_model: Path) -> None:
    """A negative seed was a ValueError deep in calibration (exit 3); llama.cpp reads -1 as
    "random". Every command's --seed takes 0 to 2**32 - 1."""
    for seed in ("-1", str(2**32)):
        runs = [("calibrate", str(tiny_model), "--source", "builtin:stdlib-docs", "--samples",
                 "2", "--min-tokens", "16", "--max-tokens", "32", "--out", str(tmp_path / "c")),
                ("validate", str(tmp_path / "a"), "--baseline", str(tiny_model), "--out",
                 str(tmp_path / "r")),
                ("bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "b"))]
        for args in runs:
            code, _, err = cli(*args, "--seed", seed)
            assert code == 2 and f"--seed {seed} is out of range" in err, (args, err)
            _one_error(err)
    assert _files(tmp_path) == {}


def test_recipe_version_is_the_integer_1(tmp_path: Path, cli: Any) -> None:
    """`version: true` and `version: 1.0` equal 1 in Python; neither is the recipe version 1."""
    for version in ("true", "1.0", "'1'"):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"version: {version}\nname: r\nmodel: {tmp_path / 'no-model'}\n"
                          "calibration: {sources: [builtin:stdlib-docs]}\nquantize: {}\n"
                          f"outputs: {{calib: {tmp_path / 'c'}, artifact: {tmp_path / 'a'}, "
                          f"report: {tmp_path / 'r'}}}\n")
        before = _files(tmp_path)
        code, _, err = cli("calibrate", "--recipe", str(recipe))
        assert code == 2 and "is not supported" in err and "version: 1" in err, (version, err)
        _one_error(err)
        assert _files(tmp_path) == before


def test_inspect_of_damaged_manifests(tmp_path: Path, cli: Any) -> None:
    """An artifact whose quantkit.json, or a calibration set whose manifest.json or stats.json,
    is not JSON (or lacks what inspect reads) is bad input, not a crash."""
    art = tmp_path / "art"
    art.mkdir()
    calib = tmp_path / "calib"
    calib.mkdir()
    (calib / "samples.jsonl").write_text('{"input_ids": [1, 2]}\n')
    cases = [(art / "quantkit.json", b"{not json", "not valid JSON"),
             (art / "quantkit.json", b"\xff\xfe{}", "not valid JSON"),
             (art / "quantkit.json", b"[1, 2]", "not a JSON object"),
             (calib / "manifest.json", b"{not json", "not valid JSON"),
             (calib / "manifest.json", b'{"counts": {}}', "stats.json"),
             (calib / "stats.json", b"{oops", "not valid JSON"),
             (calib / "stats.json", b'{"mix": {}}', "incomplete"),
             (calib / "stats.json", b'{"mix": {}, "token_length": null}', "incomplete"),
             # whole at the top, a source without its location: the text view's records
             (calib / "manifest.json", b'{"counts": {"samples": 1, "tokens": 2}, "sources": '
              b'[{"spec": "x"}], "tokenizer": {}}', "incomplete")]
    for file, data, words in cases:
        file.write_bytes(data)
        before = _files(tmp_path)
        code, _, err = cli("inspect", str(file.parent))
        assert code == 2 and words in err, (file.name, data, err)
        _one_error(err)
        assert _files(tmp_path) == before


def test_serve_and_doctor_refuse_a_file_that_is_not_a_gguf(tmp_path: Path, cli: Any) -> None:
    """Checked before any engine starts: the engine's loader failed with exit 3, and doctor
    printed the message of the `quantkit serve` it started inside its own."""
    text = tmp_path / "x.gguf"
    text.write_text("not a model, just text\n")
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(bytes(range(256)) * 64)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\x10\x00")
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"\x00" * 64)
    random_file = tmp_path / "weights.bin"
    random_file.write_bytes(bytes(range(256)))
    before = _files(tmp_path)
    for path, words in ((text, "GGUF magic"), (noise, "GGUF magic"), (truncated, "not a readable GGUF"),
                        (folder, "GGUF magic"), (random_file, "not a .gguf")):
        for args in (("serve", str(path), "--allow-unvalidated"), ("serve", str(path)),
                     ("doctor", str(path))):
            code, _, err = cli(*args)
            assert code == 2 and words in err, (args, err)
            _one_error(err)
    assert _files(tmp_path) == before


def test_doctor_relays_what_serve_refuses_once(cli: Any, tiny_artifact: Path) -> None:
    """What the `quantkit serve` that doctor starts refuses comes back as its own error and hint,
    exit 2, not quoted inside a second error."""
    code, _, err = cli("doctor", str(tiny_artifact), "--engine", "llama.cpp")
    assert code == 2 and "cannot run a compressed-tensors artifact (it runs GGUF)" in err, err
    assert "exited" not in err, err
    _one_error(err)


def test_fp8_options_refused_before_any_work(tmp_path: Path, cli: Any, tiny_model: Path,
                                             tiny_calib: Path) -> None:
    """The FP8 formats' options, wrong or out of range: one error, one hint, exit 2, no output."""
    quantize = ["quantize", str(tiny_model), "--calib", str(tiny_calib)]
    cases = [
        (quantize + ["--method", "gptq", "--static"], "--static applies to --method fp8"),
        (quantize + ["--method", "gguf", "--activations", "fp8"], "does not apply to --method gguf"),
        (quantize + ["--activations", "fp8", "--group-size", "64"], "needs --bits 4 --group-size 128"),
        (quantize + ["--activations", "fp8", "--asym"], "needs --bits 4 --group-size 128"),
        (quantize + ["--activations", "fp8,fp8"], "unknown --activations 'fp8,fp8'"),
        (quantize + ["--activations", "disk,memory"], "unknown --activations 'disk,memory'"),
        (quantize + ["--activations", "fp8", "--w8-groups", "2"], "--w8-groups keeps groups at 8-bit"),
        (quantize + ["--method", "fp8", "--w8-groups", "2"], "--w8-groups applies"),
        (["validate", str(tiny_model), "--baseline", str(tiny_model), "--tasks", "long_context",
          "--long-context-samples", "0"], "--long-context-samples 0 must be at least 1"),
        (["serve", str(tiny_model), "--expected-concurrency", "0"], "--expected-concurrency 0"),
        (["serve", str(tiny_model), "--max-num-seqs", "4", "--expected-concurrency", "5"],
         "outside 1 to --max-num-seqs 4"),
        # vLLM refused the 8B recipe's 8192 over a model of 4096 positions after a minute
        (["serve", str(tiny_model), "--ctx-size", "4096"],
         "--ctx-size 4096 is longer than the 2048 tokens"),
    ]
    for args, words in cases:
        out = tmp_path / "o"
        code, _, err = cli(*args, *(["--out", str(out)] if args[0] != "serve" else []))
        assert code == 2 and words in err, (args, err)
        _one_error(err)
        assert not out.exists(), args


def test_an_unknown_cpu_dtype_is_refused_before_any_work(tmp_path: Path, cli: Any,
                                                         tiny_artifact: Path, tiny_model: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTKIT_CPU_DTYPE", "fp16")
    domain = tmp_path / "d.jsonl"
    domain.write_text(json.dumps({"text": "def add(a, b):\n    return a + b\n"}) + "\n")
    out = tmp_path / "v"
    code, _, err = cli("validate", str(tiny_artifact), "--baseline", str(tiny_model), "--tasks",
                       "domain", "--domain-set", str(domain), "--out", str(out))
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith(("error:", "hint:"))]
    assert [ln.split(":")[0] for ln in lines] == ["error", "hint"]
    assert "QUANTKIT_CPU_DTYPE=fp16" in lines[0] and "float32" in lines[1]
    assert not out.exists()


def test_quantize_without_its_checkpoint_writer_stops_before_any_work(
        tmp_path: Path, cli: Any, tiny_model: Path, tiny_calib: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """compressed-tensors that cannot be imported (the 8B recipe's device lacked its loguru) is
    refused before the first layer, not after the last one, when the checkpoint is written."""
    import sys

    monkeypatch.setitem(sys.modules, "compressed_tensors.quantization", None)
    out = tmp_path / "o"
    code, _, err = cli("quantize", str(tiny_model), "--calib", str(tiny_calib), "--method",
                       "gptq", "--group-size", "32", "--out", str(out))
    assert code == 2 and "importing compressed_tensors failed" in err, err
    assert "hint: pip install compressed-tensors" in err
    _one_error(err)
    assert list(tmp_path.iterdir()) == []
