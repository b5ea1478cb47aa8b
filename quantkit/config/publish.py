"""`quantkit publish`'s options: the recipe's `publish:` section (run by `quantkit run` only when
the gate passed)."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.config.fields import opt
from quantkit.errors import BadInput


@dataclass(frozen=True)
class PublishConfig:
    """`quantkit publish` and the recipe's `publish:` section."""

    repo: str = opt("", "The Hub repo to upload to, OWNER/NAME (created if missing).")
    private: bool = opt(False, "Create the repo private (an existing repo keeps its visibility).")

    def check(self) -> None:
        """The repo id has the Hub's form (checked locally, no network)."""
        check_repo_id(self.repo)


def check_repo_id(repo_id: str) -> None:
    """OWNER/NAME as huggingface_hub's own validator reads a repo id, or BadInput."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    hint = "give the repo as OWNER/NAME, e.g. your-name/smollm2-135m-gptq-w4"
    if not repo_id:
        raise BadInput("no repo id given", hint)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise BadInput(f"repo id {repo_id!r} is malformed: {' '.join(str(exc).split())}",
                       hint) from None
    if "/" not in repo_id:  # the Hub would put it under the token's user: say whose, explicitly
        raise BadInput(f"repo id {repo_id!r} names no owner", hint)
