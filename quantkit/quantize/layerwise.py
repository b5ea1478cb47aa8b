"""The layer-by-layer loop GPTQ and AWQ share: capture the inputs of decoder layer 0, then per
layer move it to the device, quantize it, save its shard, and feed its quantized outputs onward."""

from __future__ import annotations

import functools
import resource
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit import console
from quantkit.artifact import MANIFEST, Manifest, Sensitivity, Source, folder_size, library_versions
from quantkit.config import QuantizeConfig
from quantkit.errors import BadInput, EngineError

if TYPE_CHECKING:
    from quantkit.calib import CalibrationSet
    from quantkit.models import ModelIdentity, ModelInfo, ModelRef
    from quantkit.quantize import QuantizePipeline
    from quantkit.quantize.families import Family
    from quantkit.quantize.layers import Batch, ExpertQuantizer, QuantSpec
    from quantkit.quantize.stream import LayerReader


class _Clock:
    """Seconds per phase, summed over layers (`timings` in the manifest); CUDA work is waited
    for at each phase's end so it is booked where it ran."""

    def __init__(self, timings: dict[str, float], dev: Any):
        self.timings, self.dev = timings, dev

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        import torch

        t = time.perf_counter()
        try:
            yield
        finally:
            if self.dev.type == "cuda":
                torch.cuda.synchronize(self.dev)
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - t


def peak_memory(dev: Any) -> dict[str, float]:
    """Peak CPU RSS and, on CUDA, peak allocated GPU memory (GiB)."""
    import torch

    peak = {"cpu_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}
    if dev.type == "cuda":
        peak["gpu_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
    return peak


def quantize_layerwise(*, model: str, cfg: QuantizeConfig, calib: Path, out: Path,
                       resume: bool, force: bool) -> Manifest:
    """GPTQ or AWQ, layer by layer, into the work folder `.OUT.partial`; renamed to `out` when
    complete (a killed run resumes from its last finished layer with `resume`)."""
    from quantkit.fsutil import check_output_dir

    started = time.time()
    check_output_dir(out, force)
    plan = plan_quantization(model, cfg, calib)
    clock = _Clock({}, plan.dev)
    # one thread hashes the source while this one loads it, another writes shards while the
    # next layer is quantized (it only touches CPU tensors, so CUDA graph capture is undisturbed)
    with ThreadPoolExecutor(1) as hasher, ThreadPoolExecutor(1) as writer:
        loaded = load_source(plan, hasher, clock)
        spec, sensitivity = choose_upgrades(cfg, plan, loaded, clock)
        work = open_work_folder(out, spec, plan, loaded, resume)
        # every layer kept by the run that stopped (at the checkpoint's write): nothing to feed
        inputs = (layer_inputs(cfg, plan, loaded, clock, out.parent)
                  if work.done < len(loaded.layers) else LayerInputs(shared=None, batches=[]))
        quantize_layers(spec, plan, loaded, work, inputs, writer, clock)
    manifest = layerwise_manifest(model, calib, cfg, plan, loaded, work, clock, sensitivity,
                                  started)
    publish(manifest, work.path, out)
    return manifest


@dataclass(frozen=True)
class Plan:
    """What the checks before any work settled: the model, its facts and layer family, the
    calibration set and its token count, the device."""

    ref: ModelRef
    info: ModelInfo
    family: Family
    cset: CalibrationSet
    n_tokens: int
    dev: Any  # torch.device
    dtype: str  # the source's floating dtype ("bfloat16"), which the checkpoint keeps
    stream: bool  # read each layer from the shards when its turn comes (quantize.stream)
    # the method's quantizers, looked up once: a decoder layer's (a LayerQuantizer; one with the
    # `hessians` trait also takes hessians=) and, for a mixture-of-experts model, an expert's
    quantize_layer: Callable[..., Any]
    quantize_expert: ExpertQuantizer | None = None
    offload: bool = False  # the calibration activations wait on disk (quantize.activations)

    @property
    def compute_dtype(self) -> str:
        """The dtype the work runs in: the source's on a GPU; float32 on a CPU, also where it
        multiplies bf16 in hardware: the demo's Hessians and sensitivity from bf16 passes
        doubled its W4g32+50% candidate's KL (0.0553 against 0.0272, docs/BENCHMARKS.md)."""
        return self.dtype if self.dev.type == "cuda" else "float32"


@dataclass(frozen=True)
class Loaded:
    """The source model in memory, its decoder layers and its identity (weights, config and
    tokenizer: the caches of its sensitivity and Hessians and the resume key are keyed by it)."""

    lm: Any  # the transformers model (with --stream, its decoder layers hold no weights)
    layers: Any  # its decoder layers (an nn.ModuleList)
    source: ModelIdentity
    reader: LayerReader | None = None  # reads each layer from the shards (--stream)


@dataclass(frozen=True)
class WorkFolder:
    """The `.OUT.partial` folder, the settings its resume key and the manifest record, and how
    many layers a resumed run found finished there."""

    path: Path
    settings: dict[str, Any]
    done: int


@dataclass
class LayerInputs:
    """What feeds each layer: with --hessians original every layer's Hessians from one pass of
    the original model (`shared`); otherwise the current layer's input batches, replaced by its
    quantized outputs as the loop goes, so one layer's activations are held at a time."""

    shared: list[Any] | None
    batches: list[Batch]
    keep: Callable[[Any], Any] = lambda t: t  # where a batch's activations wait (offload.keeper)


def plan_quantization(model: str, cfg: QuantizeConfig, calib: Path) -> Plan:
    """The model, calibration set, group size, device and memory checks, before any work, and
    the method's quantizers."""
    from quantkit.method_registry import quantizers
    from quantkit.quantize.pack import check_writer
    from quantkit.quantize.preflight import (
        check_experts,
        check_fp8,
        check_group_size,
        check_memory,
        preflight_calibration,
        resolve_device,
    )
    from quantkit.quantize.structure import read_structure

    ref, info, cset = preflight_calibration(model, calib)
    check_writer()
    family = read_structure(ref.path)
    if family.experts is not None:
        check_experts(cfg, sum(map(len, cset.input_ids)))
    check_group_size(info.linear_shapes, family.quantized, cfg.weight_group_size)
    if cfg.activation_format == "fp8":
        check_fp8(info.linear_shapes, family, cfg)
    dev = resolve_device(cfg.device)
    if not cfg.sym:
        console.warn("--asym checkpoints load in vLLM, but transformers with compressed-tensors "
                     "0.20 rejects their packed zero points (upstream bug); validate with --sym")
    n_tokens = sum(map(len, cset.input_ids))
    # only the layer-by-layer path holds activations between layers (--hessians original does not)
    offload = check_memory(info, n_tokens, dev,
                           "memory" if cfg.original_hessians else cfg.activation_store)
    dtype = {"F32": "float32", "F16": "float16"}.get(info.main_dtype() or "", "bfloat16")
    quantize_layer, quantize_expert = quantizers(cfg.method, family.experts is not None)
    return Plan(ref=ref, info=info, family=family, cset=cset, n_tokens=n_tokens, dev=dev,
                dtype=dtype, stream=cfg.stream and not cfg.original_hessians
                and not cfg.w8_groups, quantize_layer=quantize_layer,
                quantize_expert=quantize_expert, offload=offload)


def load_source(plan: Plan, hasher: ThreadPoolExecutor, clock: _Clock) -> Loaded:
    """Load the model in the plan's compute dtype while `hasher` hashes its weights: with
    `plan.stream` its skeleton and the tensors outside the decoder layers (each layer is read
    when its turn comes), else the whole model. `hasher` computes the model's identity."""
    import torch

    from quantkit.models import load_model, model_identity

    if plan.dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(plan.dev)
    sha = hasher.submit(model_identity, plan.ref.path)
    reader = None
    with clock("load"):
        opened = None
        if plan.stream:
            from quantkit.quantize.stream import open_skeleton

            opened = open_skeleton(plan.ref.path, plan.family, plan.compute_dtype)
            if opened is None:
                console.log("--stream: the checkpoint's tensor names need transformers' own "
                            "conversion; loading the whole model instead")
        if opened is not None:
            lm, reader = opened
        else:
            lm = load_model(plan.ref.path, dtype=plan.compute_dtype)
    layers = lm.get_submodule(plan.family.layers_attr)
    from quantkit.quantize.structure import check_uniform_layers

    try:
        check_uniform_layers(layers, plan.info.model_type)
    except BadInput:
        if reader is not None:
            reader.close()
        sha.cancel()
        raise
    with clock("hash_wait"):
        source = sha.result()
    return Loaded(lm=lm, layers=layers, source=source, reader=reader)


def choose_upgrades(cfg: QuantizeConfig, plan: Plan, loaded: Loaded, clock: _Clock
                    ) -> tuple[QuantSpec, Sensitivity | None]:
    """The spec to quantize to and, with --w8-groups, the per-group sensitivity that chose the
    groups kept at 8 bits (None without)."""
    import dataclasses

    from quantkit.quantize.layers import UPGRADE_BITS, QuantSpec

    spec = QuantSpec.from_config(cfg, store_dtype=plan.dtype)
    if not cfg.w8_groups:
        return spec, None
    from quantkit.quantize.sensitivity import cached_sensitivity

    with clock("sensitivity"):
        sensitivity = cached_sensitivity(loaded.lm, plan.family, plan.cset.input_ids, spec,
                                         plan.dev, cfg.sensitivity_tokens, loaded.source.sha256,
                                         plan.cset.sha256, plan.compute_dtype,
                                         cfg.upgrade_count)
    upgrade = sensitivity.get("upgraded", [])
    console.log(f"--w8-groups {cfg.w8_groups}: {len(upgrade)} of "
                f"{len(sensitivity['kld'])} linear groups at {UPGRADE_BITS} bits "
                f"({', '.join(upgrade)})")
    return dataclasses.replace(spec, upgrade=tuple(upgrade)), sensitivity


def open_work_folder(out: Path, spec: QuantSpec, plan: Plan, loaded: Loaded,
                     resume: bool) -> WorkFolder:
    """Start `.OUT.partial`, or with `resume` keep the layers a run with the same source,
    calibration set and settings finished there."""
    from quantkit.fsutil import work_dir
    from quantkit.quantize.checkpoint import ResumeKey, start_partial

    partial = work_dir(out, "partial")
    settings = spec.settings()
    key: ResumeKey = {"source_sha256": loaded.source.sha256, "calib_sha256": plan.cset.sha256,
                      "spec": settings, "compute_dtype": plan.compute_dtype}
    done = start_partial(partial, key, resume)
    if done:
        console.log(f"resuming: {done} of {len(loaded.layers)} layers already quantized")
    return WorkFolder(path=partial, settings=settings, done=done)


def layer_inputs(cfg: QuantizeConfig, plan: Plan, loaded: Loaded, clock: _Clock,
                 folder: Path) -> LayerInputs:
    """--hessians original: every layer's Hessians from one original pass; otherwise the inputs
    of decoder layer 0, captured (on disk in `folder` when `plan.offload`)."""
    from quantkit.quantize.hessians import BATCH_TOKENS

    batch_tokens = cfg.batch_tokens or BATCH_TOKENS["cuda" if plan.dev.type == "cuda" else "cpu"]
    if cfg.original_hessians:
        from quantkit.quantize.hessians import cache_key, original_hessians

        with clock("hessians"):
            key = cache_key(loaded.source.sha256, plan.cset.sha256, plan.dev, batch_tokens,
                            plan.compute_dtype)
            shared = original_hessians(loaded.lm, plan.family, plan.cset.input_ids, plan.dev,
                                       batch_tokens, key)
        return LayerInputs(shared=shared, batches=[])
    from quantkit.quantize.capture import capture_inputs
    from quantkit.quantize.offload import keeper

    keep = keeper(folder if plan.offload else None)
    with clock("capture"):
        batches = capture_inputs(loaded.lm, plan.family.layers_attr, plan.cset.input_ids,
                                 plan.dev, batch_tokens, keep)
    return LayerInputs(shared=None, batches=batches, keep=keep)


def quantize_layers(spec: QuantSpec, plan: Plan, loaded: Loaded, work: WorkFolder,
                    inputs: LayerInputs, writer: ThreadPoolExecutor, clock: _Clock) -> None:
    """Per layer: move it to the device, restore it (resumed) or quantize it and hand its shard
    to `writer`, feed its outputs onward; then the non-layer tensors. A failed write keeps the
    work folder for --resume."""
    from quantkit.quantize.checkpoint import finish, read_state

    layers, partial, method = loaded.layers, work.path, spec.method
    writes: list[Future[None]] = []
    worst_seen = (0.0, "")  # the terminal gets one line for all layers, the log file each
    # restored layers run only to feed the first unfinished one: none when all are finished
    todo = len(layers) if work.done < len(layers) else 0
    try:
        for i in console.progress(range(todo), f"{method} layers", total=todo):
            worst = _quantize_layer(i, spec, plan, loaded, work, inputs, writer,
                                    writes, clock)
            if worst is not None and worst[0] >= worst_seen[0]:
                worst_seen = worst
            while writes and writes[0].done():
                writes.pop(0).result()  # a failed write stops the run at once
        inputs.batches = []
        if loaded.reader is not None:
            loaded.reader.close()
        if worst_seen[1]:
            console.log(f"{method}: {len(layers) - work.done} layers quantized, worst relative "
                        f"output error {worst_seen[0]:.2e} ({worst_seen[1]}); per layer in "
                        f"{MANIFEST} and the command's log")
        with clock("write_wait"):
            for w in writes:
                w.result()
        with clock("finish"):
            finish(partial, loaded.lm, plan.family, plan.ref.path, spec, len(layers))
    except OSError as exc:  # a full disk or a folder made read-only while we ran
        for w in writes:
            w.cancel()
        kept = read_state(partial).get("layers_done", 0)
        raise EngineError(f"writing {partial} failed after {kept} finished layers: "
                          f"{exc.strerror or exc}",
                          f"{partial} is kept: free space or fix permissions, then rerun with "
                          "--resume") from exc


def _quantize_layer(i: int, spec: QuantSpec, plan: Plan, loaded: Loaded,
                    work: WorkFolder, inputs: LayerInputs, writer: ThreadPoolExecutor,
                    writes: list[Future[None]], clock: _Clock) -> tuple[float, str] | None:
    """Layer i, restored from the work folder or quantized, its outputs made the next layer's
    inputs, then (quantized) its shard's write appended to `writes`; its worst relative output
    error and where (None when restored)."""
    from quantkit.quantize.capture import next_inputs
    from quantkit.quantize.checkpoint import layer_tensors, load_layer, write_layer
    from quantkit.quantize.layers import run_layer

    family, shared, worst_here, reader = plan.family, inputs.shared, None, loaded.reader
    with clock("move"):
        if reader is None:
            layer = loaded.layers[i].to(plan.dev)
        else:
            layer = loaded.layers[i]
            reader.materialize(layer, i, plan.dev)
            if i + 1 < len(loaded.layers):
                reader.prefetch(loaded.layers[i + 1], i + 1)
    restored = i < work.done
    if restored:
        load_layer(work.path, i, family.layers_attr, layer, family, spec)
    else:
        with clock("quantize"):
            # --hessians original (the "hessians" trait): the Hessians replace the batches
            results = (plan.quantize_layer(layer, family, [], spec, i, hessians=shared[i])
                       if shared is not None else
                       plan.quantize_layer(layer, family, inputs.batches, spec, i))
        errors = {n: r.error for n, r in results.items()}
        coverage = None
        if family.experts is not None and plan.quantize_expert is not None:
            from quantkit.quantize.experts import expert_errors, quantize_experts

            with clock("experts"):
                routed, coverage = quantize_experts(plan.quantize_expert, layer, family.experts,
                                                    inputs.batches, spec)
            results.update(routed)
            errors.update(expert_errors(family.experts, routed))
        with clock("pack"):
            tensors = layer_tensors(i, family.layers_attr, layer, family, results, spec)
    if shared is None:  # the next layer's inputs, from this quantized layer
        with clock("forward"):
            forward = functools.partial(run_layer, layer, inputs.batches, inputs.keep)
            if spec.kv_fp8 and not restored:  # its attention seen: the KV cache's scales
                from quantkit.kvcache import layer_kv_scales

                outs, scales = layer_kv_scales(layer, f"{family.layers_attr}.{i}", forward)
                tensors.update(scales)
            else:
                outs = forward()
        inputs.batches = next_inputs(outs, inputs.batches)
    if not restored:
        writes.append(writer.submit(write_layer, work.path, i, tensors, errors,
                                    coverage.summary() if coverage is not None else None))
        name, worst = max(errors.items(), key=lambda kv: kv[1])
        console.detail(f"layer {i}: worst relative output error {worst:.2e} ({name})")
        worst_here = (worst, f"layer {i} {name}")
    with clock("move"):
        if reader is None:
            layer.to("cpu")
        else:
            reader.release(layer)
    return worst_here


def layerwise_manifest(model: str, calib: Path, cfg: QuantizeConfig, plan: Plan, loaded: Loaded,
                       work: WorkFolder, clock: _Clock, sensitivity: Sensitivity | None,
                       started: float) -> Manifest:
    """The artifact's manifest: source, calibration set, settings, per-layer errors, timings."""
    from quantkit.quantize.checkpoint import bits_per_weight, read_state
    from quantkit.quantize.experts import expert_coverage
    from quantkit.quantize.layers import linear

    ref, info, cset, dev = plan.ref, plan.info, plan.cset, plan.dev
    ex = plan.family.experts
    linear_params = sum(linear(layer, n).weight.numel() for layer in loaded.layers
                        for n in plan.family.linears) + sum(
        layer.get_parameter(key).numel() for layer in loaded.layers
        for key in (ex.fused_keys if ex else ()))
    bits, linear_bits = bits_per_weight(work.path, info.parameters, linear_params)
    return Manifest(
        checkpoint="compressed-tensors",
        format="float-quantized" if cfg.traits.float_weights else "pack-quantized", method=cfg.method,
        source=Source.of(model, ref.path, loaded.source, info),
        calibration={"path": str(calib), "samples_sha256": cset.sha256,
                     "samples": len(cset.input_ids), "tokens": plan.n_tokens},
        parameters={**work.settings, "device": dev.type, "compute_dtype": plan.compute_dtype,
                    "activations": "disk" if plan.offload else "memory"},
        layer_errors=read_state(work.path)["errors"],
        versions=library_versions("torch", "transformers", "compressed-tensors"),
        wall_time_s=round(time.time() - started, 2), peak_memory=peak_memory(dev),
        timings={k: round(v, 2) for k, v in clock.timings.items()}, sensitivity=sensitivity,
        size_bytes={"before": folder_size(ref.path), "after": folder_size(work.path)},
        bits_per_weight=bits, linear_bits_per_weight=linear_bits,
        structure=plan.family.describe(),
        experts=expert_coverage(read_state(work.path).get("experts", {}), cfg.expert_floor)
        if plan.family.experts else None)


def publish(manifest: Manifest, partial: Path, out: Path) -> None:
    """Write the manifest into the finished work folder, drop its resume state, rename it `out`."""
    import os
    import shutil

    from quantkit.fsutil import apply_umask

    manifest.write(partial)
    (partial / "resume.json").unlink()
    apply_umask(partial)
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)


if TYPE_CHECKING:  # Method.quantize's default, held against the Protocol quantize() calls it as
    _pipeline: QuantizePipeline = quantize_layerwise
