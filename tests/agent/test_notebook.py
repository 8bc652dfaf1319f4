"""A notebook shows its run inline: a real notebook executed on a real ipykernel (nbclient)
against a real server, its outputs read back as Jupyter, JupyterLab or VS Code would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

import trainvitals
from harness.processes import ServerProcess
from trainvitals.agent import notebook


def executed(cells: list[str], tmp_path: Path) -> list[list[dict[str, Any]]]:
    """Each cell's outputs once the notebook has run."""
    v4: Any = nbformat.v4  # untyped
    book = v4.new_notebook(cells=[v4.new_code_cell(c) for c in cells])
    NotebookClient(
        book, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    return [cell.outputs for cell in book.cells]


def test_a_notebook_shows_the_run_inline_and_a_turned_off_one_prints_its_link(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel imports this checkout's trainvitals, as the test process does.
    monkeypatch.setenv("PYTHONPATH", str(Path(trainvitals.__file__).parents[1]))
    monkeypatch.delenv("TRAINVITALS_NOTEBOOK", raising=False)
    quiet = "system_metrics=False, watchdog=False"
    shown, started, off = executed(
        [
            "import trainvitals\n"
            f"mon = trainvitals.Monitor(server={server.url!r}, run_name='nb <1>', {quiet})\n"
            "mon.start()\n"
            "None",
            "assert mon.run.finish()\nprint(mon.run.id)",
            f"off = trainvitals.Monitor(server={server.url!r}, run_name='off', notebook=False,"
            f" {quiet})\n"
            "off.start()\n"
            "assert off.run.finish()",
        ],
        tmp_path,
    )
    run_id = started[0]["text"].strip()
    url = f"{server.url}/#/runs/{run_id}"
    link, frame = (output["data"]["text/html"] for output in shown)
    assert [output["output_type"] for output in shown] == ["display_data", "display_data"]
    assert f'<a href="{url}" target="_blank" rel="noopener">{url}</a>' in link
    assert "<strong>nb &lt;1&gt;</strong>" in link  # the run's name escaped
    assert f'src="{url}"' in frame and "<iframe" in frame and 'width="100%"' in frame
    assert server.get(f"/api/v1/runs/{run_id}")["name"] == "nb <1>"
    # Turned off: no display, the one line instead.
    assert [o["output_type"] for o in off] == ["stream"] and off[0]["name"] == "stderr"
    assert off[0]["text"].startswith("trainvitals: View run off at ")
    assert "display_data" not in json.dumps(off)


def test_the_environment_turns_the_inline_view_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("0", "false", "Off", "no"):
        monkeypatch.setenv("TRAINVITALS_NOTEBOOK", value)
        assert not notebook.enabled(None) and notebook.enabled(True)
    monkeypatch.setenv("TRAINVITALS_NOTEBOOK", "1")
    assert notebook.enabled(None) and not notebook.enabled(False)
    assert notebook.kernel() is None  # pytest is no notebook, IPython loaded or not
