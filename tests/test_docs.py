"""The docs against the code.

docs/alerts.md: a section for every rule, every setting named with its true default, and
example rules files that the server would accept. docs/contract.md: every route the app serves
(and no other), every command and flag, the Python API's parameters, run and alert fields, rule
ids and series names. docs/settings.md: every ``TRAINVITALS_*`` variable in the source, with the
true defaults. The README and docs: links that resolve, every doc in the site's navigation and
linked from the README, nothing outside the project, a README that stays short, and every
command, make target and variable the front pages name exists."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

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


# -- docs/contract.md and docs/settings.md against the code ------------------------------------

DOCS = ALERTS_DOC.parent
ROOT = DOCS.parent
SRC = ROOT / "src" / "trainvitals"
CONTRACT_DOC = DOCS / "contract.md"
SETTINGS_DOC = DOCS / "settings.md"

#: A route as the contract writes it: `GET /api/v1/runs`, `WS /api/v1/live` (a query is cut).
_DOCUMENTED_ROUTE = re.compile(r"`(GET|POST|PUT|PATCH|DELETE|WS) (/[^`?\s]*)")
#: A row of a settings table: | `TRAINVITALS_NAME` | default | ...
_VARIABLE_ROW = re.compile(r"^\| `(TRAINVITALS_\w+)` \| ([^|]*) \|", re.MULTILINE)
_VARIABLE = re.compile(r"\bTRAINVITALS_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def served_routes(app: Any) -> set[str]:
    """Every route the app serves, as ``"METHOD /path"`` (``WS`` for a websocket; a static
    mount as ``GET /mount/{path}``)."""
    from fastapi import routing
    from starlette.routing import Mount, WebSocketRoute

    # FastAPI 0.12x+ keeps included routers as one entry of app.routes each; flatten them.
    flatten = getattr(routing, "iter_route_contexts", None)
    routes = list(flatten(app.routes)) if flatten is not None else list(app.routes)
    served = set()
    for route in routes:
        original = getattr(route, "original_route", route)
        path = getattr(route, "path", None)
        assert path, f"a route without a path: {route!r}"
        if isinstance(original, Mount):
            served.add(f"GET {path}/{{path}}")
        elif isinstance(original, WebSocketRoute):
            served.add(f"WS {path}")
        else:
            served.update(f"{method} {path}" for method in original.methods - {"HEAD"})
    return served


def documented_routes(text: str) -> set[str]:
    return {f"{method} {path}" for method, path in _DOCUMENTED_ROUTE.findall(_FENCE.sub("", text))}


def test_every_served_route_is_in_the_contract_and_nothing_else(tmp_path: Path) -> None:
    from trainvitals.server import Settings, create_app

    served = served_routes(create_app(Settings(db=str(tmp_path / "x.db"))))
    assert {"GET /healthz", "GET /api/v1/runs", "WS /api/v1/ingest"} <= served  # seen through
    documented = documented_routes(CONTRACT_DOC.read_text(encoding="utf-8"))
    assert sorted(served - documented) == [], "served but not in docs/contract.md"
    assert sorted(documented - served) == [], "in docs/contract.md but not served"


def test_route_check_fails_on_a_missing_route(tmp_path: Path) -> None:
    from trainvitals.server import Settings, create_app

    served = served_routes(create_app(Settings(db=str(tmp_path / "x.db"))))
    text = CONTRACT_DOC.read_text(encoding="utf-8").replace("`GET /healthz`", "`/healthz`")
    assert served - documented_routes(text) == {"GET /healthz"}


def variables_in_source() -> set[str]:
    """Every ``TRAINVITALS_*`` name the package's files contain, and the server settings'
    variables (``env_prefix`` + field name)."""
    from trainvitals.server import Settings

    found = {
        name
        for path in SRC.rglob("*")
        if path.suffix in (".py", ".js", ".html")
        for name in _VARIABLE.findall(path.read_text(encoding="utf-8"))
    }
    prefix = Settings.model_config.get("env_prefix", "")
    return found | {f"{prefix}{field}".upper() for field in Settings.model_fields}


def variable_rows(text: str) -> dict[str, str]:
    """``{variable: default cell}`` of every settings table row in ``text``."""
    return {name: cell.strip() for name, cell in _VARIABLE_ROW.findall(text)}


def test_every_variable_in_the_source_is_in_the_settings_tables() -> None:
    found = variables_in_source()
    assert {"TRAINVITALS_SERVER", "TRAINVITALS_LOST_AFTER"} <= found
    documented = set(variable_rows(SETTINGS_DOC.read_text(encoding="utf-8")))
    assert sorted(found - documented) == [], "read by the code but not in docs/settings.md"
    assert sorted(documented - found) == [], "in docs/settings.md but not in the code"


def default_of(cell: str) -> str | None:
    """The default a table cell states: its first `literal`, or None for ``unset``."""
    if cell == "unset":
        return None
    literal = re.match(r"`([^`]*)`", cell)
    assert literal, f"a default cell that is neither `literal` nor unset: {cell!r}"
    return literal.group(1)


def assert_default(variable: str, cell: str, default: Any) -> None:
    stated = default_of(cell)
    if default is None or stated is None:
        assert stated == default, f"{variable}: documented {cell!r}, default {default!r}"
    else:
        assert type(default)(stated) == default, (
            f"{variable}: documented {cell!r}, default {default!r}"
        )


def test_server_settings_table_gives_the_true_defaults() -> None:
    from trainvitals.server import Settings

    rows = variable_rows(section(SETTINGS_DOC.read_text(encoding="utf-8"), "## Server"))
    prefix = Settings.model_config.get("env_prefix", "")
    for field, info in Settings.model_fields.items():
        variable = f"{prefix}{field}".upper()
        assert variable in rows, f"{variable} has no row under '## Server'"
        assert_default(variable, rows[variable], info.default)


def test_agent_settings_table_gives_the_true_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from trainvitals import resolve

    for name in [n for n in os.environ if n.startswith("TRAINVITALS_")]:
        monkeypatch.delenv(name)
    config = resolve()
    rows = variable_rows(section(SETTINGS_DOC.read_text(encoding="utf-8"), "## Agent"))
    checked = 0
    for variable, cell in rows.items():
        field = variable.removeprefix("TRAINVITALS_").lower()
        if not hasattr(config, field) or isinstance(getattr(config, field), Path):
            continue  # TRAINVITALS_JOB is no setting; the spool directory depends on $HOME
        assert_default(variable, cell, getattr(config, field))
        checked += 1
    assert checked >= 8


def headings_of(text: str) -> list[str]:
    return [
        line.lstrip("#").strip()
        for line in _FENCE.sub("", text).splitlines()
        if re.match(r"#{1,6} ", line)
    ]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings_of(path.read_text(encoding="utf-8")):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def markdown_files() -> list[Path]:
    return [ROOT / name for name in FRONT_PAGES] + sorted(DOCS.glob("*.md"))


#: The pages at the repository's root, which GitHub shows and the site does not hold.
FRONT_PAGES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")
#: A page of mkdocs.yml's navigation: ``- Title: page.md`` (the file's tags need no YAML).
_NAV_PAGE = re.compile(r"^\s*- (?:[^:\n]+: )?([\w/-]+\.md)$", re.MULTILINE)


def test_links_in_the_readme_and_docs_resolve() -> None:
    broken = []
    for page in markdown_files():
        for target in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists() or (
                anchor and path.suffix == ".md" and anchor not in anchors(path)
            ):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def nav_pages() -> list[str]:
    return _NAV_PAGE.findall((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def test_every_doc_is_in_the_site_and_linked_from_the_readme() -> None:
    pages = nav_pages()
    assert "index.md" in pages and "architecture.md" in pages  # the pattern reads the nav
    assert sorted(pages) == sorted(p.name for p in DOCS.glob("*.md")), (
        "mkdocs.yml's nav and the pages in docs/ differ"
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [page for page in pages if page != "index.md" and f"(docs/{page}" not in readme]
    assert unlinked == [], "docs not linked from the README"


def test_nothing_points_outside_the_project() -> None:
    for page in markdown_files():
        text = page.read_text(encoding="utf-8")
        assert "DESIGN.md" not in text and "shared/" not in text, (
            f"{page.name} points outside the project a user clones"
        )


def command_help(*argv: str) -> str:
    from trainvitals.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def test_every_command_and_flag_is_in_the_contract() -> None:
    from trainvitals.cli import SCENARIO_NAMES

    text = CONTRACT_DOC.read_text(encoding="utf-8")
    listing = command_help().split("positional arguments:")[1].split("options:")[0]
    commands = re.findall(r"^    (\w[\w-]*)", listing, flags=re.MULTILINE)
    assert {"serve", "demo", "notify-test"} <= set(commands)
    for command in commands:
        body = section(text, f"### `trainvitals {command}`")
        flags = set(re.findall(r"(--[a-z][a-z-]*)", command_help(command))) - {"--help"}
        missing = sorted(flag for flag in flags if f"`{flag}" not in body)
        assert missing == [], f"trainvitals {command}: flags not in its section: {missing}"
    demo = section(text, "### `trainvitals demo`")
    assert [s for s in SCENARIO_NAMES if f"`{s}`" not in demo] == []


def parameters_of_vitals_callback() -> list[str]:
    """``VitalsCallback.__init__``'s parameters, read from the source (importing it loads
    TensorFlow)."""
    tree = ast.parse((SRC / "agent" / "keras_callback.py").read_text(encoding="utf-8"))
    (init,) = [
        node
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name == "VitalsCallback"
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    ]
    return [a.arg for a in [*init.args.args, *init.args.kwonlyargs] if a.arg != "self"]


def test_the_python_api_is_in_the_contract() -> None:
    import inspect

    import trainvitals
    from trainvitals.agent.config import AgentConfig
    from trainvitals.agent.protect import Protection
    from trainvitals.client import Api

    text = CONTRACT_DOC.read_text(encoding="utf-8")
    assert [n for n in trainvitals.__all__ if f"`{n}`" not in text] == []
    documented = {
        "VitalsCallback": parameters_of_vitals_callback(),
        "Monitor": list(inspect.signature(trainvitals.Monitor).parameters),
        "Run": list(inspect.signature(trainvitals.Run).parameters),
        "resolve": list(inspect.signature(trainvitals.resolve).parameters),
        "AgentConfig": [f.name for f in fields(AgentConfig)],
        "Protection": [f.name for f in fields(Protection)],
        "Api": list(inspect.signature(Api).parameters),
    }
    for name, parameters in documented.items():
        body = section(text, f"`{name}`")
        missing = [p for p in parameters if f"`{p}`" not in body]
        assert missing == [], f"{name}: parameters not in its section: {missing}"


def test_fields_rules_and_series_are_in_the_contract() -> None:
    from trainvitals import series
    from trainvitals.agent.gpu import _NVML_READINGS
    from trainvitals.server.storage import RunSummary
    from trainvitals.server.storage.alerts import ALERT_FIELDS

    text = CONTRACT_DOC.read_text(encoding="utf-8")
    expected = [f"`{f}`" for f in (*RunSummary.__annotations__, *ALERT_FIELDS, *RULES)]
    for constant, value in vars(series).items():
        if not constant.isupper() or not isinstance(value, str) or constant == "GPU_PREFIX":
            continue
        if constant.startswith("GPU_"):
            expected.append(f"`gpu<i>/{value}`")
        else:
            expected.append(f"`{value}" if value.endswith(("/", "_")) else f"`{value}`")
    expected += [f"`gpu<i>/{key}`" for key in [*_NVML_READINGS, "xid_errors"]]
    assert [e for e in expected if e not in text] == []


def test_the_readme_stays_a_front_door() -> None:
    """Reference, figures and history live in docs/ and git, not in the README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200 and len(readme.split()) <= 2500
    assert not re.search(r"\b\d[\d,]* tests\b", readme), "a test count in the README"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", readme), "a dated figure in the README"


def test_the_commands_targets_and_variables_the_front_pages_name_exist() -> None:
    from trainvitals.cli import main

    pages = (*FRONT_PAGES, "docs/index.md", "docs/getting-started.md")
    text = "\n".join((ROOT / name).read_text(encoding="utf-8") for name in pages)
    code = "\n".join(_FENCE.findall(text) + re.findall(r"`[^`\n]+`", _FENCE.sub("", text)))
    listing = command_help().split("positional arguments:")[1].split("options:")[0]
    commands = set(re.findall(r"^    (\w[\w-]*)", listing, flags=re.MULTILINE))
    named = set(re.findall(r"\btrainvitals ([a-z][a-z-]+)\b", code))
    assert {"serve", "demo", "runs"} <= named
    assert sorted(named - commands) == [], "commands the front pages name that do not exist"
    for command in named:  # each one parses: its --help exits 0
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.MULTILINE))
    make_named = set(re.findall(r"\bmake ([a-z][\w-]*)", code))
    assert {"demo", "test", "docs"} <= make_named
    missing = sorted(make_named - targets)
    assert missing == [], "make targets the front pages name but the Makefile lacks"

    documented = set(_VARIABLE.findall(SETTINGS_DOC.read_text(encoding="utf-8")))
    missing = sorted(set(_VARIABLE.findall(text)) - documented)
    assert missing == [], "variables the front pages name but docs/settings.md lacks"
