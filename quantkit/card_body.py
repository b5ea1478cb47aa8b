"""The text of a model card (Markdown), from a `Validated` (an artifact and its validation): the
verdict on the first line, then the gate, the tasks, the calibration set, the method, how to serve
it, its speed where one was measured, and the versions it was made and validated with. Pure: no
network, no torch."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.artifact import Manifest
from quantkit.checkpoints import call, checkpoint, label
from quantkit.contract import TaskResult
from quantkit.results import Results, calibration_match

OPS = {">=": "≥", "<=": "≤"}
# the score each side of a task records, the first one found (an lm-eval task's is `value`)
SCORES = ("value", "accuracy", "pass_at_1", "ppl", "flagged_share")


@dataclass(frozen=True)
class Validated:
    """An artifact folder, the validation that names its sha256, and a speed where one was
    measured (`quantkit bench` of it, or `quantkit auto --load`)."""

    folder: Path
    manifest: Manifest
    sha256: str
    results: Results
    results_dir: Path
    speed: dict[str, Any] | None = None

    @property
    def verdict(self) -> str:
        """pass, fail or not gated."""
        return self.results.verdict

    @property
    def name(self) -> str:
        """The artifact's folder name."""
        return self.folder.resolve().name


def body(v: Validated, *, repo_id: str | None, base: str | None) -> str:
    """The whole body, the verdict first."""
    parts = [f"# {repo_id or v.name}", headline(v), _intro(v, base), _gate(v), _tasks(v),
             _thinking(v), _calibration(v), _quantization(v), _serve(v, repo_id), _speed(v), _versions(v)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _n(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _ci(lo: Any, hi: Any) -> str:
    return "" if lo is None or hi is None else f"[{_n(lo)}, {_n(hi)}]"


def _mib(n: Any) -> str:
    return f"{n / 2**20:.1f} MiB" if isinstance(n, (int, float)) else "n/a"


def _table(head: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])


def headline(v: Validated) -> str:
    """The body's first line: the verdict, and for a failed gate that it failed and on what."""
    gate = v.results.gate
    checks = gate.checks
    if v.verdict == "fail":
        failing = ", ".join(f"`{f}`" for f in gate.failing)
        return (f"**This quantization FAILED its validation gate** (on {failing}): it is "
                "published for comparison, not as a replacement for the original.")
    if v.verdict == "pass":
        return (f"**Validated: it passed its gate**, {len(checks)} threshold(s) against the "
                f"original model on {v.results.engine}.")
    return ("**Not gated**: validated without thresholds; the numbers below are measurements, "
            "not a verdict.")


def _intro(v: Validated, base: str | None) -> str:
    from quantkit.models import KNOWN_BASES

    m, src = v.manifest, v.manifest.source
    what = call(checkpoint(m.checkpoint), "describe", m)
    if m.sensitivity and m.sensitivity.get("upgraded"):
        what += f" with {len(m.sensitivity['upgraded'])} linear groups at W8"
    source = f"[{base}](https://huggingface.co/{base})" if base else f"`{src.spec}`"
    facts = f"{src.architecture}, {src.parameters:,} parameters"
    if src.spec in KNOWN_BASES:  # quantkit's alias: say how its weights were had
        facts += f"; here `{src.spec}`, {KNOWN_BASES[src.spec][1]}"
    before, after = m.size_bytes.get("before"), m.size_bytes.get("after")
    share = f" ({after / before:.1%} of the original's)" if before and after else ""
    bits = (f"; {_n(m.bits_per_weight)} bits per weight over the whole model"
            if m.bits_per_weight is not None else "")
    if m.linear_bits_per_weight is not None:
        bits += f", {_n(m.linear_bits_per_weight)} in the quantized linears"
    return (f"{source} ({facts}) quantized to {what} by quantkit "
            f"{m.versions.get('quantkit', '')}: {_mib(after)}{share}{bits}.")


def _gate(v: Validated) -> str:
    gate = v.results.gate
    checks = gate.checks
    if not checks:
        return "## Validation gate\n\nNo thresholds were given: this validation is not gated."
    rows = [[f"`{c.task}.{c.metric}`", "—" if c.note else _n(c.value),
             _ci(c.lo, c.hi) or "—", f"{OPS.get(c.op, c.op)} {_n(c.limit)}",
             "pass" if c.passed else "**FAIL**",
             c.note or ("sample too small to support the verdict" if c.too_small else "")]
            for c in checks]
    text = ("## Validation gate\n\nEach metric is the quantized model against the original on "
            "the same inputs, with its 95% interval.\n\n"
            + _table(["check", "value", "95% interval", "limit", "result", "note"], rows)
            + f"\n\nVerdict: **{v.verdict.upper()}**.")
    if gate.causes:
        text += "\n\nThe usual causes, most likely first:\n" + "\n".join(
            f"{i}. {c}" for i, c in enumerate(gate.causes, 1))
    return text


def _side(r: TaskResult, side: str) -> tuple[str, Any, Any]:
    """(score name, value, samples) of one side of a task's result."""
    s = getattr(r, side) or {}
    if not isinstance(s, dict):
        return "", None, None
    key = next((k for k in SCORES if isinstance(s.get(k), (int, float))), "")
    name = str(r.extra.get("metric") or key) if key == "value" else key
    samples = s.get("n") or s.get("text_lines") or (len(s["items"]) if isinstance(
        s.get("items"), list) else None)
    if isinstance(s.get("qa"), dict) and s["qa"].get("n"):
        samples = f"{samples or 0} texts + {s['qa']['n']} questions"
    return name, s.get(key) if key else None, samples


def _tasks(v: Validated) -> str:
    from quantkit.task_registry import task as task_spec

    rows = []
    for name, r in v.results.tasks.items():
        spec = task_spec(name)
        score, quantized, samples = _side(r, "quantized")
        _, original, _ = _side(r, "baseline")
        compared = "; ".join(f"{k} {m.note or _n(m.value)} {_ci(m.lo, m.hi)}".strip()
                             for k in spec.metrics if (m := r.metric(k)) is not None)
        rows.append([f"{spec.title} (`{name}`)", score or "—", _n(original), _n(quantized),
                     compared or "—", str(samples or "n/a")])
    s = v.results.settings
    return (f"## Tasks\n\nBoth models on {v.results.engine} {v.results.engine_version}, "
            f"the original being `{v.results.baseline.label}`"
            + ("" if v.results.baseline.source_match in (None, True) else
               " (**not** the artifact's source: compared with --force)")
            + f"; validated {v.results.created}, seed {s.get('seed')}.\n\n"
            + _table(["task", "score", "original", "quantized", "quantized vs original "
                      "[95% interval]", "samples"], rows))


def _thinking(v: Validated) -> str:
    """How a thinking model was validated, in words: the mode, the budget, the seeds and, per
    task, its thinking closed and how much longer it thinks ("" for a model that does not)."""
    from quantkit.validate.served import describe

    th = v.results.settings.get("thinking")
    if not isinstance(th, dict):
        return ""
    markers = " … ".join(f"`{m}`" for m in th.get("markers") or [] if m)
    if not th.get("on"):
        return (f"## Thinking\n\nThe original's chat template has a thinking mode ({markers}); "
                f"both models were validated with it off (`--thinking {th.get('mode')}`), as "
                "they will be served.")
    seeds = next((r.extra["settings"]["seeds"] for r in v.results.tasks.values()
                  if isinstance(r.extra.get("settings"), dict)
                  and r.extra["settings"].get("seeds")), None)
    lines = [f"## Thinking\n\nThe original's chat template has a thinking mode ({markers}); "
             f"both models were validated as they will be served: thinking on "
             f"(`--thinking {th.get('mode')}`), a thinking budget of {th.get('budget')} tokens, "
             "the answer scored being what follows the thinking"
             + (f", sampled tasks run with {seeds} seeds per item" if seeds else "") + ".\n"]
    from quantkit.task_registry import task as task_spec

    for name, r in v.results.tasks.items():
        line = describe(r)
        if line and "; " in line:
            lines.append(f"- {task_spec(name).title}: {line.split('; ', 1)[1]}.")
    return "\n".join(lines)


def _calibration(v: Validated) -> str:
    calib = v.results.calibration or {}
    cm, stats = calib.get("manifest") or {}, calib.get("stats") or {}
    am = v.manifest.calibration
    counts, lengths = cm.get("counts") or {}, stats.get("token_length") or {}
    samples = counts.get("samples") or am.get("samples")
    tokens = counts.get("tokens") or stats.get("tokens") or am.get("tokens")
    text = (f"## Calibration set\n\n{_n(samples)} samples, {_n(tokens)} tokens"
            + ((f", {lengths['min']} tokens each" if lengths["min"] == lengths["max"] else
                f", {lengths['min']}–{lengths['max']} tokens each (mean {_n(lengths.get('mean'))})")
               if "min" in lengths and "max" in lengths else "")
            + f"; samples sha256 `{am.get('samples_sha256') or cm.get('samples_sha256')}`.")
    traces = (cm.get("origins") or {}).get("self-traces")
    if traces:
        text += (f" Of these, {_n(traces.get('samples'))} samples ({_n(traces.get('tokens'))} "
                 f"tokens) are the original model's own answers to {_n(traces.get('prompts'))} "
                 f"of the sources' prompts, thinking {traces.get('thinking')} (`--self-traces`).")
    mix = stats.get("mix") or {}
    sources = cm.get("sources") or []
    if sources:
        text += "\n\n" + _table(
            ["source", "rendering", "requested share", "actual share", "samples"],
            [[f"`{s.get('spec') or s.get('location')}`", str(s.get("rendering") or ""),
              _pct(s.get("weight")), _pct((mix.get(s.get("location")) or {}).get("actual_share")),
              _n((mix.get(s.get("location")) or {}).get("actual"))] for s in sources])
    match = calibration_match(v.results.to_dict())
    if match:
        verdict = ("a **poor** match: the set does not look like the domain" if match.get("poor")
                   else "an acceptable match" if "poor" in match else "")
        text += (f"\n\nMatch to the domain set: JS divergence {_n(match.get('js_divergence'))} "
                 f"bits, {_pct(match.get('target_token_coverage'))} of the domain's tokens "
                 f"covered{': ' + verdict if verdict else ''}.")
    else:
        text += "\n\nIts match to the domain set was not measured."
    return text


def _pct(x: Any) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) else "n/a"


def _quantization(v: Validated) -> str:
    m = v.manifest
    rows = [[f"`{k}`", f"{len(val)} entries (in quantkit.json)" if isinstance(val, list)
             and len(val) > 6 else f"`{val}`"] for k, val in m.parameters.items()
            if val not in (None, "", [], {})]
    text = (f"## Method\n\n`{m.method}` ({m.format or label(m.checkpoint)}), in "
            f"{_n(m.wall_time_s)} s; size {_mib(m.size_bytes.get('before'))} → "
            f"{_mib(m.size_bytes.get('after'))}"
            + (f", {_n(m.bits_per_weight)} bits per weight (every tensor's bytes × 8 / the "
               "original's parameters)" if m.bits_per_weight is not None else "") + ".\n\n"
            + _table(["parameter", "value"], rows))
    if m.sensitivity:
        text += (f"\n\n{len(m.sensitivity.get('upgraded') or [])} linear groups, the most "
                 "sensitive by their KL to the original, are kept at 8 bits.")
    if m.imatrix:
        text += (f"\n\nImportance matrix `{m.imatrix.get('file')}`: {_n(m.imatrix.get('entries'))} "
                 f"tensors, {_n(m.imatrix.get('tokens'))} calibration tokens.")
    if m.fallback_tensors:
        text += f"\n\n{m.fallback_tensors} tensors fell back to another quant type."
    return text


def serve_commands(v: Validated, repo_id: str | None) -> list[str]:
    """The commands that serve the artifact, in its real format: llama-server on the .gguf,
    vLLM on the compressed-tensors folder, and `quantkit serve` with the validation it finds."""
    fmt, m = checkpoint(v.manifest.checkpoint), v.manifest
    local = shlex.quote(str(v.folder))
    if repo_id is None:
        reports = shlex.quote(str(v.results_dir.parent))
        return [call(fmt, "serve_local", v.folder, m),
                f"quantkit serve {local} --reports {reports}"]
    name = repo_id.split("/")[-1]
    return [call(fmt, "serve_hub", repo_id, m), f"hf download {repo_id} --local-dir {name}",
            call(fmt, "serve_local", Path(name), m), f"quantkit serve {name} --reports {name}"]


def _serve(v: Validated, repo_id: str | None) -> str:
    cmds = serve_commands(v, repo_id)
    where = checkpoint(v.manifest.checkpoint).serves_with
    tail = ("\n\n`quantkit serve` checks the validation first: it finds "
            f"`{'validation/' if repo_id else ''}{'results.json'}` by the artifact's sha256 under "
            "`--reports` and refuses a failed one.")
    if repo_id is None:
        return f"## Serve it\n\n{where}:\n\n```\n{cmds[0]}\n```\n\nor\n\n```\n{cmds[1]}\n```" + tail
    return (f"## Serve it\n\n{where}, straight from the Hub:\n\n```\n{cmds[0]}\n```\n\nor from a "
            f"download, with quantkit:\n\n```\n{cmds[1]}\n{cmds[2]}\n{cmds[3]}\n```" + tail)


def _speed(v: Validated) -> str:
    sp = v.speed
    if not sp:
        return ""
    if sp["source"] == "bench":
        rows = []
        for lv in sp.get("levels") or []:
            ci = lv.get("output_token_throughput_ci")
            t, p = lv.get("ttft_s") or {}, lv.get("tpot_s") or {}
            rows.append([str(lv.get("concurrency")), _n(lv.get("output_token_throughput"), 5),
                         _ci(*ci) if ci else "(one repeat)", _n(lv.get("request_throughput")),
                         f"{_ms(t.get('p50'))} / {_ms(t.get('p99'))}",
                         f"{_ms(p.get('p50'))} / {_ms(p.get('p99'))}", str(lv.get("errors", 0))])
        repeats = (sp.get("settings") or {}).get("repeats")
        return (f"## Speed\n\n`quantkit bench` of `{sp.get('model')}` ({sp.get('created')}); "
                f"output tokens/s is the median of {repeats} repeat(s) per level, its interval the "
                "95% t-interval of their mean.\n\n"
                + _table(["concurrency", "output tok/s", "95% interval", "req/s",
                          "TTFT p50 / p99 ms", "TPOT p50 / p99 ms", "errors"], rows)
                + f"\n\nKnee: concurrency {(sp.get('knee') or {}).get('concurrency')}; "
                f"recommended max concurrency {sp.get('recommended_concurrency')}.")
    speed, ref = sp["speed"], sp.get("reference") or {}
    base = {lv.get("concurrency"): lv for lv in ref.get("levels") or []}
    rows = [[str(lv.get("concurrency")), _n(lv.get("output_tok_s"), 5),
             _ci(*lv["ci"]) if lv.get("ci") else "—",
             _n((base.get(lv.get("concurrency")) or {}).get("output_tok_s"), 5),
             _ratio(lv.get("vs_original")), _n(lv.get("ttft_p50_ms")), _n(lv.get("tpot_p50_ms"))]
            for lv in speed.get("levels") or []]
    return (f"## Speed\n\n`quantkit auto --load {','.join(map(str, sp['load']))}` served it "
            f"(candidate {sp['candidate']}) and the original on {speed.get('engine') or 'one engine'} "
            "in alternating order; each figure is a median over repeats with its 95% interval.\n\n"
            + _table(["concurrency", "output tok/s", "95% interval", "original tok/s",
                      "× original [95% interval]", "TTFT p50 ms", "TPOT p50 ms"], rows))


def _ms(s: Any) -> str:
    return "n/a" if not isinstance(s, (int, float)) else f"{s * 1000:.1f}"


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "—"
    return f"{r['ratio']:.3g}" + (f" {_ci(*r['ci'])}" if r.get("ci") else "")


def _versions(v: Validated) -> str:
    m, r = v.manifest, v.results
    made = ", ".join(f"{k} {val}" for k, val in m.versions.items())
    return (f"## Versions and provenance\n\n- quantized with {made}\n"
            f"- validated with quantkit {r.quantkit_version} on {r.engine} {r.engine_version}\n"
            f"- artifact sha256 `{v.sha256}` (what `quantkit validate` recorded)\n"
            f"- source model sha256 `{m.source.model_sha256 or m.source.weights_sha256}` "
            f"(`{m.source.spec}`)\n- validation: `{Path(v.results_dir).name}/results.json`, "
            f"{r.created}")
