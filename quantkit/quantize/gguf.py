"""`quantize_gguf()`: HF model -> F16 GGUF -> importance matrix -> k-quant GGUF, verified in llama.cpp."""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from pathlib import Path
from typing import Any

from quantkit.artifact import ImatrixInfo, Manifest, Source, Verification, library_versions
from quantkit.config import QuantizeConfig
from quantkit.errors import BadInput, EngineError
from quantkit.fsutil import atomic_dir, check_output_dir, sha256_file

PROMPT = "The capital of France is"


def quantize_gguf(*, model: str, cfg: QuantizeConfig, calib: Path, out: Path,
                  resume: bool = False, force: bool = False) -> Manifest:
    """Convert, collect the imatrix, quantize and verify; write the artifact folder `out`.
    (`resume` has nothing to continue: the conversion and the imatrix are cached.)"""
    from quantkit.llamacpp_source import f16_gguf, llama_cpp_version
    from quantkit.models import model_identity
    from quantkit.quantize.preflight import preflight_calibration

    started = time.time()
    cfg.check()  # the quant type among them
    own = cfg.options()  # GGUFOptions (quantkit.methods.gguf)
    quant_type, use_imatrix, threads = own.quant_type.upper(), own.imatrix, own.threads
    heldout = Path(own.heldout) if own.heldout else None
    version = llama_cpp_version()
    check_output_dir(out, force)
    if heldout is not None and not Path(heldout).is_file():
        raise BadInput(f"held-out file {heldout} does not exist", "check the --heldout path")
    ref, info, cset = preflight_calibration(model, calib)
    timings: dict[str, float] = {}
    source = model_identity(ref.path)  # names the F16 conversion and the imatrix in the cache
    f16, convert_s = f16_gguf(ref.path, source.sha256)
    if convert_s is not None:
        timings["convert_s"] = convert_s
    with atomic_dir(out, force) as tmp:
        imatrix_file, imatrix_info = None, None
        if use_imatrix:
            t = time.time()
            imatrix_file = tmp / "imatrix.gguf"
            imatrix_info = _cached_imatrix(ref.path, source.sha256, cset, f16, imatrix_file)
            timings["imatrix_s"] = round(time.time() - t, 2)
        t = time.time()
        target = tmp / f"model-{quant_type}.gguf"
        _llama_quantize(f16, target, quant_type, imatrix_file, threads)
        timings["quantize_s"] = round(time.time() - t, 2)
        t = time.time()
        stats = tensor_stats(target, quant_type)
        verify = _verify(f16, target, heldout)
        timings["verify_s"] = round(time.time() - t, 2)
        manifest = Manifest(
            checkpoint="gguf", file=target.name, method=cfg.method,
            source=Source.of(model, ref.path, source, info),
            baseline_f16={"path": str(f16), "size_bytes": f16.stat().st_size},
            calibration={"path": str(calib), "samples_sha256": cset.sha256,
                         "samples": len(cset.input_ids)},
            parameters={"quant_type": quant_type, "imatrix": use_imatrix, "threads": threads},
            imatrix=imatrix_info, **stats, verification=verify,
            versions={**library_versions("torch", "transformers", "llama-cpp-python"),
                      "llama.cpp (llama-cpp-python sdist)": version},
            timings=timings, wall_time_s=round(time.time() - started, 2),
            size_bytes={"before": f16.stat().st_size, "after": target.stat().st_size})
        manifest.write(tmp)
    return manifest


def _cached_imatrix(model_dir: Path, source_sha: str, cset: Any, f16: Path, dest: Path
                    ) -> ImatrixInfo:
    """The importance matrix of this model and calibration set, computed once and cached (every
    k-quant type `quantkit auto` tries shares it)."""
    import json
    import shutil

    from quantkit.fsutil import atomic_dir, cache_fill
    from quantkit.models import quantkit_home

    cache = quantkit_home() / "imatrix" / f"{source_sha[:16]}-{cset.sha256[:16]}"
    with cache_fill(cache):
        if not (cache / "info.json").is_file():
            with atomic_dir(cache, force=True) as tmp:
                info = _imatrix(model_dir, source_sha, cset, f16, tmp / "imatrix.gguf")
                (tmp / "info.json").write_text(json.dumps(info), encoding="utf-8")
        else:
            from quantkit import console

            console.log(f"importance matrix from the cache ({cache.name})")
        shutil.copy2(cache / "imatrix.gguf", dest)
    cached: ImatrixInfo = json.loads((cache / "info.json").read_text(encoding="utf-8"))
    return cached


def _imatrix(model_dir: Path, source_sha: str, cset: Any, f16: Path, dest: Path
             ) -> ImatrixInfo:
    from quantkit import console
    from quantkit.llamacpp_source import gguf_module
    from quantkit.models import config_dtype, load_model
    from quantkit.quantize import imatrix
    from quantkit.threads import cpu_dtype

    gguf = gguf_module()
    reused = imatrix.from_hessians(model_dir, source_sha, cset.input_ids, cset.sha256)
    origin: str | None = None  # the cached Hessians' folder it was read from
    if reused is not None:  # a GPTQ run from this model and set kept its Hessians: no pass
        sums, tokens, folder, dtype = reused
        origin = folder
        console.log(f"importance matrix from GPTQ's cached Hessians ({folder}), no pass")
    else:
        # bf16 activations change the per-channel means less than the calibration text does
        # (they correlate 0.9999 with float32's)
        dtype = cpu_dtype(config_dtype(model_dir))
        sums, tokens = imatrix.collect(load_model(model_dir, dtype=dtype), cset.input_ids)
    names = imatrix.gguf_name_map(f16, list(sums), gguf)
    missing = sorted(set(sums) - set(names))
    if missing:
        raise EngineError(f"no GGUF name for {missing[0]} (and {len(missing) - 1} more)",
                          "the converter's name map does not cover this architecture")
    n = imatrix.write(dest, sums, tokens, names, [str(cset.path)], gguf)
    digest, chunks = sha256_file(dest), tokens // imatrix.CHUNK
    if origin is None:
        return {"file": dest.name, "entries": n, "tokens": tokens, "chunk_size": imatrix.CHUNK,
                "chunks": chunks, "forward_dtype": dtype, "sha256": digest}
    return {"file": dest.name, "entries": n, "tokens": tokens, "chunk_size": imatrix.CHUNK,
            "chunks": chunks, "forward_dtype": dtype, "from_hessians": origin, "sha256": digest}


def _llama_quantize(src: Path, dst: Path, quant_type: str, imatrix_file: Path | None,
                    threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant_type}")
    params.nthread = threads
    keep: list[Any] = []  # the C side reads these buffers during the call
    if imatrix_file is not None:
        entries = read_imatrix_means(imatrix_file)
        array: Any = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (name, values) in enumerate(entries.items()):
            buf = (ctypes.c_float * len(values))(*values)
            keep += [name.encode(), buf]
            array[i].name, array[i].data, array[i].size = keep[-2], buf, len(values)
        params.imatrix = ctypes.cast(array, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(array)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                        ctypes.byref(params))
    if rc != 0 or not dst.is_file():
        raise EngineError(f"llama.cpp's quantizer failed (code {rc}) on {src}",
                          "run with --debug; check free disk space and the quant type")


def read_imatrix_means(path: Path) -> dict[str, list[float]]:
    """What llama-quantize feeds the quantizer: in_sum2 / counts per weight."""
    from quantkit.llamacpp_source import gguf_module

    reader = gguf_module().GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    means = {}
    for name, t in tensors.items():
        if name.endswith(".in_sum2"):
            base = name[: -len(".in_sum2")]
            count = float(tensors[f"{base}.counts"].data.reshape(-1)[0])
            means[base] = (t.data.reshape(-1) / max(count, 1.0)).astype("float32").tolist()
    return means


def tensor_stats(path: Path, quant_type: str) -> dict[str, Any]:
    """Tensor types, bits per weight, and how many weight matrices fell back from the requested
    k-quant family (llama.cpp does so when a row length is not a multiple of 256)."""
    from quantkit.gguf_header import read_header
    from quantkit.llamacpp_source import gguf_module

    tensors = read_header(path, gguf_module()).tensors
    types = Counter(t.type_name for t in tensors)
    family = ("_K", "IQ")
    fallback = 0
    if any(f in quant_type for f in family):
        fallback = sum(1 for t in tensors if len(t.shape) >= 2 and int(t.shape[1]) > 1
                       and t.type_name not in ("F32", "F16", "BF16")
                       and not any(f in t.type_name for f in family))
    bits = sum(t.n_bytes for t in tensors) * 8 / sum(t.n_elements for t in tensors)
    return {"tensor_types": dict(sorted(types.items())), "tensors": len(tensors),
            "fallback_tensors": fallback, "bits_per_weight": round(bits, 3)}


def _verify(f16: Path, quant: Path, heldout: Path | None) -> Verification:
    """Load the result in llama.cpp, answer a prompt, and compare perplexity with the F16 GGUF.
    The F16's perplexity on a text is computed once, kept beside the cached F16 file: every
    k-quant of a model (auto's ladder, a second quantization) is compared with the same one."""
    import json

    from quantkit.fsutil import atomic_write_text, sha256_bytes

    text = _heldout_text(heldout)
    out: Verification = {"prompt": PROMPT, "heldout": str(heldout) if heldout else
                         "builtin: Python stdlib email package source"}
    memo = f16.parent / f"ppl-f16-{sha256_bytes(text.encode())[:16]}.json"
    if memo.is_file():
        out["ppl_f16"] = json.loads(memo.read_text(encoding="utf-8"))["ppl_f16"]
    for label, path in (("f16", f16), ("quantized", quant)):
        if label == "f16" and "ppl_f16" in out:
            continue
        llm = _load(path)
        if label == "quantized":
            res = llm(PROMPT, max_tokens=8, temperature=0.0)
            out["answer"] = res["choices"][0]["text"]
        tokens = llm.tokenize(text.encode())[: 512 * 8]
        ppl = round(llama_perplexity(llm, tokens, 512), 4)
        if label == "f16":
            out["ppl_f16"] = ppl
        else:
            out["ppl_quantized"] = ppl
        out["heldout_tokens"] = len(tokens)
        if label == "f16":
            atomic_write_text(memo, json.dumps({"ppl_f16": ppl}))
        del llm
    return out


def _load(path: Path) -> Any:
    from quantkit.engines.llamacpp import load_llama

    try:
        return load_llama(path, n_ctx=512, logits_all=True, verbose=False)
    except (ValueError, RuntimeError) as exc:
        raise EngineError(f"llama.cpp could not load {path}: {exc}",
                          "re-run the quantization") from exc


def llama_perplexity(llm: Any, tokens: list[int], window: int) -> float:
    """Perplexity over consecutive windows of `tokens`, each evaluated from a fresh context."""
    import numpy as np

    from quantkit.engines.base import perplexity

    def nll_of(chunk: list[int]) -> tuple[float, int]:
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[: len(chunk) - 1], dtype=np.float64)
        logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        return float((logz - logits[np.arange(len(chunk) - 1), chunk[1:]]).sum()), len(chunk) - 1

    chunks = [tokens[s:s + window] for s in range(0, len(tokens) - 1, window)]
    return perplexity([c for c in chunks if len(c) >= 2], nll_of)


def _heldout_text(heldout: Path | None) -> str:
    if heldout is not None:
        from quantkit.sources import parse_source, read_documents

        return "\n\n".join(d.text for d in read_documents(parse_source(str(heldout))))
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"]) / "email"
    return "\n\n".join(f.read_text(errors="replace") for f in sorted(root.glob("*.py")))
