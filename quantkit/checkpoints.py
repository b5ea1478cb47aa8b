"""The checkpoint formats, in one registry: what quantkit writes and serves (a compressed-tensors
folder, a GGUF file) and everything that differs between them, asked here instead of compared by
name elsewhere: how a path is recognized, the file an engine loads, the original a quantized model
is validated against, the context length, how the card names and tags it, what is published, and
the commands that serve it. Which engines load a format is the engine's to say
(`EngineSpec.checkpoints`); which format a method writes, the method's (`Method.checkpoint`).

A format from outside is one `Checkpoint` and one `register_checkpoint` call (or an entry point in
`quantkit.checkpoints`); a name that no entry claims is refused by name. Pure at import: each
function is imported only when asked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.errors import BadInput
from quantkit.registry import Registry, load

if TYPE_CHECKING:
    from quantkit.artifact import Manifest

Fn = str | Callable[..., Any]  # "module:function" or the function itself


@dataclass(frozen=True)
class Checkpoint:
    """One format. Functions are "module:function" strings (or callables):

    - `find(path, manifest)`: the file or folder an engine loads when `path` (an artifact folder,
      a file, an HF folder) holds this format, else None; `manifest` is the folder's quantkit.json
      where it has one (the manifest's `checkpoint` then decides, and `find` may refuse a folder
      that lacks its model file);
    - `baseline(model_dir, sha256)`: the original model as this format's engines compare it, and
      its identity ((path, sha256)); the original folder itself where None;
    - `context_length(path)`: the context the served model was trained for;
    - `scheme(manifest)`: the quantization's short name ("gptq W4A16 g32", "GGUF Q4_K_M");
    - `describe(manifest)`: the quantization with its format, for the card ("Q4_K_M GGUF");
    - `summary(manifest)` / `headline(manifest dict)`: what `quantkit quantize` says it wrote,
      and `quantkit inspect`'s artifact line;
    - `tags(manifest)`: the card's tags beside quantkit, the method and the format's name;
    - `publish_files(folder, manifest)`: repo path -> local file of what is published;
    - `serve_local(folder, manifest)` / `serve_hub(repo_id, manifest)`: the engine's own command
      that serves it, for the card.

    `label` names it in messages; `library` is the card's library_name; `serves_with` says in
    words what loads it (the card); `from_source` means the served file was converted from an HF
    folder, whose tokenizer clients load; `splits` that it can be split over GPUs (tensor or
    pipeline parallel); `kv_scales` that it can carry calibrated FP8 KV-cache scales (else the
    server sets its cache type); `weights_only` that its activations are never quantized."""

    name: str
    label: str
    library: str
    find: Fn
    context_length: Fn
    scheme: Fn
    describe: Fn
    summary: Fn
    headline: Fn
    tags: Fn
    publish_files: Fn
    serve_local: Fn
    serve_hub: Fn
    serves_with: str
    baseline: Fn | None = None
    from_source: bool = False
    splits: bool = False
    kv_scales: bool = False
    weights_only: bool = False


CHECKPOINTS: Registry[Checkpoint] = Registry("checkpoint format", "checkpoint",
                                             "quantkit.checkpoints")


def register_checkpoint(spec: Checkpoint) -> Checkpoint:
    """Add a format; from then on quantize, validate, serve, the card and publish know it."""
    return CHECKPOINTS.register(spec.name, spec)


def checkpoint(name: str) -> Checkpoint:
    """The registered format `name`; BadInput naming it where no entry claims it (a manifest
    written by a plugin that is not installed here)."""
    if name not in CHECKPOINTS:
        raise BadInput(f"checkpoint format {name!r} is not one quantkit knows (known: "
                       f"{', '.join(CHECKPOINTS.names())})",
                       "install the plugin that writes it, or re-quantize the model")
    return CHECKPOINTS.entries[name]


def call(spec: Checkpoint, what: str, *args: Any) -> Any:
    """Run one of the format's functions."""
    fn = getattr(spec, what)
    return load(fn)(*args) if isinstance(fn, str) else fn(*args)


def model_file(folder: Path, manifest: Manifest) -> Path:
    """What an engine loads for an artifact (its format's answer: a GGUF file, or the folder)."""
    return Path(call(checkpoint(manifest.checkpoint), "find", folder, manifest))


def resolve(path: Path, manifest: Manifest | None = None) -> tuple[str, Path] | None:
    """(format name, what an engine loads) for `path`, or None when no format claims it. A
    manifest's `checkpoint` decides for an artifact folder; otherwise the formats are asked in
    registration order."""
    if manifest is not None:
        return manifest.checkpoint, Path(call(checkpoint(manifest.checkpoint), "find", path,
                                              manifest))
    for name, spec in CHECKPOINTS.entries.items():
        found = call(spec, "find", path, None)
        if found is not None:
            return name, Path(found)
    return None


def format_of(path: Path) -> str:
    """The format of a model file or folder (an artifact, a .gguf, an HF folder), read from its
    manifest where it has one; a folder no format claims counts as an HF folder
    (compressed-tensors: an unquantized original loads the same way)."""
    from quantkit.artifact import MANIFEST, Manifest

    path = Path(path)
    manifest = Manifest.read(path) if (path / MANIFEST).is_file() else None
    found = resolve(path, manifest)  # an unregistered format in the manifest: refused by name
    return found[0] if found is not None else "compressed-tensors"


def label(name: str) -> str:
    """How messages name a format ("GGUF"); an unknown name as it is."""
    return CHECKPOINTS.entries[name].label if name in CHECKPOINTS else name


# -- compressed-tensors: an HF folder whose config.json carries the quantization ------------------

def ct_find(path: Path, manifest: Manifest | None) -> Path | None:
    if path.is_dir() and (manifest is not None or (path / "config.json").is_file()):
        return path
    return None


def ct_context_length(path: Path) -> int:
    import json

    from quantkit.models import text_config

    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return hf_context_length(text_config(config))


def hf_context_length(config: dict[str, Any]) -> int:
    """The context a model's (text) config allows, as vLLM derives it: max_position_embeddings,
    scaled by its rope scaling's factor (from YaRN's original length), except for the kinds
    whose max_position_embeddings already holds the scaled length (llama3, longrope, su)."""
    n = float(config.get("max_position_embeddings") or 4096)
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ("llama3", "longrope", "su"):
        if kind == "yarn" and rope.get("original_max_position_embeddings"):
            n = float(rope["original_max_position_embeddings"])
        n *= float(rope.get("factor") or 1.0)
    return int(n)


def ct_scheme(m: Manifest) -> str:
    from quantkit.artifact import scheme_name

    return scheme_name(m.method, m.parameters)


def ct_describe(m: Manifest) -> str:
    from quantkit.artifact import scheme_name

    return f"{scheme_name(m.method, m.parameters)} compressed-tensors"


def ct_summary(m: Manifest) -> str:
    from quantkit.artifact import scheme_name

    return scheme_name(m.method, m.parameters) + (
        f" with {len(m.sensitivity['upgraded'])} linear groups at W8" if m.sensitivity else "") + (
        f" ({m.linear_bits_per_weight} bpw in the linears, {m.bits_per_weight} over the whole "
        "model)" if m.linear_bits_per_weight else "")


def ct_headline(res: dict[str, Any]) -> str:
    from quantkit.artifact import scheme_name

    groups = (f", {len((res.get('sensitivity') or {}).get('upgraded') or [])} linear groups "
              "at 8 bits" if res.get("sensitivity") else "")
    return (f"{scheme_name(str(res.get('method')), res.get('parameters') or {})} "
            f"({res.get('checkpoint')}, {res.get('format')}){groups}")


def ct_tags(m: Manifest) -> list[str]:
    p = m.parameters
    bits = [f"{p['bits']}-bit"] if p.get("bits") else []
    bits += ["mixed-precision"] if m.sensitivity and m.sensitivity.get("upgraded") else []
    bits += ["fp8"] if p.get("act_fp8") or p.get("kv_fp8") else []
    return bits


def ct_publish_files(folder: Path, m: Manifest) -> dict[str, Path]:
    """Every file of the folder but hidden ones and its own README.md (the card replaces it)."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
            and p.relative_to(folder).as_posix() != "README.md"}


def ct_serve_local(folder: Path, m: Manifest) -> str:
    import shlex

    return f"vllm serve {shlex.quote(str(folder))}"


def ct_serve_hub(repo_id: str, m: Manifest) -> str:
    return f"vllm serve {repo_id}"


# -- GGUF: one llama.cpp file, converted from an HF folder -----------------------------------------

def gguf_find(path: Path, manifest: Manifest | None) -> Path | None:
    if not path.is_dir():  # a file (or a name not yet on disk) is one by its suffix
        return path if path.suffix == ".gguf" else None
    if manifest is not None:
        f = path / str(manifest.file)
        if not f.is_file():
            raise BadInput(f"artifact {path} lacks its GGUF file {manifest.file}",
                           "re-run `quantkit quantize --method gguf`")
        return f
    ggufs = sorted(p for p in path.glob("*.gguf") if "imatrix" not in p.name)
    return ggufs[0] if len(ggufs) == 1 else None


def gguf_baseline(model_dir: Path, sha256: str) -> tuple[Path, str]:
    """The F16 GGUF of the same conversion, on the same engine."""
    from quantkit.llamacpp_source import f16_gguf

    f16, _ = f16_gguf(model_dir, sha256)
    return f16, sha256 + ":f16"


def gguf_context_length(path: Path) -> int:
    from quantkit.gguf_header import read_header

    return int(read_header(Path(path)).scalar(".context_length") or 4096)


def gguf_scheme(m: Manifest) -> str:
    return f"GGUF {m.parameters.get('quant_type')}"


def gguf_describe(m: Manifest) -> str:
    return f"{m.parameters.get('quant_type')} GGUF"


def gguf_summary(m: Manifest) -> str:
    v, p = m.verification, m.parameters
    return (f"{p['quant_type']} ({m.bits_per_weight} bpw, {m.fallback_tensors} tensors fell "
            f"back), ppl {v.get('ppl_f16') if v else None} -> "
            f"{v.get('ppl_quantized') if v else None}")


def gguf_headline(res: dict[str, Any]) -> str:
    p = res.get("parameters") or {}
    return (f"gguf {p.get('quant_type')} ({res.get('file')}), {res.get('bits_per_weight')} "
            f"bits per weight, {res.get('fallback_tensors')} of {res.get('tensors')} tensors "
            "fell back")


def gguf_tags(m: Manifest) -> list[str]:
    p = m.parameters
    return [str(p.get("quant_type"))] + (["imatrix"] if p.get("imatrix") else [])


def gguf_publish_files(folder: Path, m: Manifest) -> dict[str, Path]:
    """The model file, its importance matrix where one was used, and the manifest."""
    names = [str(m.file), "quantkit.json"]
    if m.imatrix and m.parameters.get("imatrix"):
        names.append(str(m.imatrix.get("file") or "imatrix.gguf"))
    files = {n: folder / n for n in names}
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise BadInput(f"artifact {folder} lacks {', '.join(missing)}",
                       "re-run `quantkit quantize --method gguf`")
    return files


def gguf_serve_local(folder: Path, m: Manifest) -> str:
    import shlex

    return f"llama-server -m {shlex.quote(str(folder / str(m.file)))}"


def gguf_serve_hub(repo_id: str, m: Manifest) -> str:
    return f"llama-server --hf-repo {repo_id} --hf-file {m.file}"


_HERE = "quantkit.checkpoints"
register_checkpoint(Checkpoint(
    "compressed-tensors", "compressed-tensors", "transformers",
    find=f"{_HERE}:ct_find", context_length=f"{_HERE}:ct_context_length",
    scheme=f"{_HERE}:ct_scheme", describe=f"{_HERE}:ct_describe",
    summary=f"{_HERE}:ct_summary", headline=f"{_HERE}:ct_headline", tags=f"{_HERE}:ct_tags",
    publish_files=f"{_HERE}:ct_publish_files", serve_local=f"{_HERE}:ct_serve_local",
    serve_hub=f"{_HERE}:ct_serve_hub",
    serves_with="vLLM loads the compressed-tensors checkpoint on an NVIDIA GPU",
    splits=True, kv_scales=True))
register_checkpoint(Checkpoint(
    "gguf", "GGUF", "gguf",
    find=f"{_HERE}:gguf_find", baseline=f"{_HERE}:gguf_baseline",
    context_length=f"{_HERE}:gguf_context_length", scheme=f"{_HERE}:gguf_scheme",
    describe=f"{_HERE}:gguf_describe", summary=f"{_HERE}:gguf_summary",
    headline=f"{_HERE}:gguf_headline",
    tags=f"{_HERE}:gguf_tags", publish_files=f"{_HERE}:gguf_publish_files",
    serve_local=f"{_HERE}:gguf_serve_local", serve_hub=f"{_HERE}:gguf_serve_hub",
    serves_with="llama.cpp's `llama-server` (an OpenAI-compatible API) loads the GGUF file",
    from_source=True, weights_only=True))
