"""The layer-by-layer loop GPTQ and AWQ share: capture the inputs of decoder layer 0, then per
layer move it to the device, quantize it, save its shard, and feed its quantized outputs onward."""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantkit import console
from quantkit.artifact import MANIFEST, Manifest, Source, folder_size, library_versions
from quantkit.errors import EngineError
from quantkit.recipe import QuantizeConfig


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
    import os
    import shutil

    from quantkit.fsutil import apply_umask, check_output_dir
    from quantkit.models import weights_sha256
    from quantkit.quantize.families import family_for
    from quantkit.quantize.layers import UPGRADE_BITS, QuantSpec
    from quantkit.quantize.preflight import (
        check_group_size,
        check_memory,
        preflight_calibration,
        resolve_device,
    )

    started = time.time()
    spec = QuantSpec.from_config(cfg)
    check_output_dir(out, force)
    ref, info, cset = preflight_calibration(model, calib)
    family = family_for(info.model_type)
    check_group_size(info.linear_shapes, family.linears, cfg.group_size)
    dev = resolve_device(cfg.device)
    if not cfg.sym:
        console.warn("--asym checkpoints load in vLLM, but transformers with compressed-tensors "
                     "0.20 rejects their packed zero points (upstream bug); validate with --sym")
    n_tokens = sum(map(len, cset.input_ids))
    check_memory(info, n_tokens, dev)

    import torch

    from quantkit.methods import layer_quantizer
    from quantkit.models import load_model
    from quantkit.quantize.capture import capture_inputs, next_inputs
    from quantkit.quantize.checkpoint import (
        finish,
        layer_tensors,
        load_layer,
        read_state,
        start_partial,
        write_layer,
    )
    from quantkit.quantize.layers import gptq_layer, run_layer

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    timings: dict[str, float] = {}
    clock = _Clock(timings, dev)
    # one thread hashes the source while this one loads it, another writes shards while the
    # next layer is quantized (it only touches CPU tensors, so CUDA graph capture is undisturbed)
    with ThreadPoolExecutor(1) as hasher, ThreadPoolExecutor(1) as writer:
        sha = hasher.submit(weights_sha256, ref.path)
        dtype = info.main_dtype()
        with clock("load"):
            lm = load_model(ref.path,
                            dtype={"F32": "float32", "F16": "float16"}.get(dtype or "", "bfloat16"))
        with clock("hash_wait"):
            source_sha = sha.result()
        layers = lm.get_submodule(family.layers_attr)
        sensitivity = None
        if cfg.w8_groups:
            from quantkit.quantize.sensitivity import cached_sensitivity, most_sensitive

            with clock("sensitivity"):
                sensitivity = cached_sensitivity(lm, family, cset.input_ids, spec, dev,
                                                 cfg.sensitivity_tokens, source_sha, cset.sha256)
            upgrade = most_sensitive(sensitivity["kld"],
                                     cfg.upgrade_count(len(sensitivity["kld"])))
            spec = dataclasses.replace(spec, upgrade=upgrade)
            sensitivity.update(upgraded=list(upgrade), upgrade_bits=UPGRADE_BITS)
            console.log(f"--w8-groups {cfg.w8_groups}: {len(upgrade)} of "
                        f"{len(sensitivity['kld'])} linear groups at {UPGRADE_BITS} bits "
                        f"({', '.join(upgrade)})")
        partial = out.parent / f".{out.name}.partial"
        settings = {**spec.__dict__, "upgrade": list(spec.upgrade),  # as JSON reads it back
                    "hessians": cfg.hessians}
        key = {"source_sha256": source_sha, "calib_sha256": cset.sha256, "spec": settings}
        done = start_partial(partial, key, resume)
        if done:
            console.log(f"resuming: {done} of {len(layers)} layers already quantized")
        batch_tokens = cfg.batch_tokens or (16384 if dev.type == "cuda" else 4096)
        shared = None  # --hessians original: every layer's Hessians from one original pass
        if cfg.hessians == "original":
            from quantkit.quantize.hessians import original_hessians

            with clock("hessians"):
                shared = original_hessians(lm, family, cset.input_ids, dev, batch_tokens,
                                           (source_sha, cset.sha256, str(dev), batch_tokens))
            batches = []
        else:
            with clock("capture"):
                batches = capture_inputs(lm, family.layers_attr, cset.input_ids, dev, batch_tokens)
        writes: list[Future[None]] = []
        worst_seen = (0.0, "")  # the terminal gets one line for all layers, the log file each
        try:
            for i in console.progress(range(len(layers)), f"{cfg.method} layers", total=len(layers)):
                with clock("move"):
                    layer = layers[i].to(dev)
                if i < done:
                    load_layer(partial, i, family.layers_attr, layer, family, spec)
                else:
                    with clock("quantize"):
                        results = (gptq_layer(layer, family, [], spec, i, shared[i])
                                   if shared is not None else
                                   layer_quantizer(cfg.method)(layer, family, batches, spec, i))
                    with clock("pack"):
                        tensors = layer_tensors(i, family.layers_attr, layer, family, results, spec)
                    errors = {n: r.error for n, r in results.items()}
                    writes.append(writer.submit(write_layer, partial, i, tensors, errors))
                    name, worst = max(errors.items(), key=lambda kv: kv[1])
                    console.detail(f"layer {i}: worst relative output error {worst:.2e} ({name})")
                    if worst >= worst_seen[0]:
                        worst_seen = (worst, f"layer {i} {name}")
                if shared is None:  # the next layer's inputs, from this quantized layer
                    with clock("forward"):
                        outs = run_layer(layer, batches)
                    batches = next_inputs(outs, batches)
                with clock("move"):
                    layer.to("cpu")
                while writes and writes[0].done():
                    writes.pop(0).result()  # a failed write stops the run at once
            del batches
            if worst_seen[1]:
                console.log(f"{cfg.method}: {len(layers) - done} layers quantized, worst relative "
                            f"output error {worst_seen[0]:.2e} ({worst_seen[1]}); per layer in "
                            f"{MANIFEST} and the command's log")
            with clock("write_wait"):
                for w in writes:
                    w.result()
            with clock("finish"):
                finish(partial, lm, family, ref.path, spec, len(layers))
        except OSError as exc:  # a full disk or a folder made read-only while we ran
            for w in writes:
                w.cancel()
            kept = read_state(partial).get("layers_done", 0)
            raise EngineError(f"writing {partial} failed after {kept} finished layers: "
                              f"{exc.strerror or exc}",
                              f"{partial} is kept: free space or fix permissions, then rerun with "
                              "--resume") from exc
    manifest = Manifest(
        checkpoint="compressed-tensors", format="pack-quantized", method=cfg.method,
        source=Source(spec=model, path=str(ref.path), weights_sha256=source_sha,
                      architecture=info.architecture, parameters=info.parameters),
        calibration={"path": str(calib), "samples_sha256": cset.sha256,
                     "samples": len(cset.input_ids), "tokens": n_tokens},
        parameters={**settings, "device": dev.type},
        layer_errors=read_state(partial)["errors"],
        versions=library_versions("torch", "transformers", "compressed-tensors"),
        wall_time_s=round(time.time() - started, 2), peak_memory=peak_memory(dev),
        timings={k: round(v, 2) for k, v in timings.items()}, sensitivity=sensitivity,
        size_bytes={"before": folder_size(ref.path), "after": folder_size(partial)})
    manifest.write(partial)
    (partial / "resume.json").unlink()
    apply_umask(partial)
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return manifest
