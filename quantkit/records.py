"""quantkit's JSON records as their files hold them, as TypedDicts: `quantkit bench`'s
results.json (each level, its repeats, the knee, the roofline, the settings), a model's speed as
`quantkit auto` and `quantkit.speed` measure it, results.json's and auto.json's records of the
contract's dataclasses (quantkit.contract reads and writes them), and a calibration set's
samples.jsonl rows, stats.json and the parts of its manifest.json (quantkit.calib writes them,
`quantkit calibrate` and `quantkit inspect` print them). Pure: no logic, the floor the contract,
quantkit.loadtest, quantkit.roofline and quantkit.calib stand on."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class UsageRecord(TypedDict):
    """What a phase cost (meter.Usage): wall seconds, peak resident GiB of the process and its
    children, peak GPU GiB in use (None without a GPU)."""

    seconds: float
    peak_rss_gib: float
    peak_gpu_gib: float | None


class Ratio(TypedDict):
    """How many times one speed another is, with its interval (None: too few figures a side):
    loadtest.stats.ratio_interval's answer."""

    ratio: float
    ci: list[float] | None


class Distribution(TypedDict):
    """P50, P99 and mean of one latency over a level's counted requests (seconds; None: none)."""

    p50: float | None
    p99: float | None
    mean: float | None


class GpuWindow(TypedDict):
    """How busy the serving GPU was over one repeat (gpu.BusyLog.window): the mean share of
    time a kernel ran (%), the mean SM clock (MHz; None where nvidia-smi gives none), readings."""

    busy_pct: float
    sm_mhz: float | None
    samples: int


class BenchRow(TypedDict):
    """One repeat of one concurrency level of `quantkit bench` (loadtest.stats.summarize_level):
    requests, errors, throughput and the latency distributions."""

    concurrency: int
    requests: int
    completed: int
    errors: int
    error_messages: list[str]
    no_text: int
    wall_s: float | None
    held_s: float | None
    output_tokens: int
    tokens_counted_from: str | None
    request_throughput: float | None
    output_token_throughput: float | None
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    gpu: NotRequired[GpuWindow | None]  # where the server's GPU is this machine's


class BenchRepeat(TypedDict):
    """One repeat's figures in a level of results.json (`repeats`)."""

    seed: int
    requests: int
    errors: int
    wall_s: float | None
    output_tokens: int
    request_throughput: float | None
    output_token_throughput: float | None
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    gpu_busy_pct: NotRequired[float | None]  # (None: not read: no GPU here, a remote server)


class BenchLevel(BenchRow):
    """One level of `quantkit bench`'s results.json (loadtest.stats.combine_repeats): the
    distributions over every repeat's requests, the throughputs the median of the repeats, the
    95% interval (`X_ci`) and spread (`X_spread`) of throughput, TTFT P50 and TPOT P50."""

    repeats: list[BenchRepeat]
    output_token_throughput_ci: list[float] | None
    output_token_throughput_spread: float | None
    ttft_p50_s: float | None
    ttft_p50_s_ci: list[float] | None
    ttft_p50_s_spread: float | None
    tpot_p50_s: float | None
    tpot_p50_s_ci: list[float] | None
    tpot_p50_s_spread: float | None
    unsteady: bool
    gpu_busy_pct: NotRequired[float | None]  # the median of the repeats' (None: not read)


class Knee(TypedDict):
    """The highest level worth running (loadtest.stats.find_knee); concurrency None when even
    the lowest broke a target."""

    concurrency: int | None
    limited_by: str | None
    reason: str


class RooflineRecord(TypedDict):
    """roofline.Roofline as results.json holds it."""

    gpu: str
    bandwidth_tbs: float
    weight_bytes: int
    kv_bytes: int
    context: int
    floor_s: float
    tpot_s: float
    share: float


class BenchSettings(TypedDict):
    """How `quantkit bench` measured (results.json's settings)."""

    requests: int | None
    concurrency: list[int]
    mix: dict[str, float]
    max_tokens: dict[str, int]
    temperature: int
    seed: int
    repeats: int
    warmup: int | None
    min_seconds: float
    waves: int
    interval: str
    unsteady_spread: float
    timeout_s: float
    p99_ttft_target_s: float | None
    p99_e2e_target_s: float | None
    min_gain: float
    headroom: float
    sent_fields: dict[str, Any]  # the optional request fields the server took (open: JSON)
    tokens_per_word: float


class PromptStats(TypedDict):
    """One prompt class of a bench: requests a level, target and measured prompt tokens."""

    requests_per_level: float
    target_prompt_tokens: int
    mean_prompt_tokens: float | None
    max_tokens: int


class BenchTimings(TypedDict):
    warmup_s: float
    total_s: float


class BenchResults(TypedDict):
    """`quantkit bench`'s results.json."""

    schema_version: int
    kind: str
    quantkit_version: str
    created: str
    url: str
    endpoint: str
    model: str
    settings: BenchSettings
    prompts: dict[str, PromptStats]
    levels: list[BenchLevel]
    knee: Knee
    recommended_concurrency: int
    unsteady: list[int]
    timings: BenchTimings
    roofline: NotRequired[RooflineRecord | None]


class SpeedLevel(TypedDict):
    """One concurrency of a model's speed (quantkit.speed): the median of every repeat's output
    tokens/s, its 95% interval, each figure, their spread, TTFT and TPOT P50 in ms, failed
    requests, the serving GPU's busy share; `quantkit auto` adds the ratio to the original's at
    that concurrency."""

    concurrency: int
    output_tok_s: float | None
    ci: list[float] | None
    repeats: list[float]
    spread: float | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    failed: int
    gpu_busy_pct: NotRequired[float | None]  # the serving GPU's busy share, median of the repeats
    vs_original: NotRequired[Ratio | None]


class Speed(TypedDict, total=False):
    """One model's speed as quantkit.speed measured it (auto.json's candidate `speed` and its
    `reference`, the original's): per level, the score `output_tok_s` (the geometric mean over
    the levels), each repeat's score, their interval and spread, how it was measured (starts,
    order, memory share, engine, its log, the URL); or `error` alone where its server did not
    come up. `quantkit auto` adds the ratio to the original's (`vs_original`)."""

    levels: list[SpeedLevel]
    output_tok_s: float | None
    repeats: list[float]
    ci: list[float] | None
    spread: float | None
    starts: int
    order: list[str]
    gpu_memory_utilization: float
    engine: str | None
    engine_log: str
    url: str | None
    error: str
    vs_original: Ratio | None


class TaskSecondsRecord(TypedDict, total=False):
    """TaskSeconds as results.json holds it (a side that was not timed is absent)."""

    baseline: float
    quantized: float
    baseline_cached: bool


class GateCheckRecord(TypedDict):
    """GateCheck as results.json holds it: no interval where nothing was measured."""

    task: str
    metric: str
    op: str
    limit: float
    value: float | None
    lo: NotRequired[float | None]
    hi: NotRequired[float | None]
    n: NotRequired[int]
    passed: bool
    too_small: bool
    note: NotRequired[str]


class GateDecisionRecord(TypedDict):
    verdict: str
    checks: list[GateCheckRecord]
    failing: list[str]
    causes: NotRequired[list[str]]


class CandidateMetricRecord(TypedDict):
    value: float | None
    lo: float | None
    hi: float | None
    limit: float
    op: str
    passed: bool
    note: NotRequired[str]


class CandidateRecord(TypedDict):
    """A Candidate as auto.json holds it."""

    name: str
    method: str | None
    bits: int | None
    group_size: int | None
    quant_type: str | None
    bits_per_weight: float | None
    size_bytes: int
    verdict: str | None
    metrics: dict[str, CandidateMetricRecord]
    seconds: float | None
    speed: NotRequired[Speed]
    reason: NotRequired[str]


class AutoRecord(TypedDict):
    """auto.json: AutoResult; load, prefer and reference only where --load measured speed."""

    method: str
    candidates: list[CandidateRecord]
    chosen: CandidateRecord | None
    skipped: list[str]
    larger: list[str]
    out: str | None
    report: str | None
    load: NotRequired[list[int] | None]
    prefer: NotRequired[str | None]
    reference: NotRequired[Speed | None]


# -- a calibration set (quantkit.calib) ------------------------------------------------------------

class SampleRow(TypedDict):
    """One sample of samples.jsonl (its `id` put first as the file is written): the source it
    came from, how it was rendered, its token ids and their text."""

    source: str
    rendering: str
    n_tokens: int
    input_ids: list[int]
    text: str


class TokenizerRecord(TypedDict):
    """The tokenizer a calibration set was made with (manifest.json's `tokenizer`)."""

    name_or_path: str
    fingerprint: str
    vocab_size: int
    chat_template: bool


class CalibSource(TypedDict):
    """One source of a calibration set (manifest.json's `sources`): its spec, where it was read,
    its share of the mix, its content's sha256, how its documents were rendered."""

    spec: str
    location: str
    weight: float
    sha256: str
    rendering: str


class FileHash(TypedDict):
    path: str
    sha256: str


class CalibParameters(TypedDict):
    """How a calibration set was made (manifest.json's `parameters`): --exclude and --target
    files with their sha256 (target None without one)."""

    samples: int
    min_tokens: int
    max_tokens: int
    seed: int
    separator_token_id: int
    exclude: list[FileHash]
    target: FileHash | None


class Counts(TypedDict):
    samples: int
    tokens: int


class SelfTracesRecord(TypedDict):
    """The self-traces of a set (quantkit.self_traces.record): prompts answered, samples and
    tokens they gave, thinking on or off, the sampling settings."""

    prompts: int
    samples: int
    tokens: int
    thinking: str
    temperature: float
    top_p: float
    max_new_tokens: int


# Samples and tokens from the sources and from the model's own answers (--self-traces): the
# manifest's and stats.json's `origins` (a key with a hyphen: the functional form).
Origins = TypedDict("Origins", {"sources": Counts, "self-traces": SelfTracesRecord})


class MixShare(TypedDict):
    """One source's share of a set (stats.json's `mix`): asked for and got."""

    requested_share: float
    requested: int
    actual: int
    actual_share: float


HistogramBin = TypedDict("HistogramBin", {"from": int, "count": int})  # `from`: a keyword


class TokenLength(TypedDict):
    """The samples' lengths in tokens (stats.json's `token_length`): 9 bins from min_tokens."""

    min: int
    max: int
    mean: float
    histogram: list[HistogramBin]


class TargetMatch(TypedDict):
    """How alike the set's and a target's token distributions are (calib.target_match)."""

    js_divergence: float
    target_token_coverage: float
    missing_top_tokens: list[str]
    poor: bool
    poor_threshold_jsd: float
    target_tokens: int


class CalibStats(TypedDict):
    """A calibration set's stats.json: per source its counters (documents read, dropped, used,
    samples packed...: only those that counted, sorted) with its samples and rendering, the mix,
    the lengths, the match to --target and the origins with --self-traces."""

    per_source: dict[str, dict[str, int | str]]
    mix: dict[str, MixShare]
    token_length: TokenLength
    target_match: NotRequired[TargetMatch]
    origins: NotRequired[Origins]


class ReasoningCounts(TypedDict):
    """Chats with reasoning and how they were rendered (`quantkit calibrate`'s `reasoning`)."""

    samples_with_reasoning: int
    chats_with_reasoning: int
    reasoning_dropped: int
    with_reasoning: str


class CalibSummary(TypedDict):
    """What `quantkit calibrate` returns and prints (calib.calibrate)."""

    out: str
    samples: int
    tokens: int
    mix: dict[str, MixShare]
    target_match: TargetMatch | None
    reasoning: ReasoningCounts
    origins: NotRequired[Origins]
