"""The rules file: defaults, project overrides and bad settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainvitals.detect import (
    Detector,
    RulesConfig,
    RulesError,
    RuleSet,
    load_rules,
)

# -- settings ------------------------------------------------------------------------------


def test_rules_file_defaults_and_project_overrides(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        "[alerts]\ncooldown = 60\n[grad_explosion]\nfactor = 20\n"
        "[projects.gan.loss_divergence]\nenabled = false\n"
    )
    rules = load_rules(path)
    assert rules.defaults.grad_explosion.factor == 20.0
    assert rules.defaults.alerts.cooldown == 60.0
    gan = rules.for_project("gan")
    assert gan.loss_divergence.enabled is False and gan.grad_explosion.factor == 20.0
    assert rules.for_project("other").loss_divergence.enabled is True
    assert all(r.id != "loss_divergence" for r in Detector(gan).rules)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[grad_explosoin]\nfactor = 2\n", "unknown rule"),
        ("[grad_explosion]\nfactr = 2\n", "'factr': unknown setting"),
        ("[grad_explosion]\nfactor = 'big'\n", "expected a number"),
        ("[nonfinite]\nenabled = 1\n", "expected true or false"),
        ("[oom_forecast]\nhorizon = -5\n", ">= 0"),
        ("[grad_explosion\n", "not valid TOML"),
    ],
)
def test_bad_rules_files_name_the_setting(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=complaint):
        load_rules(path)


def test_default_rules_cover_every_contract_rule() -> None:
    from trainvitals.detect import RULES

    assert set(RULES) <= set(RuleSet().as_dict())
    assert RulesConfig.from_mapping({}).defaults == RuleSet()
