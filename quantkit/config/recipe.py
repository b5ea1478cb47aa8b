"""A recipe: the pipeline in one YAML file (strict keys, a version), one section per stage config,
checked whole before any step runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.config.auto import AutoConfig
from quantkit.config.calibrate import CalibrateConfig
from quantkit.config.fields import section, yaml_load
from quantkit.config.publish import PublishConfig
from quantkit.config.quantize import QuantizeConfig
from quantkit.config.serve import BenchConfig, ServeConfig
from quantkit.config.validate import ValidateConfig
from quantkit.errors import BadInput

RECIPE_VERSION = 1


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
    calibration: CalibrateConfig
    quantize: QuantizeConfig
    outputs: Outputs
    validate: ValidateConfig = ValidateConfig()
    serve: ServeConfig = ServeConfig()
    bench: BenchConfig = BenchConfig()
    auto: AutoConfig | None = None
    publish: PublishConfig | None = None  # run by `quantkit run` only when the gate passed
    description: str = ""


SECTIONS: dict[str, type] = {"calibration": CalibrateConfig, "quantize": QuantizeConfig,
                             "validate": ValidateConfig, "serve": ServeConfig,
                             "bench": BenchConfig, "auto": AutoConfig, "publish": PublishConfig,
                             "outputs": Outputs}


def load_recipe(path: Path) -> Recipe:
    """Parse and check a whole recipe (keys, types, ranges, thresholds) before any step runs."""
    from quantkit.fsutil import read_text

    path = Path(path)
    data = yaml_load(path, read_text(path, "recipe", "see recipes/ for examples"), "recipe")
    if not isinstance(data, dict):
        raise BadInput(f"recipe {path} is not a mapping", "see recipes/demo.yaml")
    version = data.get("version")
    if type(version) is not int or version != RECIPE_VERSION:  # True and 1.0 equal 1, too
        raise BadInput(f"recipe {path}: version {data.get('version')!r} is not supported",
                       f"set `version: {RECIPE_VERSION}`")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            kwargs[key] = section(SECTIONS[key], value, f"recipe {path}: {key}")
        elif key in ("name", "model", "description"):
            if not isinstance(value, str) or not value:
                raise BadInput(f"recipe {path}: {key} must be a non-empty string",
                               "see recipes/demo.yaml")
            kwargs[key] = value
        elif key != "version":
            raise BadInput(f"recipe {path}: unknown key {key!r}",
                           "known: version, name, model, description, " + ", ".join(SECTIONS))
    for key in ("name", "model", "calibration", "quantize", "outputs"):
        if key not in kwargs:
            raise BadInput(f"recipe {path}: missing {key!r}", "see recipes/demo.yaml")
    recipe = Recipe(version=RECIPE_VERSION, **kwargs)
    for name in ("calibration", "quantize", "validate", "serve", "bench", "auto", "publish"):
        if getattr(recipe, name) is None:
            continue
        try:
            getattr(recipe, name).check()
        except BadInput as exc:
            raise BadInput(f"recipe {path}: {name}: {exc.message}", exc.hint) from exc
    return recipe


def recipe_section(recipe: Path | None, name: str) -> tuple[Any, Recipe | None]:
    """The recipe's section `name` (None without a recipe) and the recipe itself."""
    if recipe is None:
        return None, None
    r = load_recipe(recipe)
    return getattr(r, name), r
