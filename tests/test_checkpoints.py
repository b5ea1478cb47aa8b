"""The checkpoint-format registry (quantkit.checkpoints): each format owns what differs between
formats, and a format registered from outside is either handled or refused by name by every
command; a manifest naming a format nobody registered is refused by name."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantkit.checkpoints import CHECKPOINTS, Checkpoint, format_of, register_checkpoint, resolve


def _toy_find(path: Path, manifest: Any) -> Path | None:
    if path.is_file():
        return path if path.suffix == ".toy" else None
    if manifest is not None:
        return path / str(manifest.file)
    return None


TOY = Checkpoint(
    "toy", "TOY", "toy-lib", find=_toy_find, context_length=lambda p: 77,
    scheme=lambda m: "toy 3-bit", describe=lambda m: "3-bit TOY", summary=lambda m: "toy 3-bit",
    headline=lambda res: f"toy 3-bit ({res.get('file')})", tags=lambda m: ["3-bit"],
    publish_files=lambda folder, m: {str(m.file): folder / str(m.file)},
    serve_local=lambda folder, m: f"toy-server {folder}", serve_hub=lambda r, m: f"toy-server {r}",
    serves_with="the toy server loads the .toy file")


@pytest.fixture
def toy_artifact(tiny_artifact: Path, tmp_path: Path) -> Iterator[Path]:
    """A quantkit artifact in the toy format (a manifest and its model file), the format
    registered for the test only."""
    art = tmp_path / "toy-art"
    art.mkdir()
    manifest = json.loads((tiny_artifact / "quantkit.json").read_text())
    manifest.update(checkpoint="toy", method="gptq", file="model.toy")
    (art / "quantkit.json").write_text(json.dumps(manifest))
    (art / "model.toy").write_bytes(b"TOY\0weights")
    register_checkpoint(TOY)
    try:
        yield art
    finally:
        CHECKPOINTS.unregister("toy")


def test_the_built_in_formats_are_found_by_their_files(tiny_artifact: Path, tiny_model: Path,
                                                       tmp_path: Path) -> None:
    assert CHECKPOINTS.names()[:2] == ("compressed-tensors", "gguf")
    assert format_of(tiny_artifact) == "compressed-tensors"
    assert format_of(tiny_model) == "compressed-tensors"  # an original HF folder loads alike
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve(gguf) == ("gguf", gguf)
    assert resolve(tmp_path / "nothing-here.bin") is None


def test_a_registered_format_is_handled_or_refused_by_name(toy_artifact: Path, tiny_model: Path,
                                                           cli: Any, tmp_path: Path) -> None:
    from quantkit.artifact import Manifest
    from quantkit.checkpoints import model_file
    from quantkit.serve.launcher import model_context
    from quantkit.serve.target import resolve_target

    assert format_of(toy_artifact) == "toy"
    assert model_file(toy_artifact, Manifest.read(toy_artifact)) == toy_artifact / "model.toy"
    target = resolve_target(toy_artifact)
    assert (target.format, target.path.name) == ("toy", "model.toy")
    assert model_context(target) == 77
    code, out, err = cli("inspect", str(toy_artifact))
    assert code == 0 and "artifact: toy 3-bit (model.toy)" in out, err
    # no engine runs it: validate and serve refuse it by its name, before any work
    code, _, err = cli("validate", str(toy_artifact), "--baseline", str(tiny_model), "--tasks",
                       "sampling", "--out", str(tmp_path / "r"))
    assert code == 2 and "no registered engine runs a TOY artifact" in err, err
    assert not (tmp_path / "r").exists()
    code, _, err = cli("serve", str(toy_artifact), "--allow-unvalidated")
    assert code == 2 and "TOY artifact" in err, err


def test_a_format_nobody_registered_is_refused_by_name(toy_artifact: Path, cli: Any,
                                                       tmp_path: Path) -> None:
    other = tmp_path / "mlx-art"
    shutil.copytree(toy_artifact, other)
    manifest = json.loads((other / "quantkit.json").read_text())
    (other / "quantkit.json").write_text(json.dumps({**manifest, "checkpoint": "mlx"}))
    for args in (["inspect", str(other)], ["serve", str(other), "--allow-unvalidated"]):
        code, _, err = cli(*args)
        assert code == 2, (args, err)
        assert "checkpoint format 'mlx' is not one quantkit knows (known: compressed-tensors, " \
            "gguf, toy)" in err
        assert err.count("error:") == 1 and "hint:" in err


def test_the_context_a_config_allows_is_vllms() -> None:
    """max_position_embeddings, times the rope scaling factor where vLLM multiplies it (YaRN from
    its original length), as is where the config already holds the scaled length (llama3)."""
    from quantkit.checkpoints import hf_context_length

    assert hf_context_length({"max_position_embeddings": 4096}) == 4096
    assert hf_context_length({}) == 4096
    assert hf_context_length({"max_position_embeddings": 2048, "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e4}}) == 2048
    assert hf_context_length({"max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}) == 131072
    assert hf_context_length({"max_position_embeddings": 32768, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}) == 131072
    assert hf_context_length({"max_position_embeddings": 4096, "rope_scaling": {
        "type": "linear", "factor": 2.0}}) == 8192
