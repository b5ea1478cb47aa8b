"""Artifacts describe themselves: `quantkit.json` is a `Manifest` (provenance, parameters, hashes,
versions, timings), written by every quantizer and read by validate, serve and inspect as data."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from quantkit import __version__
from quantkit.errors import BadInput
from quantkit.fsutil import VersionedFile

if TYPE_CHECKING:
    from quantkit.models import ModelIdentity, ModelInfo

MANIFEST = "quantkit.json"
# 2: the GGUF source hash is the weights' sha256 (1 held the F16 cache folder's name)
SCHEMA_VERSION = 2


def identity_sha256(path: Path) -> str:
    """The sha256 that names a model as validate records it and serve looks it up: a GGUF file's
    bytes (weights, config and tokenizer are in it), or a folder's weights, config and tokenizer
    (models.model_sha256)."""
    from quantkit.fsutil import sha256_file
    from quantkit.models import model_sha256

    return sha256_file(path) if path.is_file() else model_sha256(path)


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the engines an artifact depends on."""
    found = {"quantkit": __version__}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


class Calibration(TypedDict):
    """The manifest's calibration set: its file, sha256, samples (and tokens a sample)."""

    path: str
    samples_sha256: str
    samples: int
    tokens: NotRequired[int]


class SensitivityRun(TypedDict):
    """KL per linear group with its provenance, as $QUANTKIT_HOME/sensitivity caches it."""

    source_sha256: str
    calib_sha256: str
    bits: int
    group_size: int
    sym: bool
    tokens: int
    dtype: str
    measure: str
    kld: dict[str, float]
    seconds: float


class Sensitivity(SensitivityRun):
    """--w8-groups: the measure (quantize.sensitivity.cached_sensitivity), whether it came from
    the cache, the groups upgraded and their bits (chosen there too)."""

    cached: bool
    upgraded: NotRequired[list[str]]
    upgrade_bits: NotRequired[int]


class AwqFold(TypedDict):
    into: str | None
    linears: list[str]
    offset: NotRequired[float]


class ExpertsStructure(TypedDict):
    """A mixture-of-experts block as read (quantize.families.Experts.describe)."""

    module: str
    experts: int
    top_k: int
    matrices: list[str]
    routers: list[str]


class Structure(TypedDict):
    """The decoder layer as read (quantize.families.Family.describe): where the layers are, the
    groups in order, AWQ's folds, the experts."""

    layers: str
    groups: list[list[str]]
    awq_folds: list[AwqFold]
    experts: NotRequired[ExpertsStructure]


class LayerCoverage(TypedDict):
    """One mixture-of-experts layer's calibration tokens per expert (quantize.experts.Coverage):
    min, median and max over its experts, the experts under the floor, each expert's count."""

    min: int
    median: float
    max: int
    under_floor: list[int]
    tokens: list[int]


class ExpertCoverage(TypedDict):
    """Tokens routed per expert (quantize.experts.expert_coverage): the floor, min and median
    over all layers, the experts under the floor (per layer), each layer's coverage."""

    floor: int
    min: int
    median: float
    under_floor: int
    experts: int
    under_floor_by_layer: dict[str, list[int]]
    layers: dict[str, LayerCoverage]  # per layer index, as the work folder's state holds it


class BaselineF16(TypedDict):
    path: str
    size_bytes: int


class ImatrixInfo(TypedDict):
    """The importance matrix of a GGUF quantization (quantize.gguf._imatrix)."""

    file: str
    entries: int
    tokens: int
    chunk_size: int
    chunks: int
    forward_dtype: str
    from_hessians: NotRequired[str]
    sha256: str


class Verification(TypedDict):
    """A GGUF's check (quantize.gguf._verify): the prompt and its answer, the held-out text, the
    perplexity of the F16 and the quantized file on it."""

    prompt: str
    heldout: str
    ppl_f16: NotRequired[float]
    answer: NotRequired[str]
    ppl_quantized: NotRequired[float]
    heldout_tokens: NotRequired[int]


@dataclass(frozen=True)
class Source:
    """The model an artifact was made from."""

    spec: str                 # what the user passed (alias, folder, hub id, .gguf)
    path: str                 # the resolved Hugging Face folder
    weights_sha256: str       # models.weights_sha256 of that folder
    architecture: str
    parameters: int
    # models.model_identity of that folder: its sha256 and its parts' (None in manifests written
    # before quantkit named a model by its weights, config and tokenizer)
    model_sha256: str | None = None
    model_parts: dict[str, str] | None = None

    @classmethod
    def of(cls, spec: str, path: Path, identity: ModelIdentity, info: ModelInfo) -> Source:
        """The source `spec`, resolved to the folder `path` with this identity and these facts."""
        return cls(spec=spec, path=str(path), weights_sha256=identity.weights,
                   architecture=info.architecture, parameters=info.parameters,
                   model_sha256=identity.sha256, model_parts=identity.parts())

    def mismatch(self, identity: ModelIdentity) -> str | None:
        """None when `identity` is this source's; else which parts differ, with the two sha256s
        ("different config: model sha256 ... vs the manifest's ..."). A manifest written before
        model identities has the weights' sha256 alone: only the weights are compared."""
        if self.model_sha256 is None:
            if identity.weights == self.weights_sha256:
                return None
            return (f"different weights: weights sha256 {identity.weights[:12]} vs the "
                    f"manifest's {self.weights_sha256[:12]}")
        if identity.sha256 == self.model_sha256:
            return None
        known = self.model_parts or {"weights": self.weights_sha256}
        parts = [k for k, v in identity.parts().items() if known.get(k, v) != v]
        return (f"different {' and '.join(parts) or 'config or tokenizer'}: model sha256 "
                f"{identity.sha256[:12]} vs the manifest's {self.model_sha256[:12]}")


@dataclass(frozen=True)
class Manifest(VersionedFile):
    """`quantkit.json`. Common fields first; the rest belong to one checkpoint kind."""

    checkpoint: str                        # compressed-tensors | gguf
    method: str                            # gptq | awq | gguf
    source: Source
    calibration: Calibration
    parameters: dict[str, Any]             # every quantization setting
    versions: dict[str, str]
    wall_time_s: float
    size_bytes: dict[str, int]             # before, after
    schema_version: int = SCHEMA_VERSION
    bits_per_weight: float | None = None   # whole model: every tensor's bytes x 8 / parameters
    # compressed-tensors
    format: str | None = None              # pack-quantized
    layer_errors: dict[str, dict[str, float]] = field(default_factory=dict)
    peak_memory: dict[str, float] = field(default_factory=dict)
    sensitivity: Sensitivity | None = None  # --w8-groups: KL per linear group, the upgraded
    linear_bits_per_weight: float | None = None  # the quantized linears alone
    structure: Structure | None = None  # the decoder layer as read: groups, AWQ's folds
    experts: ExpertCoverage | None = None  # mixture-of-experts: tokens routed per expert, floor
    # gguf
    file: str | None = None                # the quantized model file in the folder
    baseline_f16: BaselineF16 | None = None
    imatrix: ImatrixInfo | None = None
    tensor_types: dict[str, int] | None = None
    tensors: int | None = None
    fallback_tensors: int | None = None
    verification: Verification | None = None
    timings: dict[str, float] = field(default_factory=dict)

    FILE, KIND, VERSION, HINT = MANIFEST, "manifest", SCHEMA_VERSION, "re-run `quantkit quantize`"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, without the fields of the other checkpoint kind."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def missing(cls, folder: Path) -> tuple[str, str]:
        return (f"{folder} is not a quantkit artifact (no {MANIFEST})",
                "make one with `quantkit quantize`")

    @classmethod
    def _build(cls, data: dict[str, Any], where: str) -> Manifest:
        try:
            manifest = cls(**{**data, "source": Source(**data["source"])})
        except (KeyError, TypeError) as exc:
            raise BadInput(f"{where} is not a complete manifest ({exc})", cls.HINT) from exc
        # its `checkpoint` names a format: quantkit.checkpoints.checkpoint() refuses one that no
        # entry registered, wherever the format is asked
        return manifest


def expert_coverage(ex: ExpertCoverage) -> str:
    """How well a mixture-of-experts model's experts were calibrated (the manifest's `experts`)."""
    under = ex.get("under_floor_by_layer") or {}
    where = "; ".join(f"layer {i}: {', '.join(map(str, es))}" if len(es) <= 8 else
                      f"layer {i}: {len(es)} experts" for i, es in list(under.items())[:6])
    where += "; ..." if len(under) > 6 else ""
    return (f"experts: {ex.get('experts')} calibrated, tokens per expert min {ex.get('min')}, "
            f"median {ex.get('median')}; {ex.get('under_floor')} under the floor of "
            f"{ex.get('floor')} tokens" + (f" ({where}), calibrated on all tokens" if where
                                           else ""))


def folder_size(path: Path, pattern: str = "*.safetensors") -> int:
    """Bytes of the weight files in a folder."""
    return sum(f.stat().st_size for f in Path(path).glob(pattern))


def kv_scheme(folder: Path) -> dict[str, Any] | None:
    """A checkpoint folder's compressed-tensors kv_cache_scheme: set when `quantkit quantize
    --kv-cache fp8` calibrated k/v scales (served, and validated, with an FP8 KV cache); None
    when its KV cache stays 16-bit."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    quant = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    scheme = quant.get("kv_cache_scheme") if isinstance(quant, dict) else None
    return scheme if isinstance(scheme, dict) else None


def scheme_name(method: str | None, p: dict[str, Any]) -> str:
    """A layer-by-layer artifact's scheme in the words the docs use: "gptq W4A16 g128",
    "gptq W4A8 g128", "fp8 FP8-static", "awq W8A16 per channel + FP8 KV cache"."""
    from quantkit.method_registry import METHODS

    entry = METHODS.get(method or "")  # a plugin's method may be missing where it is read
    if entry is not None and entry.float_weights:
        what = "FP8-static" if p.get("act_fp8") == "static" else "FP8 (per-token activations)"
    else:
        group = p.get("group_size")
        what = (f"W{p.get('bits')}A{8 if p.get('act_fp8') else 16} "
                + ("per channel" if group == -1 else f"g{group}"))
    return f"{method} {what}" + (" + FP8 KV cache" if p.get("kv_fp8") else "")
