"""`calibrate()`: sources -> documents -> deduplicated, packed, mixed samples -> calib_sets/NAME."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from quantkit import __version__, console
from quantkit.config import CalibrateConfig
from quantkit.errors import BadInput
from quantkit.fsutil import atomic_dir, check_output_dir, sha256_bytes, sha256_file, write_json
from quantkit.records import (
    CalibParameters,
    CalibSource,
    CalibStats,
    CalibSummary,
    Counts,
    Origins,
    SampleRow,
    SelfTracesRecord,
    TargetMatch,
    TokenizerRecord,
)
from quantkit.sources import Document, SourceSpec, parse_source, read_documents, source_sha256
from quantkit.thinking import Thinking, render_with_reasoning, tokenizer_thinking

if TYPE_CHECKING:
    from quantkit.thinking import ThinkingRecord

FORMAT_VERSION = 1
SAMPLES_FILE, MANIFEST_FILE, STATS_FILE = "samples.jsonl", "manifest.json", "stats.json"
RECOMMENDED_SAMPLES = (128, 512)
NGRAM_EXCLUDE = 13
POOR_MATCH_JSD = 0.5  # bits; above it the calibration tokens look unlike the target's


class CalibThinking(TypedDict):
    """The manifest's record of how chats were rendered (_thinking_record)."""

    template: ThinkingRecord
    without_reasoning: str
    with_reasoning: str
    template_kwargs_on: dict[str, bool] | None
    samples_with_reasoning: int
    chats_with_reasoning: int
    reasoning_dropped: int


class CalibManifest(TypedDict):
    """A calibration set's manifest.json. A set made before calibrate read reasoning has no
    `thinking`; `origins` only with --self-traces."""

    format_version: int
    quantkit_version: str
    model: str
    tokenizer: TokenizerRecord
    sources: list[CalibSource]
    parameters: CalibParameters
    counts: Counts
    thinking: NotRequired[CalibThinking]
    origins: NotRequired[Origins]
    samples_sha256: str


class _WithOrigins(TypedDict, total=False):
    """`origins` where --self-traces made some, unpacked into a record at its place."""

    origins: Origins


@dataclass
class _SourceState:
    spec: SourceSpec
    share: float
    quota: int = 0
    rendering: str = "plain"
    stats: Counter[str] = field(default_factory=Counter)
    samples: list[list[int]] = field(default_factory=list)


def calibrate(*, model: str, cfg: CalibrateConfig, out: Path, force: bool = False
              ) -> CalibSummary:
    """Build a domain-matched calibration set in `out` as `cfg` says; return its summary."""
    cfg.check()
    sources, samples, seed = list(cfg.sources), cfg.samples, cfg.seed
    min_tokens, max_tokens = cfg.min_tokens, cfg.max_tokens
    exclude = [Path(e) for e in cfg.exclude]
    target = Path(cfg.target) if cfg.target else None
    out = Path(out)
    check_output_dir(out, force)
    specs = [parse_source(s) for s in sources]
    for f in list(exclude or []) + ([target] if target else []):
        if not Path(f).is_file():
            raise BadInput(f"file {f} does not exist", "check the --exclude / --target path")
        parse_source(str(f))  # same formats as sources; fail before any heavy work
    lo, hi = RECOMMENDED_SAMPLES
    if not lo <= samples <= hi:
        console.warn(f"--samples {samples} is outside {lo}-{hi}: fewer samples give noisy "
                     "Hessians/scales, more add time without measurable gain")

    from quantkit.models import load_tokenizer, resolve_model, tokenizer_fingerprint

    ref = resolve_model(model)
    tok = load_tokenizer(ref.path)
    sep = next(t for t in (tok.eos_token_id, tok.sep_token_id, tok.bos_token_id, 0) if t is not None)
    banned = _ngrams_of_files(exclude or [])
    th = tokenizer_thinking(tok)
    if cfg.self_traces:
        from quantkit.self_traces import check_traceable

        check_traceable(tok, model)

    weights = [s.weight if s.weight is not None else 1.0 for s in specs]
    states = [_SourceState(s, w / sum(weights)) for s, w in zip(specs, weights)]
    for st, q in zip(states, _largest_remainder(samples, [s.share for s in states])):
        st.quota = q
    seen_exact: set[str] = set()
    lsh = _NearDup(seed)
    for i, st in enumerate(states):
        _fill_source(st, tok, th, sep, min_tokens, max_tokens, f"{seed}:{i}", banned, seen_exact,
                     lsh)
    short = [st for st in states if len(st.samples) < st.quota]
    if short:
        avail = min(math.floor(len(st.samples) / st.share) for st in short)
        detail = "; ".join(f"{st.spec.location} gives {len(st.samples)} of the {st.quota} "
                           "it must supply" for st in short)
        raise BadInput(f"asked for {samples} samples but these sources can give only {avail} "
                       f"at this mix ({detail})", f"use --samples {avail}, add sources or lower "
                       "--min-tokens")

    rows: list[SampleRow] = [
        {"source": st.spec.location, "rendering": st.rendering, "n_tokens": len(ids),
         "input_ids": ids, "text": tok.decode(ids)} for st in states for ids in st.samples]
    traces, traced = (_self_traces(cfg, ref.path, tok, th, specs, sep) if cfg.self_traces
                      else (None, []))
    if traces is not None:
        from quantkit.self_traces import ORIGIN

        how = f"chat_template, {ORIGIN} (thinking {traces['thinking'].split(' ')[0]})"
        rows += [{"source": ORIGIN, "rendering": how, "n_tokens": len(ids), "input_ids": ids,
                  "text": tok.decode(ids)} for ids in traced]
    random.Random(seed).shuffle(rows)
    lines = "".join(json.dumps({"id": i, **r}, ensure_ascii=False) + "\n" for i, r in enumerate(rows))
    stats = _stats(states, rows, min_tokens, max_tokens)
    thinking = _thinking_record(th, states)
    if thinking["reasoning_dropped"]:
        console.warn(f"{thinking['reasoning_dropped']} chats carried reasoning, but {model} has no "
                     "thinking mode: their reasoning was left out, the answers kept")
    if target:
        stats["target_match"] = target_match(target, rows, tok)
        if stats["target_match"]["poor"]:
            console.warn(f"calibration set matches {target} poorly (JS divergence "
                         f"{stats['target_match']['js_divergence']:.3f} bits); missing frequent "
                         f"target tokens: {stats['target_match']['missing_top_tokens'][:8]}")
    origins: _WithOrigins = {"origins": _origins(rows, traces)} if traces is not None else {}
    manifest: CalibManifest = {
        "format_version": FORMAT_VERSION, "quantkit_version": __version__, "model": model,
        "tokenizer": {"name_or_path": str(tok.name_or_path), "fingerprint": tokenizer_fingerprint(tok),
                      "vocab_size": len(tok), "chat_template": bool(tok.chat_template)},
        "sources": [{"spec": st.spec.spec, "location": st.spec.location, "weight": st.share,
                     "sha256": source_sha256(st.spec), "rendering": st.rendering} for st in states],
        "parameters": {"samples": samples, "min_tokens": min_tokens, "max_tokens": max_tokens,
                       "seed": seed, "separator_token_id": sep,
                       "exclude": [{"path": str(f), "sha256": sha256_file(Path(f))} for f in exclude or []],
                       "target": {"path": str(target), "sha256": sha256_file(target)} if target else None},
        "counts": {"samples": len(rows), "tokens": sum(r["n_tokens"] for r in rows)},
        "thinking": thinking,
        **origins,
        "samples_sha256": sha256_bytes(lines.encode()),
    }
    if "origins" in origins:
        stats["origins"] = origins["origins"]
    with atomic_dir(out, force) as tmp:
        (tmp / SAMPLES_FILE).write_text(lines, encoding="utf-8")
        write_json(tmp / MANIFEST_FILE, manifest)
        write_json(tmp / STATS_FILE, stats)
    return {"out": str(out), "samples": len(rows), "tokens": manifest["counts"]["tokens"],
            "mix": stats["mix"], "target_match": stats.get("target_match"),
            "reasoning": {"samples_with_reasoning": thinking["samples_with_reasoning"],
                          "chats_with_reasoning": thinking["chats_with_reasoning"],
                          "reasoning_dropped": thinking["reasoning_dropped"],
                          "with_reasoning": thinking["with_reasoning"]},
            **origins}


def _self_traces(cfg: CalibrateConfig, model_dir: Path, tok: Any, th: Thinking,
                 specs: list[SourceSpec], sep: int) -> tuple[SelfTracesRecord, list[list[int]]]:
    """--self-traces: the model's own answers to N of the sources' prompts, packed as samples:
    the manifest's record of them, and the samples."""
    from quantkit.self_traces import generate_traces, pack, record, trace_prompts

    chats = trace_prompts(specs, cfg.self_traces, cfg.seed)
    ids = generate_traces(Path(model_dir), tok, th, chats, max_new_tokens=cfg.trace_max_tokens,
                          temperature=cfg.trace_temperature, top_p=cfg.trace_top_p, seed=cfg.seed)
    samples = pack(ids, sep, cfg.min_tokens, cfg.max_tokens)
    return record(th, len(chats), samples, cfg), samples


def _origins(rows: list[SampleRow], traces: SelfTracesRecord) -> Origins:
    """Samples and tokens from the sources and from the model's own answers (--self-traces)."""
    from quantkit.self_traces import ORIGIN

    src = [r["n_tokens"] for r in rows if r["source"] != ORIGIN]
    return {"sources": {"samples": len(src), "tokens": sum(src)}, ORIGIN: traces}


def _largest_remainder(total: int, shares: list[float]) -> list[int]:
    """Integer counts summing to `total`, each within one of total * share."""
    exact = [total * s for s in shares]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(shares)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _thinking_record(th: Thinking, states: list[_SourceState]) -> CalibThinking:
    """The manifest's record of how chats were rendered: the template's thinking mode, the mode
    chats with reasoning were rendered in (on, or their reasoning dropped) and how many."""
    count = Counter[str]()
    for st in states:
        count.update({k: st.stats[k] for k in ("samples_with_reasoning", "chats_with_reasoning",
                                              "reasoning_dropped")})
    return {"template": th.to_dict(), "without_reasoning": "auto",
            "with_reasoning": "on" if th.thinks else "dropped (no thinking mode)",
            "template_kwargs_on": th.with_mode([], "on")[1] if th.thinks else None,
            "samples_with_reasoning": count["samples_with_reasoning"],
            "chats_with_reasoning": count["chats_with_reasoning"],
            "reasoning_dropped": count["reasoning_dropped"]}


def _render(doc: Document, tok: Any, th: Thinking) -> tuple[list[int], str]:
    """Token ids as the model will see them: chats through the model's own chat template, with
    thinking on where a chat carries reasoning and the model thinks (else the reasoning is
    dropped); a chat without reasoning in the template's default mode."""
    if doc.messages is not None and tok.chat_template and doc.reasoning and th.thinks:
        text = render_with_reasoning(tok.apply_chat_template, th, list(doc.messages),
                                     doc.reasoning)
        return tok(text, add_special_tokens=False)["input_ids"], "chat_template, thinking on"
    if doc.messages is not None and tok.chat_template:
        msgs = [{"role": r, "content": c} for r, c in doc.messages]
        text = tok.apply_chat_template(msgs, tokenize=False)
        # The template already holds BOS and special tokens; adding them again would double BOS.
        return tok(text, add_special_tokens=False)["input_ids"], "chat_template"
    if doc.messages is not None:
        text = "\n".join(f"{r}: {c}" for r, c in doc.messages)
        return tok(text)["input_ids"], "plain (model has no chat template)"
    return tok(doc.text)["input_ids"], "plain"


def _fill_source(st: _SourceState, tok: Any, th: Thinking, sep: int, min_tokens: int,
                 max_tokens: int, seed: str, banned: set[int], seen_exact: set[str],
                 lsh: _NearDup) -> None:
    """Read, filter and pack one source's documents until its quota is met (or it runs dry)."""
    docs = read_documents(st.spec)
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)  # by position, not path: a moved folder gives the same set
    buf: list[int] = []
    buf_reasons = False  # the packing buffer holds a chat with reasoning
    renderings: set[str] = set()
    for i in console.progress(order, f"reading {st.spec.location}", total=len(order)):
        if len(st.samples) >= st.quota:
            break
        doc = docs[i]
        st.stats["documents_read"] += 1
        norm = " ".join(doc.text.lower().split())
        key = hashlib.sha256(norm.encode()).hexdigest()
        if key in seen_exact:
            st.stats["dropped_exact_duplicate"] += 1
            continue
        seen_exact.add(key)
        words = re.findall(r"\w+", norm)
        if banned and banned & _ngram_hashes(words):
            st.stats["dropped_excluded"] += 1
            continue
        if lsh.is_duplicate(words, key):
            st.stats["dropped_near_duplicate"] += 1
            continue
        ids, how = _render(doc, tok, th)
        renderings.add(how)
        st.stats["documents_used"] += 1
        reasons = bool(doc.reasoning)
        if reasons:
            st.stats["chats_with_reasoning" if th.thinks else "reasoning_dropped"] += 1
        if len(ids) >= min_tokens:
            st.stats["cut_at_max_tokens"] += len(ids) > max_tokens
            if reasons and th.thinks:
                st.stats["samples_with_reasoning"] += 1
            st.samples.append(ids[:max_tokens])
            continue
        buf = buf + [sep] + ids if buf else list(ids)
        buf_reasons = buf_reasons or reasons
        if len(buf) >= min_tokens:
            st.stats["packed_samples"] += 1
            if buf_reasons and th.thinks:
                st.stats["samples_with_reasoning"] += 1
            st.samples.append(buf[:max_tokens])
            buf, buf_reasons = [], False
    st.rendering = " + ".join(sorted(renderings)) or "none"


class _NearDup:
    """MinHash LSH over word 5-gram shingles: documents above ~0.8 Jaccard are near-duplicates."""

    def __init__(self, seed: int) -> None:
        from datasketch import MinHashLSH

        self.lsh = MinHashLSH(threshold=0.8, num_perm=64)
        self.seed = seed

    def is_duplicate(self, words: list[str], key: str) -> bool:
        from datasketch import MinHash

        shingles = {" ".join(words[i:i + 5]).encode() for i in range(max(1, len(words) - 4))}
        mh = MinHash(num_perm=64, seed=self.seed)
        mh.update_batch(list(shingles))
        if self.lsh.query(mh):
            return True
        self.lsh.insert(key, mh)
        return False


def _ngram_hashes(words: list[str]) -> set[int]:
    n = NGRAM_EXCLUDE
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


def _ngrams_of_files(files: list[Path]) -> set[int]:
    """13-gram hashes of every document of the evaluation sets to keep out of calibration."""
    grams: set[int] = set()
    for f in files:
        for doc in read_documents(parse_source(str(f))):
            grams |= _ngram_hashes(re.findall(r"\w+", doc.text.lower()))
    return grams


def _stats(states: list[_SourceState], rows: list[SampleRow], lo: int, hi: int) -> CalibStats:
    lengths = [r["n_tokens"] for r in rows]
    step = max(1, (hi - lo) // 8)
    edges = list(range(lo, hi + 1, step))
    hist = Counter(min((n - lo) // step, len(edges) - 1) for n in lengths)
    return {
        "per_source": {st.spec.location: {**dict(sorted(st.stats.items())),
                                          "samples": len(st.samples), "rendering": st.rendering}
                       for st in states},
        "mix": {st.spec.location: {"requested_share": round(st.share, 6), "requested": st.quota,
                                   "actual": len(st.samples),
                                   "actual_share": round(len(st.samples) / max(1, len(rows)), 6)}
                for st in states},
        "token_length": {"min": min(lengths), "max": max(lengths),
                         "mean": round(sum(lengths) / len(lengths), 2),
                         "histogram": [{"from": edges[b], "count": hist.get(b, 0)}
                                       for b in range(len(edges))]},
    }


def target_match(target: Path, rows: list[SampleRow], tok: Any) -> TargetMatch:
    """How alike the calibration and target token distributions are (Jensen-Shannon, in bits)."""
    calib = Counter(t for r in rows for t in r["input_ids"])
    tgt: Counter[int] = Counter()
    th = tokenizer_thinking(tok)
    for doc in read_documents(parse_source(str(target))):
        tgt.update(_render(doc, tok, th)[0])
    nc, nt = sum(calib.values()), sum(tgt.values())
    jsd = 0.0
    for t in calib.keys() | tgt.keys():
        p, q = calib.get(t, 0) / nc, tgt.get(t, 0) / nt
        m = (p + q) / 2
        jsd += (p * math.log2(p / m) if p else 0.0) + (q * math.log2(q / m) if q else 0.0)
    jsd /= 2
    missing = [t for t, _ in tgt.most_common() if t not in calib]
    coverage = sum(c for t, c in tgt.items() if t in calib) / nt
    return {"js_divergence": round(jsd, 4), "target_token_coverage": round(coverage, 4),
            "missing_top_tokens": [tok.decode([t]) for t in missing[:20]],
            "poor": jsd > POOR_MATCH_JSD, "poor_threshold_jsd": POOR_MATCH_JSD,
            "target_tokens": nt}


@dataclass(frozen=True)
class CalibrationSet:
    """A calibration set read back from disk."""

    path: Path
    manifest: CalibManifest
    input_ids: list[list[int]]
    sha256: str


def load_calibration_set(path: Path) -> CalibrationSet:
    """Read and check calib_sets/NAME: files present, JSON intact, samples hash as recorded."""
    samples, manifest_path = path / SAMPLES_FILE, path / MANIFEST_FILE
    if not samples.is_file() or not manifest_path.is_file():
        raise BadInput(f"{path} is not a calibration set (needs {SAMPLES_FILE} and {MANIFEST_FILE})",
                       "make one with `quantkit calibrate`")
    raw = samples.read_bytes()
    try:
        manifest = json.loads(manifest_path.read_text())
        rows = [json.loads(line) for line in raw.decode().splitlines()]
        ids = [r["input_ids"] for r in rows]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise BadInput(f"calibration set {path} is corrupt ({type(exc).__name__})",
                       "rebuild it with `quantkit calibrate --force`") from exc
    digest = sha256_bytes(raw)
    if manifest.get("samples_sha256") != digest or not ids:
        raise BadInput(f"calibration set {path} does not match its manifest (edited or truncated)",
                       "rebuild it with `quantkit calibrate --force`")
    return CalibrationSet(path, manifest, ids, digest)


def describe_calibration(folder: Path, domain_set: str | None, tokenizer_dir: Path
                         ) -> dict[str, Any] | None:
    """A calibration set's manifest and stats, and its match to a domain set (for reports);
    None where the folder is gone or holds no calibration set."""
    if not (folder / MANIFEST_FILE).is_file():
        return None
    try:
        info: dict[str, Any] = {"path": str(folder),
                                "manifest": json.loads((folder / MANIFEST_FILE).read_text())}
        if (folder / STATS_FILE).is_file():
            info["stats"] = json.loads((folder / STATS_FILE).read_text())
    except (ValueError, OSError):  # damaged since it was used: the report goes without it
        return None
    info["target_match"] = None
    if domain_set is not None:
        from quantkit.models import load_tokenizer

        rows = [json.loads(x) for x in (folder / SAMPLES_FILE).read_text().splitlines()]
        info["target_match"] = target_match(Path(domain_set), rows, load_tokenizer(tokenizer_dir))
    return info
