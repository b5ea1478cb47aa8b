"""Fixtures: a tiny random-weight llama with a real (trained) tokenizer, its calibration set and
GPTQ artifact, a tiny llama trained to think, the real demo model, the demo recipes' runs,
llama-server and the demo GGUF. Each expensive thing is made once per session, in a temporary
folder, and shared."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _serving import ROOT, quantkit
from typer.testing import CliRunner

# The end-to-end tier (`python -m pytest -m e2e`, after the fast tier in .ci/run): a test that asks
# for one of these fixtures runs a demo recipe or llama-server, and is marked e2e by that alone;
# the demo model's quality checks and the browser runs carry the mark themselves.
E2E_FIXTURES = frozenset({"demo_run", "demo_w4_run", "demo_gguf_run", "demo_gguf", "llama_server"})
# Tests that need the gguf extra (llama-cpp-python and its llama-server): marked `gguf`, or asking
# for one of these fixtures; skipped, saying so, where the extra is not installed.
GGUF_FIXTURES = frozenset({"demo_gguf_run", "demo_gguf", "llama_server"})
GGUF_MISSING = ("the gguf extra (llama-cpp-python) is not installed: "
                "CMAKE_ARGS=... pip install -e '.[gguf]' (README, set-up step 2)")
SLOW_FAST_TIER_S = 15.0  # the fast tier's summary lists its tests that took longer than this
MAX_WORKERS = 4  # `-n auto`: one worker per core up to this (each loads torch and its own fixtures)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """pytest-xdist's `-n auto` (addopts). The fast tier uses about one core in one process (its
    tests wait on subprocesses, servers and imports), so it runs in one worker per core. The
    end-to-end tier runs in one process: its demo recipes are session fixtures that many of its
    tests share (a second worker would run them again), and its load tests time servers that
    another worker's recipe would slow down."""
    import os

    expr = config.option.markexpr or ""
    if "e2e" in expr and "not e2e" not in expr:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, cores or 1))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from importlib.util import find_spec

    gguf_missing = find_spec("llama_cpp") is None
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if E2E_FIXTURES & fixtures:
            item.add_marker(pytest.mark.e2e)
        if GGUF_FIXTURES & fixtures:
            item.add_marker(pytest.mark.gguf)
        if gguf_missing and item.get_closest_marker("gguf"):
            item.add_marker(pytest.mark.skip(reason=GGUF_MISSING))


_took: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "e2e" not in report.keywords and "gpu" not in report.keywords:  # neither is fast-tier
        _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name every fast-tier test over SLOW_FAST_TIER_S (setup and teardown included, so the first
    user of a shared fixture pays for it): room in the tier is kept by moving them, not by luck."""
    slow = sorted(((t, n) for n, t in _took.items() if t > SLOW_FAST_TIER_S), reverse=True)
    if slow:
        terminalreporter.section(f"fast-tier tests over {SLOW_FAST_TIER_S:.0f} s")
        for took, nodeid in slow:
            terminalreporter.write_line(f"{took:7.1f} s  {nodeid}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer llama (hidden 64) with a 1k-token BPE tokenizer and a chat template, on disk
    (tests/_models.py's tiny_llama)."""
    from _models import tiny_llama  # torch with it: imported when a test asks for the model

    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama trained to think (tests/_thinking.py: Qwen3's chat template, <think>
    reasoning </think> answer; 18 s on 2 idle cores, up to 50 s beside a fast tier), built once
    per session: under xdist in the session's temporary folder that all workers share, the first
    one training it under a lock."""
    import os

    from _thinking import build_thinking_model
    from filelock import FileLock

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.mktemp("thinking-model")
        build_thinking_model(path)
        return path
    shared = tmp_path_factory.getbasetemp().parent  # this session's, one per worker below it
    path = shared / "thinking-model"
    with FileLock(str(shared / "thinking-model.lock")):
        if not (path / "config.json").is_file():
            tmp = shared / "thinking-model.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            build_thinking_model(tmp)
            tmp.rename(path)
    return path


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The built-in demo model (SmolLM2-135M-Instruct), converted once into the cache."""
    from quantkit.models import resolve_model

    return resolve_model("smollm2-135m").path


@pytest.fixture
def cli():
    """Run the real CLI in-process; returns (exit_code, stdout, stderr)."""
    from quantkit.cli import app

    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str, str]:
        res = runner.invoke(app, list(args))
        if res.exception and not isinstance(res.exception, SystemExit):
            raise res.exception
        return res.exit_code, res.stdout, res.stderr

    return invoke


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real-looking offline sources: prose (.md), code (folder) and chats (.jsonl), from the stdlib."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    base = tmp_path_factory.mktemp("corpus")
    files = sorted(root.glob("*.py"))
    docs = []
    for f in files:
        try:
            tree = ast.parse(f.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
                docs.append((f.stem, node.name, ast.get_docstring(node)))
    prose = base / "prose.md"
    prose.write_text("\n\n".join(d for _, _, d in docs[: len(docs) // 2]))
    chats = base / "chats.jsonl"
    with chats.open("w") as fh:
        for mod, name, doc in docs[len(docs) // 2:]:
            fh.write(json.dumps({"messages": [
                {"role": "user", "content": f"What does {name} in the {mod} module do?"},
                {"role": "assistant", "content": doc}]}) + "\n")
    code = base / "code"
    code.mkdir()
    for f in files[:120]:
        (code / f.name).write_text(f.read_text(errors="replace"))
    return {"prose": prose, "chats": chats, "code": code}


@pytest.fixture(scope="session")
def tiny_calib(tiny_model: Path, corpus: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    """The tiny model's calibration set: 16 samples of 64-128 tokens from prose and code."""
    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig

    out = tmp_path_factory.mktemp("tiny-calib") / "set"
    calibrate(model=str(tiny_model), out=out, cfg=CalibrateConfig(
        sources=(str(corpus["prose"]), str(corpus["code"])), samples=16, min_tokens=64,
        max_tokens=128))
    return out


@pytest.fixture(scope="session")
def tiny_artifact(tiny_model: Path, tiny_calib: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Path:
    """A GPTQ W4 g32 compressed-tensors artifact of the tiny model."""
    from quantkit.config import QuantizeConfig
    from quantkit.quantize import quantize

    out = tmp_path_factory.mktemp("tiny-artifact") / "artifact"
    quantize(model=str(tiny_model), cfg=QuantizeConfig(method="gptq", group_size=32),
             calib=tiny_calib, out=out)
    return out


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a copy of the repository's recipes/: `quantkit run recipes/X.yaml` run
    there, as the README runs it from the repository, writes its calib_sets/, artifacts/ and
    reports/ here and never into the repository."""
    work = tmp_path_factory.mktemp("work")
    shutil.copytree(ROOT / "recipes", work / "recipes")
    return work


@pytest.fixture(scope="session")
def demo_run(workdir: Path) -> subprocess.CompletedProcess:
    """`quantkit run recipes/demo.yaml` (auto: the smallest GPTQ that passes), once."""
    return quantkit("run", "recipes/demo.yaml", cwd=workdir)


@pytest.fixture(scope="session")
def demo_w4_run(workdir: Path) -> subprocess.CompletedProcess:
    """`quantkit run recipes/demo-w4.yaml` (GPTQ W4 g64, fails its gate), once; leaves
    artifacts/demo-w4 in `workdir`."""
    return quantkit("run", "recipes/demo-w4.yaml", cwd=workdir)


@pytest.fixture(scope="session")
def demo_gguf_run(workdir: Path, demo_run: subprocess.CompletedProcess
                  ) -> subprocess.CompletedProcess:
    """`quantkit run recipes/demo-gguf.yaml` (GGUF Q4_K_M + imatrix on llama.cpp), once, after
    the GPTQ demo as a user who follows README does: its importance matrix is read off the
    Hessians that run kept (same model, same calibration set), no pass of its own. Leaves
    artifacts/demo-gguf and its passing report in `workdir`."""
    return quantkit("run", "recipes/demo-gguf.yaml", cwd=workdir)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama-server: the one the gguf extra installed, else built by `quantkit setup llama-server`
    (about 6-10 minutes the first time)."""
    done = quantkit("--json", "setup", "llama-server", cwd=tmp_path_factory.mktemp("setup"))
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(json.loads(done.stdout)["path"])


@pytest.fixture(scope="session")
def demo_gguf(workdir: Path, demo_gguf_run: subprocess.CompletedProcess) -> Path:
    """The demo GGUF artifact and its passing validation, in `workdir`: serve it from there as
    `artifacts/demo-gguf`, where `reports/` holds its validation."""
    assert demo_gguf_run.returncode == 0, demo_gguf_run.stderr[-3000:]
    return workdir / "artifacts" / "demo-gguf"
