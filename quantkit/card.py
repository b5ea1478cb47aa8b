"""A Hugging Face model card (README.md) for an artifact, written from its manifest (quantkit.json)
and its validation (results.json) as data: the metadata the Hub reads (base model and relation,
license, tags, model-index) through huggingface_hub's ModelCardData, and a body that a reader can
check (the gate, the tasks, the calibration set, the method, the versions, how to serve it, the
speed where one was measured). The body is `quantkit.card_body`'s."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.artifact import MANIFEST, Manifest, identity_sha256
from quantkit.card_body import Validated
from quantkit.checkpoints import model_file
from quantkit.errors import BadInput
from quantkit.models import KNOWN_BASES
from quantkit.results import CARD, RESULTS, Results

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

PIPELINE_TAG = "text-generation"
_HF_CACHE = re.compile(r"models--([\w.-]+)--([\w.-]+)/snapshots/")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def find_validated(artifact: Path, results: Path | None = None, reports: Path = Path("reports")
                   ) -> Validated:
    """The artifact folder and its validation: `results` (a folder holding results.json, which
    must name this artifact's sha256), else the newest results.json under `reports` that does."""
    artifact = Path(artifact)
    if not artifact.exists():
        raise BadInput(f"artifact {artifact} does not exist", "pass a quantkit quantize output folder")
    if not artifact.is_dir() or not (artifact / MANIFEST).is_file():
        raise BadInput(f"{artifact} is not a quantkit artifact (no {MANIFEST})",
                       "pass the folder `quantkit quantize` (or `quantkit auto`) wrote")
    manifest = Manifest.read(artifact)
    sha = identity_sha256(model_file(artifact, manifest))
    validate_hint = (f"validate it: quantkit validate {artifact} --baseline MODEL --out "
                     "reports/NAME, or pass --results DIR")
    if results is not None:
        res = Results.read(Path(results))
        theirs = str(res.artifact.sha256)
        if theirs != sha:
            raise BadInput(f"{Path(results) / RESULTS} is the validation of another artifact "
                           f"({res.artifact.path}, sha256 {theirs[:12]}); {artifact} is "
                           f"sha256 {sha[:12]}", "pass the --results folder of this artifact's "
                           "validation, or " + validate_hint.replace(", or pass --results DIR", ""))
        found = Path(results)
    else:
        res, found = _newest(reports, sha, artifact, validate_hint)
    return Validated(artifact, manifest, sha, res, found, _speed(artifact, found))


def _newest(reports: Path, sha: str, artifact: Path, hint: str) -> tuple[Results, Path]:
    matches = []
    for f in sorted(Path(reports).glob(f"*/{RESULTS}")):
        try:
            r = Results.read(f.parent)
        except BadInput:  # another quantkit version's, or damaged: not a validation of this one
            continue
        if r.artifact.sha256 == sha:
            matches.append((r.created, f.stat().st_mtime, f.parent, r))
    if not matches:
        raise BadInput(f"no validation of {artifact} (sha256 {sha[:12]}) in "
                       f"{reports}/*/{RESULTS}", hint)
    _, _, folder, r = max(matches, key=lambda m: (m[0], m[1]))
    return r, folder


def _speed(artifact: Path, results_dir: Path) -> dict[str, Any] | None:
    """The speed measured for this artifact: the recipe's `REPORT-bench` folder (`quantkit bench
    --recipe`) where the server it measured was this artifact, else the chosen candidate's in
    `quantkit auto --load`'s auto.json beside the results."""
    folder = Path(f"{results_dir}-bench")
    data = _json(folder / "results.json")
    if data is not None and data.get("kind") == "bench" and (
            data.get("model") == artifact.resolve().name):
        return {"source": "bench", "folder": str(folder), **data}
    auto = _json(results_dir / "auto.json") or {}
    chosen = next((c for c in auto.get("candidates") or []
                   if c.get("name") == auto.get("chosen") and c.get("speed")), None)
    if auto.get("load") and chosen is not None and not chosen["speed"].get("error"):
        return {"source": "auto", "load": auto["load"], "candidate": chosen["name"],
                "speed": chosen["speed"], "reference": auto.get("reference") or {}}
    return None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- metadata ------------------------------------------------------------------------------------

def base_model(v: Validated) -> str | None:
    """The Hub id of the model the artifact was made from, where the manifest says one: a hub id
    quantkit fetched (or its cache folder), or the alias of a model from the Hub."""
    src = v.manifest.source
    if src.spec in KNOWN_BASES:
        return KNOWN_BASES[src.spec][0]
    cached = _HF_CACHE.search(src.path)
    if cached:
        return f"{cached.group(1)}/{cached.group(2)}"
    if src.spec != src.path and _HUB_ID.match(src.spec):  # a local folder's spec is its path
        return src.spec
    return None


def source_license(v: Validated) -> dict[str, str]:
    """license (and license_name/link for `other`) from the source folder's README.md front
    matter, where the source is on disk and its card has one; for quantkit's alias, the license
    its model carries."""
    import yaml
    from huggingface_hub.repocard import metadata_load

    readme = Path(v.manifest.source.path) / "README.md"
    if not readme.is_file():
        known = KNOWN_BASES.get(v.manifest.source.spec)
        return {"license": known[2]} if known else {}
    try:
        meta = metadata_load(readme) or {}
    except (OSError, ValueError, yaml.YAMLError):  # a damaged card carries no license
        return {}
    return {k: str(meta[k]) for k in ("license", "license_name", "license_link")
            if isinstance(meta.get(k), (str, int, float))}


def tags(v: Validated) -> list[str]:
    """quantkit, the method, the bits and the format."""
    from quantkit.checkpoints import call, checkpoint

    m = v.manifest
    bits = call(checkpoint(m.checkpoint), "tags", m)  # each format's own: bits, a k-quant type
    return list(dict.fromkeys(["quantkit", m.method, *bits, m.checkpoint]))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def eval_results(v: Validated) -> list[Any]:
    """model-index: one result per gated metric (the quantized model's value) and one per
    lm-eval task (its score); a metric with no value (not measured, no signal) has none."""
    from huggingface_hub import EvalResult

    from quantkit.task_registry import task as task_spec

    out = []
    for c in v.results.gate.checks:
        if not _finite(c.value):
            continue
        spec = task_spec(c.task)
        out.append(EvalResult(
            task_type=PIPELINE_TAG, dataset_type=c.task, dataset_name=spec.title,
            metric_type=c.metric, metric_value=c.value,
            metric_name=f"{c.metric} ({c.op} {c.limit:g}: {'pass' if c.passed else 'FAIL'})"))
    for name, r in v.results.tasks.items():
        score = r.quantized.get("value") if isinstance(r.quantized, dict) else None
        if task_spec(name).external and _finite(score):
            metric = r.extra.get("metric")
            out.append(EvalResult(task_type=PIPELINE_TAG, dataset_type=name, dataset_name=name,
                                  metric_type=str(metric or "score"),
                                  metric_value=score, metric_name=f"{metric} (quantized)"))
    return out


def build_card(v: Validated, *, repo_id: str | None = None,
               base: str | None = None) -> ModelCard:
    """The model card: metadata through huggingface_hub's ModelCardData, the body from the data.
    `repo_id` (where it is published) names the model in the card and its serve commands;
    `base` overrides the base model read from the manifest."""
    from huggingface_hub import ModelCard, ModelCardData

    from quantkit.card_body import body

    base = base or base_model(v)
    from quantkit.checkpoints import checkpoint

    lic = source_license(v)
    data = ModelCardData(
        base_model=base, pipeline_tag=PIPELINE_TAG,
        library_name=checkpoint(v.manifest.checkpoint).library, tags=tags(v),
        model_name=repo_id or v.name, eval_results=eval_results(v) or None,
        license=lic.get("license"), license_name=lic.get("license_name"),
        license_link=lic.get("license_link"), base_model_relation="quantized" if base else None)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body(v, repo_id=repo_id, base=base)}")


def write_card(v: Validated, out: Path, *, repo_id: str | None = None,
               base: str | None = None) -> Path:
    """The card into `out`, replaced in one rename (never half-written)."""
    from quantkit.fsutil import atomic_write_text

    out = Path(out)
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder", "pass a file, e.g. --out README.md")
    if not out.parent.is_dir():
        raise BadInput(f"cannot write {out}: {out.parent} is not a folder",
                       "create the folder first, or choose another --out")
    atomic_write_text(out, str(build_card(v, repo_id=repo_id, base=base)))
    return out


def make_card(*, artifact: Path, results: Path | None = None, reports: Path = Path("reports"),
              out: Path | None = None, repo_id: str | None = None, base: str | None = None
              ) -> dict[str, Any]:
    """`quantkit card`: the card of `artifact` into `out`, by default `CARD` beside its
    results.json, where the report (rendered again) links it."""
    if repo_id is not None:
        from quantkit.config.publish import check_repo_id

        check_repo_id(repo_id)
    v = find_validated(artifact, results, reports)
    path = write_card(v, out or v.results_dir / CARD, repo_id=repo_id, base=base)
    if out is None and (v.results_dir / "report.html").is_file():
        from quantkit.report import write_report

        write_report(v.results_dir)
    return {"card": str(path), "verdict": v.verdict, "results": str(v.results_dir)}
