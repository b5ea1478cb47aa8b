"""`quantkit publish`: --dry-run offline (files, sizes, the staged card; the artifact untouched),
what each format publishes, the gate's refusal, every bad input as one `error:` and one `hint:`
with exit 2 and nothing left behind, the Hub's HTTP errors (a local stand-in for the Hub answers
401/403: no request leaves this machine), a publish the stand-in accepts (what it received: one
commit of the artifact's files and the card), and the recipe's `publish:` section."""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from _cards import tiny_gguf, validate_tiny
from _serving import ROOT
from huggingface_hub import ModelCard

from quantkit.errors import EXIT_BAD_INPUT, EXIT_ENGINE, BadInput, EngineError
from quantkit.publish import hub_error


@pytest.fixture(scope="module")
def validated(tiny_artifact: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("publish")
    return {**validate_tiny(tiny_artifact, tiny_model, work), "artifact": tiny_artifact}


@pytest.fixture
def staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where publish stages its copy in this test (checked for leftovers)."""
    folder = tmp_path / "staging"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing in these tests may reach the network
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return folder


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def test_dry_run_lists_the_files_offline_and_touches_nothing(cli, validated, staging):
    art = validated["artifact"]
    before = snapshot(art)
    code, stdout, err = cli("--json", "publish", str(art), "me/tiny-gptq", "--results",
                            str(validated["pass"]), "--dry-run")
    assert code == 0, err
    res = json.loads(stdout)
    files = {f["path"]: f["bytes"] for f in res["files"]}
    own = {p.relative_to(art).as_posix(): p.stat().st_size for p in art.rglob("*") if p.is_file()}
    # every file, its size (the manifest's local paths are reduced to their last component)
    assert set(own) <= set(files) and files["quantkit.json"] <= own["quantkit.json"]
    assert {k: v for k, v in files.items() if k in own and k != "quantkit.json"} == {
        k: v for k, v in own.items() if k != "quantkit.json"}
    assert set(files) - set(own) == {"README.md", "validation/results.json"}
    assert res["total_bytes"] == sum(files.values()) and res["repo"] == "me/tiny-gptq"
    assert res["commit_message"] == "quantkit: gptq W4A16 g32, gate PASS"
    card = ModelCard.load(res["card"])  # the staged card, kept for reading
    assert files["README.md"] == Path(res["card"]).stat().st_size
    assert card.data.model_name == "me/tiny-gptq" and "vllm serve me/tiny-gptq" in card.text
    assert snapshot(art) == before  # the artifact folder is never written
    assert [p.name for p in staging.iterdir()] == [Path(res["staged"]).name]
    code, stdout, _ = cli("publish", str(art), "me/tiny-gptq", "--results",
                          str(validated["pass"]), "--dry-run")
    assert code == 0 and stdout.startswith("dry run: nothing uploaded; would commit to "
                                           "me/tiny-gptq (branch main): quantkit: gptq")
    assert "model-rest.safetensors" in stdout and "KiB" in stdout and "card: " in stdout


def test_what_is_staged_names_nothing_of_the_users_machine(cli, tiny_model, corpus, staging,
                                                            tmp_path, monkeypatch):
    """A user whose folders carry their name (model, data, artifact, report and quantkit's cache
    under it): no staged file, the card included, names that folder; hub-style names stay; the
    local copies keep their full paths."""
    import shutil

    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig, QuantizeConfig
    from quantkit.quantize import quantize

    home = tmp_path / "alice-private-7f3"
    monkeypatch.setenv("QUANTKIT_HOME", str(home / "cache"))
    shutil.copytree(tiny_model, home / "models" / "tiny")
    (home / "data").mkdir(parents=True)
    shutil.copy(corpus["prose"], home / "data" / "prose.md")
    calibrate(model=str(home / "models" / "tiny"), out=home / "calib", cfg=CalibrateConfig(
        sources=(f"{home / 'data' / 'prose.md'}@1.0",), samples=8, min_tokens=64,
        max_tokens=64))
    art = home / "artifacts" / "tiny-w4"
    quantize(model=str(home / "models" / "tiny"), cfg=QuantizeConfig(method="gptq", group_size=32),
             calib=home / "calib", out=art)
    reports = validate_tiny(art, home / "models" / "tiny", home)
    assert "alice-private-7f3" in (reports["pass"] / "results.json").read_text()
    code, stdout, err = cli("--json", "publish", str(art), "me/tiny-gptq", "--results",
                            str(reports["pass"]), "--dry-run")
    assert code == 0, err
    staged = Path(json.loads(stdout)["staged"])
    names = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert {"README.md", "quantkit.json", "validation/results.json"} <= set(names)
    for name in names:
        assert b"alice-private-7f3" not in (staged / name).read_bytes(), name
    manifest = json.loads((staged / "quantkit.json").read_text())
    assert manifest["calibration"]["path"] == "calib"  # the last component
    assert "alice-private-7f3" in (art / "quantkit.json").read_text()  # the local copy keeps it


def test_a_download_of_the_repo_is_served_by_quantkit_as_the_card_says(cli, validated, staging,
                                                                       tmp_path):
    """The card's `hf download OWNER/NAME --local-dir NAME && quantkit serve NAME --reports NAME`:
    the repo's files (the staged copy, links followed) hold the validation serve looks up."""
    import shutil

    from quantkit.serve.target import find_validation, resolve_target

    code, stdout, err = cli("--json", "publish", str(validated["artifact"]), "me/tiny-gptq",
                            "--results", str(validated["pass"]), "--dry-run")
    assert code == 0, err
    res = json.loads(stdout)
    assert "quantkit serve tiny-gptq --reports tiny-gptq" in Path(res["card"]).read_text()
    download = tmp_path / "tiny-gptq"
    shutil.copytree(res["staged"], download, symlinks=False)
    found = find_validation(resolve_target(download), download)
    assert found["verdict"] == "pass" and found["results"].endswith("validation/results.json")


def test_a_gguf_publishes_its_gguf_files_and_card(cli, validated, staging, tmp_path):
    g = tiny_gguf(tmp_path / "g", validated["pass"])
    code, stdout, err = cli("--json", "publish", str(g["artifact"]), "me/tiny-gguf", "--results",
                            str(g["results"]), "--dry-run", "--private", "--revision", "q4")
    assert code == 0, err
    res = json.loads(stdout)
    assert [f["path"] for f in res["files"]] == [
        "README.md", "model-Q4_K_M.gguf", "quantkit.json", "imatrix.gguf",
        "validation/results.json"]  # not the folder's stray file
    assert res["private"] is True and res["revision"] == "q4"
    card = ModelCard.load(res["card"])
    assert card.data.library_name == "gguf"
    assert "llama-server --hf-repo me/tiny-gguf --hf-file model-Q4_K_M.gguf" in card.text


def test_a_failed_gate_is_refused_unless_allowed(cli, validated, staging):
    args = ["publish", str(validated["artifact"]), "me/tiny", "--results",
            str(validated["fail"]), "--dry-run"]
    code, _, err = cli(*args)
    assert code == EXIT_BAD_INPUT and "failed its gate on domain.kld" in err
    assert "--allow-failed" in err.split("hint:")[1] and not list(staging.iterdir())
    code, stdout, err = cli("--json", *args, "--allow-failed")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["commit_message"].endswith("gate FAIL (failing: domain.kld)")
    assert "**This quantization FAILED its validation gate**" in ModelCard.load(res["card"]).text


def test_bad_input_is_one_error_and_one_hint(cli, validated, staging, tmp_path):
    art, ok = str(validated["artifact"]), str(validated["pass"])
    g = tiny_gguf(tmp_path / "g", validated["pass"])
    cases = {
        "malformed repo id": ([art, "a/b/c", "--results", ok], "is malformed"),
        "repo id with ..": ([art, "me/bad..name", "--results", ok], "is malformed"),
        "no owner": ([art, "tiny", "--results", ok], "names no owner"),
        "not an artifact": ([ok, "me/x", "--results", ok], "is not a quantkit artifact"),
        "missing artifact": ([str(tmp_path / "nope"), "me/x"], "does not exist"),
        "another artifact's results": ([art, "me/x", "--results", str(g["results"])],
                                       "is the validation of another artifact"),
        "no validation": ([art, "me/x", "--reports", str(tmp_path / "empty")],
                          "no validation of"),
        "empty branch": ([art, "me/x", "--results", ok, "--revision", " "], "--revision is empty"),
    }
    for name, (args, words) in cases.items():
        code, _, err = cli("publish", *args, "--dry-run")
        assert code == EXIT_BAD_INPUT, (name, err)
        lines = [ln.split(":")[0] for ln in err.splitlines() if ln.startswith(("error:", "hint:"))]
        assert lines == ["error", "hint"] and words in err, (name, err)
        assert not list(staging.iterdir()), name  # nothing staged, nothing half-written


def _quantkit(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """quantkit in a process of its own, so huggingface_hub reads this environment at import."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    clean.update(PYTHONPATH=str(ROOT), HF_HOME=str(cwd / "hf-home"), TMPDIR=str(cwd / "tmp"),
                 **env)
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "quantkit", *args], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=300)


def test_no_token_or_the_hub_switched_off_is_bad_input(validated, tmp_path):
    args = ["publish", str(validated["artifact"]), "me/tiny", "--results", str(validated["pass"])]
    done = _quantkit(*args, env={}, cwd=tmp_path)  # no HF_TOKEN, an empty HF_HOME
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "error: no Hugging Face token" in done.stderr and "hf auth login" in done.stderr
    done = _quantkit(*args, env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_x"}, cwd=tmp_path)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "HF_HUB_OFFLINE" in done.stderr and "--dry-run" in done.stderr.split("hint:")[1]
    assert not list((tmp_path / "tmp").iterdir())


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A stand-in for the Hub on 127.0.0.1 that refuses every request with `status`."""

    status = 403
    seen: list[str] = []

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append(f"{self.command} {self.path}")
        message = 'You don\'t have the rights to create a model under the namespace "acme"'
        body = json.dumps({"error": message}).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("X-Error-Message", message)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def refusing_hub() -> Iterator[tuple[str, type[_Refusing]]]:
    handler = type("Handler", (_Refusing,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status,words,hint", [
    (403, "this token cannot write to acme/tiny (403 Forbidden): You don't have the rights",
     "write access to 'acme'"),
    (401, "the Hub refused the token (401 Unauthorized)", "hf auth login")])
def test_a_repo_the_token_cannot_write_is_bad_input(validated, tmp_path, refusing_hub, status,
                                                     words, hint):
    url, handler = refusing_hub
    handler.status = status
    done = _quantkit("publish", str(validated["artifact"]), "acme/tiny", "--results",
                     str(validated["pass"]), env={"HF_ENDPOINT": url, "HF_TOKEN": "hf_fake"},
                     cwd=tmp_path)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert f"error: {words}" in done.stderr and hint in done.stderr.split("hint:")[1]
    assert any("/api/repos/create" in s for s in handler.seen)
    assert not any("/commit/" in s for s in handler.seen)  # nothing was committed
    assert not list((tmp_path / "tmp").iterdir())  # the staged copy is gone


class _Accepting(http.server.BaseHTTPRequestHandler):
    """A stand-in for the Hub on 127.0.0.1 that accepts what huggingface_hub asks of it for
    `quantkit publish`: the repo's creation, a branch, the card's YAML check, the preupload (every
    file a regular git blob: no LFS, no Xet) and the commit (NDJSON, the files in base64). It
    keeps what it was sent; any other request is answered 404 and kept in `refused`."""

    created: list[dict[str, Any]] = []
    branches: list[str] = []
    commits: list[dict[str, Any]] = []  # the header's summary and description, revision, files
    refused: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path, url = urlsplit(self.path).path, f"http://{self.headers['host']}"
        hit = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(branch|preupload|commit)/([^/]+)", path)
        if path == "/api/repos/create":
            self.created.append(json.loads(body))
            self._json({"url": f"{url}/{self.created[-1]['organization']}/"
                               f"{self.created[-1]['name']}"})
        elif path == "/api/validate-yaml":
            self._json({"errors": [], "warnings": []})
        elif hit and hit[2] == "branch":
            self.branches.append(unquote(hit[3]))
            self._json({})
        elif hit and hit[2] == "preupload":
            self._json({"files": [{"path": f["path"], "uploadMode": "regular",
                                   "shouldIgnore": False, "oid": None}
                                  for f in json.loads(body)["files"]]})
        elif hit and hit[2] == "commit":
            lines = [json.loads(line) for line in body.splitlines()]
            self.commits.append({**lines[0]["value"], "revision": unquote(hit[3]),
                                 "keys": [line["key"] for line in lines],
                                 "files": {line["value"]["path"]: base64.b64decode(
                                     line["value"]["content"]) for line in lines
                                     if line["key"] == "file"}})
            oid = f"{len(self.commits):040x}"
            self._json({"commitUrl": f"{url}/{hit[1]}/commit/{oid}", "commitOid": oid})
        else:
            self.refused.append(f"{self.command} {self.path}")
            self._json({"error": f"the stand-in has no {path}"}, 404)

    do_GET = do_PUT = do_DELETE = do_POST

    def _json(self, value: Any, status: int = 200) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def accepting_hub() -> Iterator[tuple[str, type[_Accepting]]]:
    handler = type("Handler", (_Accepting,), {"created": [], "branches": [], "commits": [],
                                              "refused": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_a_publish_the_hub_accepts_is_one_commit_of_the_artifact_and_its_card(
        validated, tmp_path, accepting_hub):
    url, hub = accepting_hub
    done = _quantkit("publish", str(validated["artifact"]), "acme/tiny", "--results",
                     str(validated["pass"]), "--private", "--revision", "w4-g32",
                     env={"HF_ENDPOINT": url, "HF_TOKEN": "hf_fake",
                          "HF_HUB_DISABLE_TELEMETRY": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not hub.refused  # every request the client made was one the stand-in accepts
    [created] = hub.created  # --private reaches the create request (either spelling)
    assert (created["organization"], created["name"]) == ("acme", "tiny")
    assert created.get("visibility") == "private" or created.get("private") is True
    assert hub.branches == ["w4-g32"]  # the branch is created, then committed to
    [commit] = hub.commits
    assert commit["revision"] == "w4-g32"
    assert commit["summary"] == "quantkit: gptq W4A16 g32, gate PASS"
    assert ": pass" in commit["description"] and "artifact sha256 " in commit["description"]
    assert set(commit["keys"]) == {"header", "file"}  # regular files only, nothing deleted
    files, own = commit["files"], _files(validated["artifact"])
    from quantkit.public import scrub_text

    # every file, byte for byte; the text files with local paths, those reduced to their last
    # component (the manifest's calibration set, results.json's model folders)
    public = {k: scrub_text(v.decode()).encode() if k.endswith(".json") else v
              for k, v in own.items()}
    assert {k: v for k, v in files.items() if k in own} == public
    assert set(files) - set(own) == {"README.md", "validation/results.json"}
    results = json.loads((validated["pass"] / "results.json").read_bytes())
    assert files["validation/results.json"] == scrub_text(
        (validated["pass"] / "results.json").read_text()).encode()
    (tmp_path / "README.md").write_bytes(files["README.md"])
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.model_name == "acme/tiny"
    got = {(r.dataset_type, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert got == {(c["task"], c["metric"]): c["value"] for c in results["gate"]["checks"]}
    assert not list((tmp_path / "tmp").iterdir())  # the staged copy is gone


def test_a_publish_the_hub_accepts_prints_the_commit_and_its_url(validated, tmp_path,
                                                                   accepting_hub):
    url, hub = accepting_hub
    args = ["publish", str(validated["artifact"]), "acme/tiny", "--results",
            str(validated["pass"])]
    env = {"HF_ENDPOINT": url, "HF_TOKEN": "hf_fake", "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = _quantkit(*args, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "committed to acme/tiny (branch main): quantkit: gptq W4A16 g32, gate PASS"
    assert lines[-1] == f"url: {url}/acme/tiny/commit/{1:040x}"
    assert "README.md" in done.stdout and "validation/results.json" in done.stdout
    done = _quantkit("--json", *args, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    assert res["url"] == f"{url}/acme/tiny/commit/{2:040x}" and res["url"].startswith(
        f"{url}/acme/tiny/")  # the repo's page, then the commit
    assert (res["repo"], res["revision"], res["private"], res["dry_run"]) == (
        "acme/tiny", "main", False, False)
    assert sorted(f["path"] for f in res["files"]) == sorted(hub.commits[-1]["files"])
    assert [c["revision"] for c in hub.commits] == ["main", "main"] and not hub.branches
    assert not hub.refused
    assert all("visibility" not in c and "private" not in c for c in hub.created)  # the default
    assert not list((tmp_path / "tmp").iterdir())


def _http_error(status: int, **headers: str) -> Exception:
    """The error huggingface_hub itself raises for a response with this status."""
    from huggingface_hub.utils import hf_raise_for_status

    httpx = pytest.importorskip("httpx2") if _has("httpx2") else pytest.importorskip("httpx")
    url = "https://huggingface.co/api/models/acme/tiny/commit/main"
    response = httpx.Response(status, request=httpx.Request("POST", url), headers=headers)
    with pytest.raises(Exception) as caught:
        hf_raise_for_status(response)
    return caught.value


def _has(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def test_hub_errors_map_to_the_error_table():
    from huggingface_hub.utils import HfHubHTTPError, RepositoryNotFoundError

    forbidden = _http_error(403, **{"X-Error-Message": "no write access"})
    assert isinstance(forbidden, HfHubHTTPError)
    err = hub_error(forbidden, "acme/tiny")
    assert isinstance(err, BadInput) and err.exit_code == EXIT_BAD_INPUT
    assert err.message == "this token cannot write to acme/tiny (403 Forbidden): no write access"
    missing = _http_error(404, **{"X-Error-Code": "RepoNotFound"})
    assert isinstance(missing, RepositoryNotFoundError)
    err = hub_error(missing, "acme/tiny")
    assert isinstance(err, BadInput) and "does not exist or this token cannot see it" in err.message
    err = hub_error(_http_error(404, **{"X-Error-Code": "RevisionNotFound"}), "acme/tiny", "q4")
    assert isinstance(err, BadInput) and "branch 'q4'" in err.message
    assert "hf auth login" in hub_error(_http_error(401), "acme/tiny").hint  # type: ignore[union-attr]
    err = hub_error(_http_error(500), "acme/tiny")
    assert isinstance(err, EngineError) and err.exit_code == EXIT_ENGINE
    httpx = pytest.importorskip("httpx2") if _has("httpx2") else pytest.importorskip("httpx")
    err = hub_error(httpx.ConnectError("connection refused"), "acme/tiny")
    assert isinstance(err, EngineError) and "could not be reached" in err.message
    assert hub_error(ValueError("ours"), "acme/tiny") is None  # not the Hub's: passed on


def test_recipe_publish_section(tmp_path, tiny_model, corpus):
    import yaml

    from quantkit.config import load_recipe

    base = {"version": 1, "name": "t", "model": str(tiny_model),
            "calibration": {"sources": [str(corpus["prose"])]}, "quantize": {"method": "gptq"},
            "outputs": {"calib": str(tmp_path / "c"), "artifact": str(tmp_path / "a"),
                        "report": str(tmp_path / "r")}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**base, "publish": {"repo": "me/tiny", "private": True}}))
    r = load_recipe(path)
    assert r.publish is not None and (r.publish.repo, r.publish.private) == ("me/tiny", True)
    path.write_text(yaml.safe_dump(base))
    assert load_recipe(path).publish is None
    for section, words in (({"repo": "me/tiny", "privat": True}, "unknown key 'privat'"),
                           ({"repo": "a/b/c"}, "is malformed"), ({"private": True}, "no repo id"),
                           ({"repo": "me/x", "private": "yes"}, "is not true/false")):
        path.write_text(yaml.safe_dump({**base, "publish": section}))
        with pytest.raises(BadInput, match=words):
            load_recipe(path)


def test_run_checks_the_token_before_any_step_and_skips_a_failed_gate(tmp_path, tiny_model,
                                                                      corpus):
    import yaml

    from quantkit.config import load_recipe
    from quantkit.run import _publish

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "t", "model": str(tiny_model),
        "calibration": {"sources": [str(corpus["prose"])]}, "quantize": {"method": "gptq"},
        "outputs": {"calib": "c", "artifact": "a", "report": "r"},
        "publish": {"repo": "me/tiny"}}))
    done = _quantkit("run", str(recipe), env={}, cwd=tmp_path)
    assert done.returncode == EXIT_BAD_INPUT and "no Hugging Face token" in done.stderr
    assert not any((tmp_path / d).exists() for d in ("c", "a", "r"))  # no step ran
    assert _publish(load_recipe(recipe), "fail") is None  # the gate failed: nothing published
