"""Detection is a function of the stream: recorded runs judged in other frames raise the
same alerts at the same steps (rules about time itself aside).

The streams in ``recorded/`` are real runs of the zoo (benchmarks/zoo.py), as the server
stored them: a learning rate that grows until the loss diverges, a deep sigmoid stack whose
gradients vanish, a NaN in a batch, ReLUs that all die mid-run, steps slowed mid-run (whose
alert, judged on the step times the stream carries, must not move with the frames either),
and a NaN in a batch with a step soon after it that the agent stamped late, after the steps
that follow it (judged step by step while the spike lasts, it is still judged in its place).
The agent cuts a run into a frame a second, so the same run on a faster or slower machine
reaches the detector in other frames.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import framing

RECORDED = sorted((Path(__file__).parent / "recorded").glob("*.json.gz"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.name.split(".")[0] for p in RECORDED])
def test_a_recorded_run_raises_the_same_alerts_however_it_is_cut(path: Path) -> None:
    stream, env = framing.load(path)
    step_by_step = framing.raised(stream, framing.every(stream, 1), env)
    assert step_by_step, f"{path.name} raises nothing: no evidence either way"
    cuts = {
        "whole": [framing.last_step(stream) + 1],
        "a frame a second": framing.by_seconds(stream),
        "frames of 3 steps": framing.every(stream, 3),
        "random frames at half the pace": framing.at_random(stream, 1),
    }
    for how, ends in cuts.items():
        paced = framing.stretched(stream, 2.0) if "pace" in how else stream
        assert framing.raised(paced, ends, env) == step_by_step, how
