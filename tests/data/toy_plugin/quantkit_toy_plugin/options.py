"""The toy task's own option: a field of `quantkit validate` (--agree-prompts) and of the recipe's
`validate:` section, as the built-in tasks' are. Named by the task as "module:attribute", so it
is read when quantkit's config is built, not when the task is listed."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.config.fields import check_range, opt


@dataclass(frozen=True)
class AgreeOptions:
    agree_prompts: int = opt(4, "Toy agreement: prompts compared (1 to 4).")

    def check(self) -> None:
        check_range("agree_prompts", self.agree_prompts, 1, 4)
