"""README's tables of methods, tasks and engines are the registries' (quantkit.catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.catalog import TABLES, render

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tables_match_the_registries():
    text = README.read_text()
    assert all(f"<!-- catalog:{name} -->" in text for name in TABLES)
    assert render(text) == text, "README.md drifted: run python -m quantkit.catalog README.md"


@pytest.mark.parametrize("name", list(TABLES))
def test_every_registered_entry_has_a_row(name):
    from quantkit.engines.choice import ENGINES
    from quantkit.methods import METHODS
    from quantkit.tasks import TASKS

    registry = {"methods": METHODS, "tasks": TASKS, "engines": ENGINES}[name]
    table = TABLES[name]()
    assert all(f"| `{entry}` |" in table for entry in registry)
    # and a new entry gets its row without touching the catalog
    toy = registry[next(iter(registry))]
    registry.register("toy-entry", toy)
    try:
        assert "| `toy-entry` |" in TABLES[name]()
        assert render(f"<!-- catalog:{name} -->\nold\n<!-- /catalog:{name} -->").count(
            "toy-entry") == 1
    finally:
        registry.unregister("toy-entry")
