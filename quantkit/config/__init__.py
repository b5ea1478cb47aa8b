"""Stage configs: one frozen dataclass per stage holds every option with its one default.

The same dataclass is a recipe section (YAML, strict keys, a version), what the CLI builds from its
flags, and what the stage function takes. A flag given explicitly overrides the recipe's value.
Relative paths are taken from the folder quantkit is started in. Pure: no torch; what exists
(tasks, methods, engines) is read from the registries, and a check may ask lm-eval's task index.
"""

from quantkit.config.auto import AutoConfig, parse_candidate
from quantkit.config.calibrate import CalibrateConfig
from quantkit.config.fields import as_dict, build, coerce, opt, section
from quantkit.config.publish import PublishConfig
from quantkit.config.quantize import QuantizeConfig
from quantkit.config.recipe import (
    RECIPE_VERSION,
    SECTIONS,
    Outputs,
    Recipe,
    load_recipe,
    recipe_section,
)
from quantkit.config.serve import MARLIN_MAX_SEQS, VLLM_KERNELS, BenchConfig, ServeConfig
from quantkit.config.validate import ValidateConfig

__all__ = ["MARLIN_MAX_SEQS", "RECIPE_VERSION", "SECTIONS", "VLLM_KERNELS",
           "AutoConfig", "BenchConfig", "CalibrateConfig", "Outputs", "PublishConfig",
           "QuantizeConfig", "Recipe", "ServeConfig", "ValidateConfig", "as_dict", "build",
           "coerce", "load_recipe", "opt", "parse_candidate", "recipe_section", "section"]
