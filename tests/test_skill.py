"""The agent skill shipped with the package (quantkit/skills/quantkit/SKILL.md): its front matter
is what agent tools read, and every command and flag it tells an agent to run exists."""

from __future__ import annotations

import re
from importlib import resources

import typer
import yaml

from quantkit.cli import app


def _skill() -> str:
    return resources.files("quantkit").joinpath("skills", "quantkit", "SKILL.md").read_text()


def test_the_skill_names_itself_and_when_to_use_it() -> None:
    head = yaml.safe_load(_skill().split("---")[1])
    assert head["name"] == "quantkit" and len(head["description"]) > 100


def test_every_command_and_flag_the_skill_names_exists() -> None:
    group = typer.main.get_command(app)
    commands = group.commands  # type: ignore[attr-defined]
    shown = re.findall(r"`(quantkit [^`]+)`", _skill())
    assert len(shown) >= 8
    for line in shown:
        words = line.split()[1:]
        names = [w for w in words if not w.startswith("-")]
        name = names[0]
        assert name in commands, line
        flags = {o for p in commands[name].params for o in p.opts + p.secondary_opts}
        flags |= {o for p in group.params for o in p.opts}  # --json, --quiet, ... before it
        for w in words:
            if w.startswith("--"):
                assert w in flags, (line, w)
