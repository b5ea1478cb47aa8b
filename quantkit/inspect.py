"""`quantkit inspect`: describe a model, a calibration set or an artifact without loading weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast, final

from quantkit.artifact import MANIFEST, Manifest, Structure
from quantkit.errors import BadInput
from quantkit.fsutil import read_json_file

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from quantkit.calib import CalibManifest, CalibThinking
    from quantkit.records import (
        CalibSource,
        CalibStats,
        MixShare,
        Origins,
        TargetMatch,
        TokenizerRecord,
        TokenLength,
    )
    from quantkit.thinking import ThinkingRecord


@final
class StructureRefusal(TypedDict):
    """Why GPTQ/AWQ cannot quantize a model: read_structure's BadInput, message and hint."""

    refused: str
    hint: str


class ModelInspection(TypedDict):
    """`quantkit inspect MODEL`: models.ModelInfo's fields in its order, what its chat template
    says of thinking, and what GPTQ/AWQ would quantize."""

    kind: Literal["model"]
    path: str
    architecture: str
    model_type: str | None
    parameters: int
    dtypes: dict[str, int]
    size_bytes: int
    hidden_size: int | None
    layers: int | None
    linear_shapes: dict[str, list[int]]
    chat_template: bool
    quantized: bool
    quantization: dict[str, Any] | None  # its config's quantization_config in part (open JSON)
    thinking: ThinkingRecord
    structure: Structure | StructureRefusal


class CalibSetInspection(TypedDict):
    """`quantkit inspect SET`: a calibration set's manifest.json and stats.json in part."""

    kind: Literal["calibration_set"]
    path: str
    samples: int
    tokens: int
    sources: list[CalibSource]
    mix: dict[str, MixShare]
    token_length: TokenLength
    target_match: TargetMatch | None
    tokenizer: TokenizerRecord
    thinking: CalibThinking | None  # None: a set made before calibrate read reasoning
    origins: NotRequired[Origins]


# An artifact's inspection is its quantkit.json flat (Manifest.to_dict), `kind` first and
# `sensitivity_ranked` last: open JSON (each checkpoint kind's fields, a method's parameters).
Inspection = ModelInspection | CalibSetInspection | dict[str, Any]


def inspect_path(target: str) -> Inspection:
    """Summarise whatever `target` is: a calibration set, an artifact or a model spec."""
    path = Path(target)
    if (path / "samples.jsonl").is_file() and (path / "manifest.json").is_file():
        return inspect_calib_set(path)
    if (path / MANIFEST).is_file():
        return inspect_artifact(path)
    return inspect_model(target)


def inspect_artifact(path: Path) -> dict[str, Any]:  # open: see Inspection
    """The artifact's manifest; with --w8-groups, its linear groups ranked by sensitivity."""
    manifest = Manifest.read(path).to_dict()
    sens = manifest.get("sensitivity") or {}
    upgraded = set(sens.get("upgraded", []))
    bits = manifest.get("parameters", {}).get("bits")
    ranked = [{"group": g, "kld": v, "bits": sens.get("upgrade_bits") if g in upgraded else bits}
              for g, v in sorted(sens.get("kld", {}).items(), key=lambda kv: -kv[1])]
    return {"kind": "artifact", **manifest,
            **({"sensitivity_ranked": ranked} if ranked else {})}


def sensitivity_table(res: dict[str, Any], top: int = 20) -> str:  # an artifact's: open
    """The most sensitive linear groups as text: group, KL it alone adds, bits it got."""
    ranked = res.get("sensitivity_ranked") or []
    if not ranked:
        return ""
    sens = res["sensitivity"]
    lines = [f"linear groups by the KL their {res['parameters']['bits']}-bit quantization alone "
             f"adds ({sens['tokens']} calibration tokens; {len(sens['upgraded'])} of "
             f"{len(ranked)} kept at {sens['upgrade_bits']} bits):"]
    lines += [f"  {r['group']:<14} {r['kld']:.5f}  W{r['bits']}" for r in ranked[:top]]
    if len(ranked) > top:
        lines.append(f"  ... {len(ranked) - top} more in --json")
    return "\n".join(lines)


def inspect_model(target: str) -> ModelInspection:
    """The model's facts (`ModelInfo`), resolving its spec first."""
    from quantkit.errors import BadInput
    from quantkit.models import model_info, resolve_model
    from quantkit.quantize.structure import read_structure
    from quantkit.thinking import model_thinking

    path = resolve_model(target).path
    info = model_info(path)
    thinking = model_thinking(path).to_dict()
    try:  # what GPTQ/AWQ would quantize, read from the model, or why they cannot
        structure: Structure | StructureRefusal = read_structure(path).describe()
    except BadInput as exc:
        structure = {"refused": exc.message, "hint": exc.hint}
    # ModelInfo's fields as asdict gives them (ModelInspection declares them), in its order
    return cast(ModelInspection, {"kind": "model", **dataclasses.asdict(info),
                                  "thinking": thinking, "structure": structure})


_REBUILD = "rebuild it with `quantkit calibrate --force`"


def inspect_calib_set(path: Path) -> CalibSetInspection:
    """Manifest and stats of a calibration set folder."""
    manifest: CalibManifest
    stats: CalibStats
    manifest, stats = (read_json_file(path / name, f"calibration set {path} has no {name}",
                                      _REBUILD, _REBUILD) for name in ("manifest.json", "stats.json"))
    try:
        res: CalibSetInspection = {
            "kind": "calibration_set", "path": str(path),
            "samples": manifest["counts"]["samples"], "tokens": manifest["counts"]["tokens"],
            "sources": manifest["sources"], "mix": stats["mix"],
            "token_length": stats["token_length"], "target_match": stats.get("target_match"),
            "tokenizer": manifest["tokenizer"], "thinking": manifest.get("thinking")}
        if manifest.get("origins"):
            res["origins"] = manifest["origins"]
        return res
    except (KeyError, TypeError, AttributeError) as exc:
        raise _incomplete(str(path), exc) from None


def _incomplete(path: str, exc: Exception) -> BadInput:
    """A calibration set whose manifest.json or stats.json lacks a record calibrate writes."""
    return BadInput(f"calibration set {path} has an incomplete manifest.json or stats.json "
                    f"({type(exc).__name__}: {exc})", _REBUILD)


# -- the human summary: key facts one per line; `--json` gives everything ------------------------

def human_summary(res: Inspection, target: str) -> str:
    """What `inspect` prints without --json: a few readable lines per kind, nested data summarised
    (counts, extremes), then the sensitivity ranking of a mixed-precision artifact."""
    if _is_model(res):
        lines = _model_lines(res)
    elif _is_calib_set(res):
        try:
            lines = _calib_lines(res)
        except (KeyError, TypeError, AttributeError) as exc:  # a hand-edited nested record
            raise _incomplete(res["path"], exc) from None
    else:
        lines = [*_artifact_lines(res), sensitivity_table(res)]
    lines = [ln for ln in lines if ln]
    import shlex

    lines.append(f"every field: quantkit --json inspect {shlex.quote(target)}")
    return "\n".join(lines)


def _is_model(res: Inspection) -> TypeIs[ModelInspection]:
    return res["kind"] == "model"


def _is_calib_set(res: Inspection) -> TypeIs[CalibSetInspection]:
    return res["kind"] == "calibration_set"


def _mib(n: Any) -> str:
    return f"{n / 2**20:,.1f} MiB" if isinstance(n, (int, float)) else "?"


def _count(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def _pairs(d: Any, limit: int = 8) -> str:
    """`k v, k v` of a flat mapping's scalar entries (the first `limit`, then how many more)."""
    if not isinstance(d, dict):
        return str(d)
    items = [(k, v) for k, v in d.items() if not isinstance(v, (dict, list))]
    text = ", ".join(f"{k} {v}" for k, v in items[:limit])
    return text + (f", ... {len(items) - limit} more" if len(items) > limit else "")


def _model_lines(res: ModelInspection) -> list[str]:
    from quantkit.quantize.preflight import GROUP_SIZES

    ins = sorted({shape[1] for name, shape in (res.get("linear_shapes") or {}).items()
                  if ".N." in name and len(shape) == 2})
    fits = [str(g) for g in GROUP_SIZES if ins and all(n % g == 0 for n in ins)]
    quant = res.get("quantization") or {}
    return [f"model: {res.get('path')}",
            f"architecture: {res.get('architecture')} ({res.get('model_type')}), "
            f"{res.get('layers')} layers, hidden size {res.get('hidden_size')}",
            f"parameters: {_count(res.get('parameters'))} "
            f"({', '.join(f'{k} x{v}' for k, v in (res.get('dtypes') or {}).items())} tensors)",
            f"size on disk: {_mib(res.get('size_bytes'))}",
            f"linear input sizes: {', '.join(map(str, ins)) or '?'} (group sizes that divide "
            f"them all: {', '.join(fits) or 'none: per channel only'})" if ins else "",
            f"chat template: {_yes(res.get('chat_template'))}",
            _thinking_line(res.get("thinking")),
            f"quantized: {'yes (' + _pairs(quant) + ')' if res.get('quantized') else 'no'}",
            _structure_line(res["structure"])]


def _thinking_line(th: Any) -> str:
    """What the chat template says about thinking (quantkit/thinking.py)."""
    if not isinstance(th, dict):
        return ""
    from quantkit.thinking import Thinking

    fields = {k: v for k, v in th.items() if k in Thinking.__dataclass_fields__}
    fields["flags"] = tuple(fields["flags"]) if fields.get("flags") else None
    return f"thinking: {Thinking(**fields).describe()}"


def _structure_line(st: Structure | StructureRefusal) -> str:
    """GPTQ/AWQ's reading of a layer: its linear groups and where AWQ folds, or the refusal."""
    if "layers" not in st:  # a refusal (final: it holds no layers)
        return f"gptq/awq: refused: {st['refused']} ({st['hint']})"
    groups = " | ".join("/".join(n.rsplit(".", 1)[-1].removesuffix("_proj") for n in g)
                        for g in st["groups"])
    folds = ", ".join(str(f["into"] or "-") + (" (1+w)" if f.get("offset") else "")
                      for f in st["awq_folds"])
    ex = st.get("experts")
    experts = (f"; experts {ex['module']}: {ex['experts']} per layer, top {ex['top_k']}, "
               f"routers {', '.join(ex['routers'])} kept in 16 bits" if ex else "")
    return f"gptq/awq: linear groups per layer {groups}; AWQ folds into {folds}{experts}"


def _calib_lines(res: CalibSetInspection) -> list[str]:
    mix, length, tok = res["mix"], res["token_length"], res["tokenizer"]
    lines = [f"calibration set: {res['path']}",
             f"samples: {res['samples']}, tokens: {_count(res['tokens'])}",
             f"sample length: {length['min']} to {length['max']} tokens, mean "
             f"{length['mean']}" if length else "",
             "sources:"]
    for src in res["sources"]:
        got, name = mix.get(src["location"]), src["spec"] or src["location"]
        lines.append(f"  {name}: {got['actual']} samples ({got['actual_share']:.0%} of the set)"
                     if got else f"  {name}")
    match = res["target_match"]
    if match:
        lines.append(f"match to its target: JS divergence {match['js_divergence']} bits, "
                     f"{match['target_token_coverage']:.1%} of target tokens covered"
                     + (" (poor match)" if match["poor"] else ""))
    th = res["thinking"]
    if th and (th["chats_with_reasoning"] or th["reasoning_dropped"]):
        lines.append(f"reasoning: {th['chats_with_reasoning']} chats rendered with thinking on "
                     f"({th['samples_with_reasoning']} samples), {th['reasoning_dropped']} "
                     "chats' reasoning dropped (the model has no thinking mode)")
    origins = res.get("origins")
    if origins:
        t, srcs = origins["self-traces"], origins["sources"]
        lines.append(f"self-traces: {t['samples']} samples, {t['tokens']} tokens from the "
                     f"model's own answers to {t['prompts']} prompts (thinking "
                     f"{t['thinking']}); sources: {srcs['samples']} samples, "
                     f"{srcs['tokens']} tokens")
    lines.append(f"tokenizer: {tok['name_or_path']} (vocabulary {tok['vocab_size']}, "
                 f"chat template {_yes(tok['chat_template'])})")
    return lines


def _artifact_lines(res: dict[str, Any]) -> list[str]:  # quantkit.json flat: open
    p, src = res.get("parameters") or {}, res.get("source") or {}
    calib, size = res.get("calibration") or {}, res.get("size_bytes") or {}
    from quantkit.checkpoints import call, checkpoint

    what = call(checkpoint(str(res.get("checkpoint"))), "headline", res)
    # the source's identity (weights, config, tokenizer); an older manifest names its weights
    named, sha = (("model", src["model_sha256"]) if src.get("model_sha256")
                  else ("weights", src.get("weights_sha256")))
    lines = [f"artifact: {what}",
             f"source: {src.get('spec')} ({src.get('architecture')}, "
             f"{_count(src.get('parameters'))} parameters, {named} sha256 {str(sha)[:12]})",
             f"calibration: {calib.get('path')} ({calib.get('samples')} samples, "
             f"{_count(calib.get('tokens'))} tokens)",
             f"size: {_mib(size.get('before'))} -> {_mib(size.get('after'))}",
             f"settings: {_pairs(p, 12)}"]
    errors = res.get("layer_errors") or {}
    worst = [(err, f"layer {i} {name}") for i, per in errors.items()
             for name, err in (per or {}).items() if isinstance(err, (int, float))]
    if worst:
        top, where = max(worst)
        lines.append(f"layer errors: {len(errors)} layers, worst relative output error "
                     f"{top:.2e} ({where})")
    if res.get("experts"):
        from quantkit.artifact import expert_coverage

        lines.append(expert_coverage(res["experts"]))
    verification = res.get("verification") or {}
    if verification:
        lines.append(f"verification: {_pairs(verification)}")
    timings = sorted((res.get("timings") or {}).items(), key=lambda kv: -kv[1])
    lines.append(f"wall time: {res.get('wall_time_s')} s"
                 + (f" ({', '.join(f'{k} {v:.1f} s' for k, v in timings[:3])})"
                    if timings else ""))
    lines.append(f"versions: {_pairs(res.get('versions') or {})}")
    return lines

