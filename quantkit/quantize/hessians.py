"""GPTQ's Hessians from one pass of the original model (`--hessians original`), kept in this
process so that every candidate `quantkit auto` quantizes from the same model and calibration
set reuses them: a candidate then costs its sweeps and packing, not a calibration pass.

Sequential GPTQ (the default) computes each layer's Hessians from the outputs of the layers
already quantized, so its Hessians belong to one candidate; these come from the original model's
activations, the same for all. They are also kept on disk under $QUANTKIT_HOME/hessians (the
newest first, DISK_MAX_BYTES for all of them), so a later run from the same model and
calibration set, in another process, skips the pass too."""

from __future__ import annotations

from typing import Any

from torch import Tensor

_CACHE: dict[tuple[Any, ...], list[dict[str, Tensor]]] = {}
CACHE_MAX_BYTES = 8 * 2**30  # larger sets are recomputed per candidate rather than held in RAM
DISK_MAX_BYTES = 4 * 2**30  # on disk, all models together; a larger set is not written
FILE = "hessians.safetensors"
BATCH_TOKENS = {"cuda": 16384, "cpu": 4096}  # the pass's batch size when --batch-tokens is unset


def cache_key(source_sha: str, cset_sha: str, dev: Any, batch_tokens: int, dtype: str
              ) -> tuple[Any, ...]:
    """What names a pass's Hessians in the caches: the model's identity, the calibration set,
    the device, batch size and dtype it ran with (the last three change the float rounding)."""
    return (source_sha, cset_sha, str(dev), batch_tokens, dtype)


def original_hessians(lm: Any, family: Any, samples: list[list[int]], dev: Any,
                      batch_tokens: int, key: tuple[Any, ...]) -> list[dict[str, Tensor]]:
    """Per decoder layer, {first linear of each GPTQ step: H} from the original model's
    activations (on the CPU); `key` names the model and calibration set for the caches."""
    if key in _CACHE:
        return _CACHE[key]
    n_layers = len(lm.get_submodule(family.layers_attr))
    out = _read(key, n_layers)
    computed = out is None
    if out is None:
        out = _compute(lm, family, samples, dev, batch_tokens)
    size = sum(h.numel() * h.element_size() for d in out for h in d.values())
    if computed:
        _write(key, out, size)
    if size <= CACHE_MAX_BYTES:
        _CACHE.clear()  # one model and calibration set at a time
        _CACHE[key] = out
    return out


def _folder(key: tuple[Any, ...]) -> Any:
    import hashlib
    import json

    from quantkit import __version__
    from quantkit.models import quantkit_home

    blob = json.dumps([__version__, *map(str, key)]).encode()
    return quantkit_home() / "hessians" / hashlib.sha256(blob).hexdigest()[:24]


def _read(key: tuple[Any, ...], n_layers: int) -> list[dict[str, Tensor]] | None:
    from quantkit import console

    found = read_cached(key)
    if found is None:
        return None
    flat, folder = found
    out: list[dict[str, Tensor]] = [{} for _ in range(n_layers)]
    for name, h in flat.items():
        i, linear = name.split(".", 1)
        if int(i) >= n_layers:
            return None
        out[int(i)][linear] = h
    console.log(f"hessians: from the cache ({folder}), no calibration pass")
    return out


def read_cached(key: tuple[Any, ...]) -> tuple[dict[str, Tensor], str] | None:
    """The Hessians kept on disk for `key` as {"LAYER.LINEAR": H} with the cache folder's name,
    or None (none kept, or a damaged file)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = _folder(key) / FILE
    if not path.is_file():
        return None
    try:
        return load_file(str(path)), path.parent.name
    except (SafetensorError, OSError):  # a damaged file is recomputed and replaced
        return None


def _write(key: tuple[Any, ...], out: list[dict[str, Tensor]], size: int) -> None:
    """Store a model and calibration set's Hessians (`size` bytes); the oldest others go while
    all of them together would pass DISK_MAX_BYTES."""
    import shutil

    from safetensors.torch import save_file

    from quantkit.fsutil import atomic_dir

    if size > DISK_MAX_BYTES:
        return
    folder = _folder(key)
    kept = size
    others = sorted((p for p in folder.parent.glob("*/" + FILE) if p.parent != folder),
                    key=lambda p: p.stat().st_mtime, reverse=True) if folder.parent.is_dir() else []
    for other in others:
        kept += other.stat().st_size
        if kept > DISK_MAX_BYTES:
            shutil.rmtree(other.parent, ignore_errors=True)
    try:
        with atomic_dir(folder, force=True) as tmp:
            save_file({f"{i}.{n}": h.contiguous() for i, d in enumerate(out) for n, h in d.items()},
                      str(tmp / FILE))
    except OSError:  # a cache that cannot be written costs the next run a pass, nothing more
        pass


def _compute(lm: Any, family: Any, samples: list[list[int]], dev: Any, batch_tokens: int
             ) -> list[dict[str, Tensor]]:
    from quantkit.quantize.capture import capture_inputs, next_inputs
    from quantkit.quantize.layers import layer_hessians

    layers = lm.get_submodule(family.layers_attr)
    batches = capture_inputs(lm, family.layers_attr, samples, dev, batch_tokens)
    out: list[dict[str, Tensor]] = []
    for layer in layers:
        layer.to(dev)
        hs, outs = layer_hessians(layer, family, batches)
        out.append({n: h.cpu() for n, h in hs.items()})
        batches = next_inputs(outs, batches)
        layer.to("cpu")
    return out
