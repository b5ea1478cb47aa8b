"""The toy task's and the toy method's own options: a field of `quantkit validate`
(--agree-prompts) and of the recipe's `validate:` section, and a field of `quantkit quantize`
(--rtn-clip) and of the recipe's `quantize:` section, as the built-in tasks' and methods' are.
Named by the task and the method as "module:attribute", so they are read when quantkit's config
is built, not when the entries are listed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.config.fields import check_range, opt


@dataclass(frozen=True)
class AgreeOptions:
    agree_prompts: int = opt(4, "Toy agreement: prompts compared (1 to 4).")

    def check(self) -> None:
        check_range("agree_prompts", self.agree_prompts, 1, 4)


@dataclass(frozen=True)
class RTNOptions:
    rtn_clip: float = opt(1.0, "RTN: each group's scale times this before rounding (below 1 "
                               "clips the largest weights; 1.0: min/max).")

    def check(self, cfg: Any) -> None:
        check_range("rtn_clip", self.rtn_clip, 0.5, 1.0)
