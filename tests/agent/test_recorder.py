"""The recorder's timelines and the callback's logs fallback, without a training: which step
and time each ring row is (``FitSteps`` for ``fit``, ``LoggedSteps`` for ``Monitor``), the
batches ``Monitor`` keeps for the autopsy, and the steps that ride in Keras's logs. The
recorder itself reads a real ring in test_keras_callback.py and test_monitor.py."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tests.agent.test_packing import ALL, vector
from trainvitals.agent.config import AgentConfig, resolve
from trainvitals.agent.fit_steps import FitSteps, to_unix
from trainvitals.agent.logs_fallback import BATCH_STEPS, LogsFallback, numbers_in
from trainvitals.agent.loop_steps import LoggedSteps, ReplayBatches
from trainvitals.agent.recorder import Evidence, Recorder
from trainvitals.agent.run import Run
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import SeqColumns

if TYPE_CHECKING:
    from trainvitals.agent.ring import DeviceRing


class Recorded(Run):
    """A run that keeps the columns handed to it."""

    def __init__(self, config: AgentConfig) -> None:
        super().__init__(config)
        self.columns: dict[str, SeqColumns] = {}

    def add_columns(
        self, columns: Mapping[str, SeqColumns], clock: Sequence[tuple[int, float]] = ()
    ) -> None:
        self.columns.update(columns)
        super().add_columns(columns, clock)


@dataclass
class NoRing:
    ring: DeviceRing | None = None


def test_logged_steps_place_each_write_at_the_step_and_time_it_was_logged() -> None:
    steps = LoggedSteps()
    for step in (10, 20, 30):
        steps.note(step, 1000.0 + step)
    assert steps.written == 3
    placed = steps.place(np.array([1, 2], np.int64))
    assert (placed.steps, placed.times, placed.columns) == ([10, 20], [1010.0, 1020.0], {})
    steps.note(40, 1040.0)
    steps.unnote()  # that write failed: the next one takes its number
    steps.note(50, 1050.0)
    assert steps.place(np.array([3, 4], np.int64)).steps == [30, 50]
    steps.restart(7)  # another layout's ring, read up to its write 7
    steps.note(60, 1060.0)
    assert steps.written == 8 and steps.place(np.array([8], np.int64)).steps == [60]
    assert steps.place(np.array([], np.int64)).steps == [] and steps.reached() == 0


def test_replay_batches_keep_the_latest_within_their_bytes_and_always_the_last() -> None:
    batch = np.zeros((4, 8), np.float32)  # 128 bytes
    batches = ReplayBatches(limit=300)
    for step in range(4):
        batches.keep(step, batch + step, None)
    assert batches.evidence(1).inputs is None  # let go: three would pass 300 bytes
    kept = batches.evidence(3)
    assert kept.inputs is not None and kept.inputs[0, 0] == 3 and kept.after_update
    big = ReplayBatches(limit=10)
    big.keep(0, batch, batch)
    assert big.evidence(0).targets is batch  # the last one stays, whatever its size
    none = ReplayBatches(limit=0)
    none.keep(0, batch, None)
    assert none.evidence(0).inputs is None


def test_fit_steps_number_executions_past_an_epoch_at_its_last_step() -> None:
    steps = FitSteps(NoRing(), epoch_steps=5)
    assert [steps.step_of(b) for b in (0, 4, 7)] == [1, 5, 5]
    steps.ended(5, time.monotonic())
    steps.epoch_read(4)  # the epoch's rows were read up to 4: the next epoch follows them
    steps.epoch_began()
    assert steps.last == 4 and steps.step_of(0) == 5 and steps.reached() == 0


@dataclass
class ReadRing:
    """A ring whose rows up to ``read_upto`` a read has seen (their values aside)."""

    read_upto: int

    def keep(self, upto: int | None) -> None:
        return None


def test_a_row_timed_at_its_read_is_never_after_the_rows_that_follow_it() -> None:
    """A read finds row 3 written before its execution's end is noted, and times it at the
    read; the read ran long, and rows 4 and 5 ended (their ends noted) before it returned.
    They are timed no earlier than row 3: the stream's times keep the steps' order."""
    steps = FitSteps(NoRing())
    run = Recorded(resolve(server="http://127.0.0.1:9", run_name="timed"))
    start = time.monotonic()
    steps.ended(2, start - 2.0)
    steps.keep(ReadRing(3), None, run)  # type: ignore[arg-type]
    first = steps.place(np.array([1, 2, 3], np.int64))
    steps.ended(3, start - 1.5)
    steps.ended(5, start - 1.0)
    steps.keep(ReadRing(5), None, run)  # type: ignore[arg-type]
    second = steps.place(np.array([4, 5], np.int64))
    times = first.times + second.times
    assert times == sorted(times) and times[2] >= start + to_unix() - 0.001, times


def test_the_recorder_times_the_rows_between_execution_ends_and_autopsies_the_first_nan() -> None:
    """A real ring, as the tapped step writes it: rows 1-4 of two executions of two steps.
    Nobody sends (the run is not started), so every look hands its rows over."""
    tf = pytest.importorskip("tensorflow")
    from trainvitals.agent.ring import DeviceRing

    ring = DeviceRing(width=len(vector()))
    write = tf.function(ring.write)
    steps = FitSteps(NoRing(ring))
    start = time.monotonic()
    for step in range(1, 5):
        write(tf.constant(vector(inputs=3.0 if step in (3, 4) else 0.0)))
        if step % 2 == 0:
            steps.ended(step, start + step)
    run = Recorded(resolve(server="http://127.0.0.1:9", run_name="recorded"))
    asked: list[int] = []

    def evidence(step: int) -> Evidence:
        asked.append(step)
        return Evidence()

    recorder = Recorder(run, None, StepVitals(), steps, evidence)
    assert recorder.look(ring, ALL)
    assert run.last_step == 4 and asked == [3]  # the first NaN step only
    loss = run.columns["loss"]
    assert loss.steps == [1, 2, 3, 4]
    expected = [start + step + to_unix() for step in (1, 2, 3, 4)]
    np.testing.assert_allclose(loss.times, expected, atol=0.05)  # step 1: from the fit's start
    assert steps.reached() == 4
    placed = steps.place(np.array([], np.int64))
    assert placed.steps == [] and placed.columns == {}


def test_the_logs_fallback_holds_steps_until_a_batch_a_nan_or_the_end() -> None:
    steps = FitSteps(NoRing())
    fallback = LogsFallback(steps, StepVitals(), read_interval=3600.0, at_once=False)
    now = time.monotonic()
    logs = {"loss": 0.7, "accuracy": 0.5, "note": "text"}
    for step in range(1, BATCH_STEPS):
        assert fallback.add(step, now, vector(), logs, ALL) is None
    batch = fallback.add(BATCH_STEPS, now, vector(), logs, ALL)
    assert batch is not None and batch.steps == list(range(1, BATCH_STEPS + 1))
    assert "accuracy" in batch.columns and batch.columns["loss"].values[0] == np.float32(0.5)
    assert fallback.add(BATCH_STEPS + 1, now, None, logs, ALL) is None
    sick = fallback.add(BATCH_STEPS + 2, now, vector(inputs=3.0), logs, ALL)
    assert sick is not None and sick.sick == [BATCH_STEPS + 2] and steps.last == BATCH_STEPS + 2
    assert fallback.take(ALL) is None
    fallback.add(BATCH_STEPS + 3, now, None, logs, ALL)
    rest = fallback.take(ALL)
    assert rest is not None and rest.steps == [BATCH_STEPS + 3]
    assert numbers_in(logs) == {"loss": 0.7, "accuracy": 0.5} and numbers_in(None) == {}
