"""What is served: the file the engine loads, its sha256, and the validation that lets it be served."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from quantkit.artifact import MANIFEST, Manifest, identity_sha256
from quantkit.errors import BadInput
from quantkit.results import Results


@dataclass(frozen=True)
class Target:
    """An artifact resolved for serving."""

    artifact: Path          # what the user named
    path: Path              # what the engine loads: a .gguf file or an HF folder
    format: str             # its checkpoint format (quantkit.checkpoints): gguf, compressed-tensors
    name: str               # the model id clients use
    manifest: Manifest | None = None

    @property
    def size_bytes(self) -> int:
        from quantkit.artifact import folder_size

        return self.path.stat().st_size if self.path.is_file() else folder_size(self.path)

    @property
    def root(self) -> str:
        """Where a client loads this model's tokenizer from (the `root` of vLLM's model card):
        the HF folder served; for a GGUF, the HF folder it was quantized from while that is on
        disk, else the file."""
        from quantkit.checkpoints import checkpoint

        if checkpoint(self.format).from_source and self.manifest is not None:
            source = Path(self.manifest.source.path)
            if (source / "config.json").is_file():
                return str(source.resolve())
        return str(self.path.resolve())

    @cached_property
    def hf_config(self) -> dict[str, Any]:
        """The HF folder's config.json (read once), or a BadInput naming the folder."""
        import json

        try:
            cfg = json.loads((self.path / "config.json").read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            raise BadInput(f"{self.path} is not a readable HF model: {type(exc).__name__}: "
                           f"{str(exc)[:120]}",
                           "re-run `quantkit quantize`, or pass the right folder") from None
        if not isinstance(cfg, dict):
            raise BadInput(f"{self.path}/config.json is not a JSON object",
                           "re-run `quantkit quantize`, or pass the right folder")
        return cfg

    def sha256(self) -> str:
        """The sha256 that `quantkit validate` records for this artifact."""
        return identity_sha256(self.path)


def resolve_target(artifact: Path) -> Target:
    """A quantkit artifact folder, a .gguf file, or an HF checkpoint folder; a GGUF is checked to
    be one before an engine is given it."""
    target = _resolve(artifact)
    if target.path.suffix == ".gguf":  # llama.cpp's own file: its header is checked here
        from quantkit.models import check_gguf

        check_gguf(target.path)
    return target


def _resolve(artifact: Path) -> Target:
    if not artifact.exists():
        raise BadInput(f"artifact {artifact} does not exist", "pass a quantkit quantize output folder")
    from quantkit.checkpoints import CHECKPOINTS, resolve

    manifest = Manifest.read(artifact) if artifact.is_dir() and (artifact / MANIFEST).is_file() \
        else None
    found = resolve(artifact, manifest)
    if found is None:
        if artifact.is_file():
            raise BadInput(f"{artifact} is a file but not a .gguf (nor the file of another "
                           f"checkpoint format: {', '.join(CHECKPOINTS.names())})",
                           "pass a .gguf file or a folder")
        raise BadInput(f"{artifact} holds neither a config.json nor a single .gguf model (nor "
                       f"another checkpoint format's: {', '.join(CHECKPOINTS.names())})",
                       "pass a quantkit quantize output folder")
    name = artifact.stem if artifact.is_file() else artifact.resolve().name
    return Target(artifact, found[1], found[0], name, manifest)


def find_validation(target: Target, reports: Path) -> dict[str, Any]:
    """The newest results.json under `reports` that names this artifact's sha256, and its verdict."""
    sha = target.sha256()
    found = []
    for f in sorted(reports.glob("*/results.json")):
        try:
            r = Results.read(f.parent)
        except BadInput:  # another quantkit version's or a damaged file: not a validation of ours
            continue
        if r.artifact.sha256 == sha:
            found.append((r.created, f.stat().st_mtime, f, r))
    if not found:
        raise BadInput(f"no validation of {target.artifact} (sha256 {sha[:12]}) in {reports}/*/results.json",
                       f"run `quantkit validate {target.artifact} --out {reports}/NAME`, "
                       "or pass --allow-unvalidated")
    _, _, path, r = max(found, key=lambda t: (t[0], t[1]))
    verdict = r.verdict
    if verdict == "fail":
        failing = ", ".join(r.decision.failing) or "a threshold"
        raise BadInput(f"the latest validation of {target.artifact} ({path}) failed on {failing}",
                       "fix the quantization and re-validate, or pass --allow-unvalidated")
    return {"results": str(path), "verdict": verdict, "sha256": sha, "created": r.created}
