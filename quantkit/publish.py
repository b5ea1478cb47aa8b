"""`publish()`: a validated artifact and its model card to the Hugging Face Hub, in one commit.

Everything that can be checked here is, before any network: the repo id's form, the Hub not
switched off (HF_HUB_OFFLINE), a token, the artifact, its validation (its sha256) and the gate's
verdict. The card is written into a staged copy, a temporary folder of links to the artifact's
files (the artifact folder is never touched; its text files that name local paths are copies with
each path reduced to its last component, quantkit.public), which `--dry-run` lists and keeps for reading and a
real run uploads with huggingface_hub (create_repo exist_ok, one create_commit of every staged
file, whose message carries the verdict) and removes. The Hub's HTTP errors become one
`error:` line and a hint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantkit import console
from quantkit.card import Validated, build_card, find_validated
from quantkit.config.publish import check_repo_id
from quantkit.errors import BadInput, EngineError, QuantkitError
from quantkit.public import is_text, scrub_text
from quantkit.results import RESULTS

CARD_IN_REPO = "README.md"
VALIDATION_DIR = "validation"  # results.json (and report.html): `quantkit serve --reports NAME`
LOGIN_HINT = "log in with `hf auth login` (huggingface-cli login before huggingface_hub 1.0) or " \
             "set HF_TOKEN to a token with write access; --dry-run needs none"


def publish(*, artifact: Path, repo_id: str, results: Path | None = None,
            reports: Path = Path("reports"), private: bool = False, revision: str | None = None,
            dry_run: bool = False, allow_failed: bool = False, base_model: str | None = None
            ) -> dict[str, Any]:
    """Upload `artifact` with its card to `repo_id` (or, `dry_run`, say what would be)."""
    check_repo_id(repo_id)
    if revision is not None and not revision.strip():
        raise BadInput("--revision is empty", "name a branch, e.g. --revision w4-g32")
    token = None if dry_run else hub_token()
    v = find_validated(artifact, results, reports)
    check_verdict(v, allow_failed)
    files = publish_files(v)
    stage = Path(tempfile.mkdtemp(prefix="quantkit-publish-"))
    keep = False
    try:
        for name, src in files.items():
            dest = stage / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text(encoding="utf-8", errors="surrogateescape") \
                if is_text(src) else None
            public = scrub_text(text) if text is not None else None
            if public is not None and public != text:  # local paths: the last component
                dest.write_text(public, encoding="utf-8", errors="surrogateescape")
            else:
                dest.symlink_to(src.resolve())  # no copy of the weights; the upload reads through
        card = build_card(v, repo_id=repo_id, base=base_model)
        (stage / CARD_IN_REPO).write_text(scrub_text(str(card)), encoding="utf-8")
        listed = [{"path": CARD_IN_REPO, "bytes": (stage / CARD_IN_REPO).stat().st_size}] + [
            {"path": n, "bytes": (stage / n).stat().st_size} for n in files]
        plan: dict[str, Any] = {
            "repo": repo_id, "revision": revision or "main", "private": private,
            "verdict": v.verdict, "results": str(v.results_dir / RESULTS), "files": listed,
            "total_bytes": sum(f["bytes"] for f in listed),
            "commit_message": commit_message(v), "dry_run": dry_run}
        if dry_run:  # the staged copy stays for reading; nothing else was written
            keep = True
            return {**plan, "card": str(stage / CARD_IN_REPO), "staged": str(stage)}
        console.log(f"uploading {len(plan['files'])} files ({plan['total_bytes'] / 2**20:.1f} "
                    f"MiB) to {repo_id}")
        url = upload(stage, repo_id, token=str(token), private=private, revision=revision,
                     message=plan["commit_message"], description=commit_description(v))
        return {**plan, "url": url}
    finally:
        if not keep:
            shutil.rmtree(stage, ignore_errors=True)


def hub_token() -> str:
    """The Hub token, after checking the Hub is not switched off; BadInput where there is none."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE or _truthy(os.environ.get("HF_HUB_OFFLINE")):
        raise BadInput("the Hugging Face Hub is switched off here (HF_HUB_OFFLINE is set)",
                       "unset HF_HUB_OFFLINE to upload, or pass --dry-run to see what would be "
                       "uploaded")
    token = get_token()
    if not token:
        raise BadInput("no Hugging Face token: publishing needs one with write access",
                       LOGIN_HINT)
    return token


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def check_verdict(v: Validated, allow_failed: bool) -> None:
    """Only what passed is published, unless `allow_failed` (the card then says it failed)."""
    if v.verdict == "pass" or allow_failed:
        return
    where = v.results_dir / RESULTS
    if v.verdict == "fail":
        failing = ", ".join(v.results.gate.failing) or "a threshold"
        raise BadInput(f"{v.folder} failed its gate on {failing} ({where})",
                       "fix the quantization and re-validate, or pass --allow-failed to publish "
                       "it anyway (its card says it failed)")
    raise BadInput(f"the validation of {v.folder} ({where}) is not gated: no thresholds, no "
                   "verdict", "validate with --thresholds FILE, or pass --allow-failed")


def publish_files(v: Validated) -> dict[str, Path]:
    """Repo path -> local file: a compressed-tensors folder's files (its own README.md excepted:
    the card replaces it); a GGUF's model file, its importance matrix where one was used, and its
    manifest; for both the validation (results.json, report.html) under validation/."""
    from quantkit.checkpoints import call, checkpoint

    m, folder = v.manifest, v.folder
    files: dict[str, Path] = call(checkpoint(m.checkpoint), "publish_files", folder, m)
    files.pop(CARD_IN_REPO, None)  # the card replaces a README of the artifact's own
    for name in (RESULTS, "report.html"):
        if (v.results_dir / name).is_file():
            files[f"{VALIDATION_DIR}/{name}"] = v.results_dir / name
    return files


def commit_message(v: Validated) -> str:
    """One line with the verdict: `quantkit: gptq W4A16 g32, gate PASS`."""
    from quantkit.checkpoints import call, checkpoint

    m = v.manifest
    what = str(call(checkpoint(m.checkpoint), "scheme", m))
    if m.sensitivity and m.sensitivity.get("upgraded"):
        what += f" with {len(m.sensitivity['upgraded'])} linear groups at W8"
    failing = v.results.gate.failing
    return (f"quantkit: {what}, gate {v.verdict.upper()}"
            + (f" (failing: {', '.join(failing)})" if v.verdict == "fail" else ""))


def commit_description(v: Validated) -> str:
    """Each threshold and its value, for the commit's page."""
    lines = [f"{c.task}.{c.metric} = {c.value} (limit {c.op} {c.limit}): "
             f"{'pass' if c.passed else 'FAIL'}" for c in v.results.gate.checks]
    return "\n".join(lines + [f"artifact sha256 {v.sha256}", f"validated {v.results.created} "
                              f"on {v.results.engine} {v.results.engine_version}"])


def upload(stage: Path, repo_id: str, *, token: str, private: bool, revision: str | None,
           message: str, description: str) -> str:
    """create_repo (exist_ok), the branch where one is named, one commit of every staged file
    (create_commit: upload_folder may split a large folder into several commits); the URL of the
    commit. The Hub's errors become QuantkitErrors (`hub_error`)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private or None, exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        files = sorted(p for p in stage.rglob("*") if p.is_file())  # links followed
        info = api.create_commit(
            repo_id, [CommitOperationAdd(p.relative_to(stage).as_posix(), str(p)) for p in files],
            commit_message=message, commit_description=description, revision=revision)
    except Exception as exc:  # noqa: BLE001 - the Hub client's errors, mapped or passed on
        mapped = hub_error(exc, repo_id, revision)
        if mapped is None:
            raise
        raise mapped from exc
    return str(getattr(info, "commit_url", info))


def hub_error(exc: BaseException, repo_id: str, revision: str | None = None
              ) -> QuantkitError | None:
    """huggingface_hub's error as one message and a hint (401/403/404: BadInput, exit 2; the Hub
    unreachable or failing: EngineError, exit 3); None for an error that is not the Hub's."""
    from huggingface_hub.utils import (
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    owner = repo_id.split("/")[0]
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, HFValidationError):
        return BadInput(f"the Hub refused {repo_id!r}: {' '.join(str(exc).split())}",
                        "give the repo as OWNER/NAME")
    if isinstance(exc, RevisionNotFoundError):
        return BadInput(f"branch {revision!r} of {repo_id} was not found",
                        "leave --revision out to publish to main, or name an existing branch")
    if isinstance(exc, RepositoryNotFoundError):  # the Hub answers 401 for a repo it hides too
        return BadInput(f"repo {repo_id} does not exist or this token cannot see it"
                        + (" (401: the token may be invalid)" if status == 401 else ""),
                        f"check the owner {owner!r}: a user or organization the token "
                        "belongs to (`hf auth whoami`); log in again with `hf auth login`")
    if isinstance(exc, HfHubHTTPError):
        said = " ".join(str(getattr(exc, "server_message", None) or "").split())[:200]
        said = f": {said}" if said else ""
        if status == 401:
            return BadInput(f"the Hub refused the token (401 Unauthorized){said}", LOGIN_HINT)
        if status == 403:
            return BadInput(f"this token cannot write to {repo_id} (403 Forbidden){said}",
                            f"use a token with write access to {owner!r} (`hf auth login`; a "
                            "fine-grained token needs write on that repo or organization), or "
                            "publish under your own name")
        if status == 404:
            return BadInput(f"{repo_id} was not found on the Hub (404){said}",
                            f"check the owner {owner!r} and the repo name")
        return EngineError(f"the Hub answered {status or 'an error'} while publishing to "
                           f"{repo_id}{said}", "try again later; nothing was committed if the "
                           "upload did not finish (--dry-run shows what would be uploaded)")
    names = {t.__name__ for t in type(exc).__mro__}
    if isinstance(exc, (ConnectionError, TimeoutError)) or any(
            w in n for n in names for w in ("Connect", "Timeout", "NetworkError")):
        return EngineError(f"the Hub could not be reached ({type(exc).__name__})",
                           "check the network (and HF_ENDPOINT), or pass --dry-run to see what "
                           "would be uploaded")
    return None


def describe(res: dict[str, Any]) -> str:
    """What `quantkit publish` prints: the repo, the verdict, each file and its size, the card."""
    def size(n: int) -> str:
        return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"

    width = max(len(f["path"]) for f in res["files"])
    head = ("dry run: nothing uploaded; would commit" if res["dry_run"] else "committed")
    lines = [f"{head} to {res['repo']} (branch {res['revision']}"
             f"{', private' if res['private'] else ''}): {res['commit_message']}",
             f"files: {len(res['files'])}, {size(res['total_bytes'])}"]
    lines += [f"  {f['path']:<{width}}  {size(f['bytes']):>10}" for f in res["files"]]
    if res["dry_run"]:
        lines.append(f"card: {res['card']} (the staged copy is kept for reading)")
    else:
        lines.append(f"url: {res['url']}")
    return "\n".join(lines)
