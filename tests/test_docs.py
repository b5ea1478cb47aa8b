"""docs/ARCHITECTURE.md names the modules a newcomer opens: each one it names exists (a path from
the repository's root, or from the package's), so the page cannot describe a house that moved."""

from __future__ import annotations

import re

from _serving import ROOT


def test_every_module_the_architecture_page_names_exists() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = {m for m in re.findall(r"`([\w./-]+)`", text)
             if m.endswith((".py", "/")) or m.startswith(("quantkit/", "tests/", "bench/"))}
    assert len(named) >= 15  # the page names its rooms
    missing = [m for m in sorted(named)
               if not (ROOT / m).exists() and not (ROOT / "quantkit" / m).exists()]
    assert not missing, f"docs/ARCHITECTURE.md names what does not exist: {missing}"


def _readme_examples() -> list[list[str]]:
    """README's "One example per command": each `quantkit ...` command, continuation lines
    joined, split as a shell would."""
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("## One example per command", 1)[1].split("```", 2)[1]
    joined = block.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.startswith("quantkit ")]


def test_every_command_has_a_readme_example_whose_flags_and_files_exist() -> None:
    import typer

    from quantkit.cli import app
    from quantkit.gate import load_thresholds

    root = typer.main.get_command(app)  # typer's own click: its classes, not click's
    examples = _readme_examples()
    shown = {args[1] for args in examples}
    commands = set(root.commands)  # type: ignore[attr-defined]
    assert commands <= shown, f"no README example of {commands - shown}"
    for args in examples:
        command = root.commands[args[1]]
        ctx = command.context_class(command, info_name=args[1])
        # an unknown flag raises NoSuchOption, a flag without its value BadOptionUsage
        command.make_parser(ctx).parse_args(args[2:])
        for flag, arg in zip(args[1:], args[2:]):
            if arg.startswith("recipes/"):
                assert (ROOT / arg).exists(), f"README's example names {arg}, which is not there"
            if flag == "--thresholds":
                assert load_thresholds(ROOT / arg).limits
