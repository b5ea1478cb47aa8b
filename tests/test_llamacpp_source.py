"""Where llama.cpp's converter comes from: the llama-cpp-python sdist, fetched from the package
index's JSON API (its sha256 checked), else through `pip download`. A real index on 127.0.0.1
serves a small sdist of a version no real index holds."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading
from collections.abc import Iterator

import pytest

from quantkit.llamacpp_source import download_sdist

VERSION = "0.0.1"
NAME = f"llama_cpp_python-{VERSION}.tar.gz"


def _sdist() -> bytes:
    """A minimal sdist that setuptools can prepare metadata for (pip download does), with a
    vendored converter where the real one sits."""
    files = {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
                          'build-backend = "setuptools.build_meta"\n'
                          f'[project]\nname = "llama-cpp-python"\nversion = "{VERSION}"\n',
        "vendor/llama.cpp/convert_hf_to_gguf.py": "print('converter')\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """A package index on 127.0.0.1 ($PIP_INDEX_URL, pip's configuration files and find-links
    off): `state["json"]` says whether it answers PEP 691 JSON or only PEP 503 HTML,
    `state["sha256"]` is the hash it lists, `state["hits"]` counts file downloads."""
    body = _sdist()
    state = {"json": True, "sha256": hashlib.sha256(body).hexdigest(), "hits": 0, "body": body}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/simple/llama-cpp-python/":
                url = f"/files/{NAME}"
                if state["json"]:
                    page = json.dumps({"meta": {"api-version": "1.0"}, "name": "llama-cpp-python",
                                       "files": [{"filename": NAME, "url": url,
                                                  "hashes": {"sha256": state["sha256"]}}]})
                    kind = "application/vnd.pypi.simple.v1+json"
                else:
                    page = (f'<html><body><a href="{url}#sha256={state["sha256"]}">{NAME}</a>'
                            "</body></html>")
                    kind = "text/html"
                self._send(page.encode(), kind)
            elif self.path == f"/files/{NAME}":
                state["hits"] += 1
                self._send(state["body"], "application/octet-stream")
            else:
                self.send_error(404)

        def _send(self, data: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no mirrors beside the test's index
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # metadata from this env's setuptools
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_the_sdist_comes_from_the_index_json_api_with_its_hash_checked(index, tmp_path):
    got = download_sdist(tmp_path, VERSION)
    assert got == tmp_path / NAME and got.read_bytes() == index["body"]
    assert index["hits"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == [NAME]


def test_a_hash_mismatch_is_never_kept_and_pip_decides(index, tmp_path):
    """The JSON API's file does not match its listed hash: it is dropped, and `pip download`
    (which checks the same hash from the HTML page) refuses too: exit 3's EngineError, nothing
    kept."""
    from quantkit.errors import EngineError

    index["sha256"] = "0" * 64
    with pytest.raises(EngineError, match="could not download the llama-cpp-python"):
        download_sdist(tmp_path, VERSION)
    assert index["hits"] >= 1 and list(tmp_path.iterdir()) == []


def test_an_index_without_the_json_api_falls_back_to_pip(index, tmp_path):
    """A PEP 503 (HTML only) index, as some mirrors are: pip download fetches the sdist."""
    index["json"] = False
    got = download_sdist(tmp_path, VERSION)
    assert got.name == NAME and got.read_bytes() == index["body"]
