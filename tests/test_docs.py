"""docs/alerts.md against the detection core: a section for every rule, every setting named
with its true default, and example rules files that the server would accept."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from trainvitals.detect import RULES, RulesConfig, RuleSet

ALERTS_DOC = Path(__file__).resolve().parent.parent / "docs" / "alerts.md"

#: A settings table row: | `name` | `default` | what it does |
_SETTING_ROW = re.compile(r"^\| `(\w+)` \| `([^`]+)` \|", re.MULTILINE)
_TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def doc() -> str:
    return ALERTS_DOC.read_text(encoding="utf-8")


def settings_of(table: str) -> dict[str, Any]:
    """``{setting: default}`` of one table of the rules file (a rule, or ``alerts``)."""
    settings = getattr(RuleSet(), table)
    return {f.name: getattr(settings, f.name) for f in fields(settings)}


def sections(text: str) -> dict[str, str]:
    """The text under each ``##`` or ``###`` heading (up to the next one), keyed by the
    heading's line."""
    parts = re.split(r"^(#{2,3} .+)$", text, flags=re.MULTILINE)
    return {heading: body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def section(text: str, wanted: str) -> str:
    """The one section whose heading line contains ``wanted``."""
    matches = [body for heading, body in sections(text).items() if wanted in heading]
    assert len(matches) == 1, f"Expected one section headed {wanted!r}, but got {len(matches)}"
    return matches[0]


def test_every_rule_has_a_section_and_every_setting_is_named() -> None:
    text = doc()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    missing_rules = [r for r in RULES if not any(f"`{r}`" in h for h in headings)]
    assert missing_rules == [], f"docs/alerts.md has no '## ' section for {missing_rules}"
    missing = [
        f"{table}.{name}"
        for table in (f.name for f in fields(RuleSet()))
        for name in settings_of(table)
        if f"`{name}`" not in text
    ]
    assert missing == [], f"docs/alerts.md does not mention these settings: {missing}"


def test_settings_tables_give_the_true_defaults() -> None:
    text = doc()
    for table in [*RULES, "alerts"]:
        body = section(text, "### Lifecycle" if table == "alerts" else f"## `{table}`")
        documented = {
            name: tomllib.loads(f"v = {literal}")["v"]
            for name, literal in _SETTING_ROW.findall(body)
        }
        defaults = settings_of(table)
        assert set(documented) == set(defaults), f"[{table}]: the table lists {sorted(documented)}"
        for name, default in defaults.items():
            value = documented[name]
            assert (type(value), value) == (type(default), default), (
                f"[{table}] {name!r}: documented as {value!r}, but the default is {default!r}"
            )


def test_example_rules_files_are_accepted() -> None:
    blocks = _TOML_BLOCK.findall(doc())
    assert blocks, "docs/alerts.md has no ```toml example"
    for block in blocks:
        RulesConfig.from_mapping(tomllib.loads(block))
