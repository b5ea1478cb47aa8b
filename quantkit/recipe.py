"""Recipes: one YAML file names the model, calibration, method, validation and serving settings.

Strict keys and a version, so a typo fails loudly instead of silently falling back to a default.
Relative paths are taken from the folder `quantkit run` is started in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.errors import BadInput

RECIPE_VERSION = 1


@dataclass(frozen=True)
class Calibration:
    sources: tuple[str, ...]
    samples: int = 256
    min_tokens: int = 512
    max_tokens: int = 2048
    seed: int = 0
    exclude: tuple[str, ...] = ()
    target: str | None = None


@dataclass(frozen=True)
class Quantize:
    method: str
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    act_order: bool | None = None
    damp: float = 0.01
    device: str = "auto"
    quant_type: str = "Q4_K_M"
    imatrix: bool = True


@dataclass(frozen=True)
class Validate:
    tasks: tuple[str, ...] = ()
    limit: int | None = None  # MMLU questions per subject and HumanEval problems
    humaneval_limit: int | None = None  # overrides `limit` for HumanEval
    humaneval_max_tokens: int = 384
    mmlu_data: str | None = None
    domain_set: str | None = None
    samples: int = 64
    temperature: float = 0.9
    top_p: float = 0.9
    max_tokens: int = 256
    seed: int = 0
    threads: int = 0
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Serve:
    engine: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    max_num_seqs: int = 8
    ctx_size: int = 2048
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    enable_chunked_prefill: bool = True
    draft_model: str | None = None
    num_speculative_tokens: int = 4


@dataclass(frozen=True)
class Outputs:
    calib: str
    artifact: str
    report: str


@dataclass(frozen=True)
class Recipe:
    version: int
    name: str
    model: str
    calibration: Calibration
    quantize: Quantize
    validate: Validate
    outputs: Outputs
    serve: Serve = Serve()
    description: str = ""


_SECTIONS = {"calibration": Calibration, "quantize": Quantize, "validate": Validate,
             "serve": Serve, "outputs": Outputs}


def load_recipe(path: Path) -> Recipe:
    """Parse and check a recipe; BadInput names the file and the offending key."""
    import yaml

    if not Path(path).is_file():
        raise BadInput(f"recipe {path} does not exist", "see recipes/ for examples")
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise BadInput(f"recipe {path} is not valid YAML: {str(exc).splitlines()[0]}",
                       "fix the YAML syntax") from exc
    if not isinstance(data, dict):
        raise BadInput(f"recipe {path} is not a mapping", "see recipes/demo.yaml")
    if data.get("version") != RECIPE_VERSION:
        raise BadInput(f"recipe {path}: version {data.get('version')!r} is not supported",
                       f"set `version: {RECIPE_VERSION}`")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS:
            kwargs[key] = _section(path, key, _SECTIONS[key], value)
        elif key in ("version", "name", "model", "description"):
            kwargs[key] = value
        else:
            raise BadInput(f"recipe {path}: unknown key {key!r}",
                           "known: version, name, model, description, " + ", ".join(_SECTIONS))
    for key in ("name", "model", "calibration", "quantize", "outputs"):
        if key not in kwargs:
            raise BadInput(f"recipe {path}: missing {key!r}", "see recipes/demo.yaml")
    kwargs.setdefault("validate", Validate())
    recipe = Recipe(**kwargs)
    if recipe.validate.thresholds:
        from quantkit.gate import load_thresholds

        load_thresholds(None, recipe.validate.thresholds)
    return recipe


def _section(path: Path, name: str, cls: type, value: Any) -> Any:
    if not isinstance(value, dict):
        raise BadInput(f"recipe {path}: {name} must be a mapping", "see recipes/demo.yaml")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            raise BadInput(f"recipe {path}: unknown key {name}.{key}",
                           f"{name} knows " + ", ".join(fields))
    clean = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    try:
        return cls(**clean)
    except TypeError as exc:
        raise BadInput(f"recipe {path}: {name}: {exc}", "see recipes/demo.yaml") from exc


def as_dict(obj: Any) -> Any:
    """A section as plain JSON-able data (for step keys and manifests)."""
    return dataclasses.asdict(obj)
