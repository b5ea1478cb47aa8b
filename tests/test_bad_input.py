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
    assert len(lines) == 1 and "hint:" in err, err
    assert "Traceback" not in err


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
    finally:
        os.umask(old)
