"""Which recorded points are sent at the next look rather than at the next send."""

from __future__ import annotations

import math

from trainvitals.agent.urgency import MEMORY_ETA, MIN_HISTORY, RISE, SUSTAIN, Urgency
from trainvitals.protocol import Columns, SeqColumns
from trainvitals.series import (
    GRAD_GLOBAL_NORM,
    HOST_LIMIT,
    HOST_RSS,
    LOSS,
    NONFINITE_GRADS,
    NONFINITE_INPUTS,
)


def norms(values: list[float]) -> dict[str, SeqColumns]:
    return {GRAD_GLOBAL_NORM: Columns(list(range(len(values))), [0.0] * len(values), values)}


def test_a_nan_anywhere_is_urgent_and_healthy_values_are_not() -> None:
    urgency = Urgency()
    assert not urgency.values_are_urgent({LOSS: 0.5, NONFINITE_INPUTS: 0.0, "acc": math.nan})
    assert urgency.values_are_urgent({NONFINITE_INPUTS: 3.0})
    assert urgency.values_are_urgent({NONFINITE_GRADS: math.nan})  # a count that is itself broken
    assert urgency.values_are_urgent({LOSS: math.inf})
    assert urgency.columns_are_urgent({LOSS: Columns([1, 2], [0.0, 0.0], [0.4, math.nan])})
    assert urgency.values_are_urgent({GRAD_GLOBAL_NORM: math.nan})


def test_a_steep_rise_of_the_gradient_norm_is_urgent_once_there_is_a_history() -> None:
    urgency = Urgency()
    assert not urgency.columns_are_urgent(
        norms([1.0] * (MIN_HISTORY - 1) + [100.0] * 3)
    )  # too little
    urgency = Urgency()
    assert not urgency.columns_are_urgent(norms([1.0 + 0.01 * (i % 7) for i in range(MIN_HISTORY)]))
    assert not urgency.columns_are_urgent(norms([1.5, 2.0, 0.2]))  # noise, below RISE x the median
    assert urgency.columns_are_urgent(norms([1.1] + [RISE * 1.05] * SUSTAIN))
    assert urgency.columns_are_urgent(norms([RISE * 1.05] * 400))  # against the median before them
    # The median moves with the norm: the new level, held, is no longer a rise.
    assert not urgency.values_are_urgent({GRAD_GLOBAL_NORM: RISE * 1.1})
    # A streak may span blocks: the recorded norms before a block lead into it.
    assert not urgency.values_are_urgent({GRAD_GLOBAL_NORM: RISE * RISE * 1.1})
    assert not urgency.values_are_urgent({GRAD_GLOBAL_NORM: RISE * RISE * 1.1})
    assert urgency.values_are_urgent({GRAD_GLOBAL_NORM: RISE * RISE * 1.1})


def test_single_spikes_of_a_noisy_norm_are_not_urgent() -> None:
    """Small batches give norms several times their median now and then; only a rise held
    for SUSTAIN steps is sent at once, or a noisy run would send at every look."""
    urgency = Urgency()
    noisy = [1.0] * MIN_HISTORY
    assert not urgency.columns_are_urgent(norms(noisy))
    spikes = [RISE * 2 if i % (SUSTAIN + 1) == 0 else 1.0 for i in range(200)]
    assert not urgency.columns_are_urgent(norms(spikes))
    assert not urgency.columns_are_urgent(norms([RISE * 2] * (SUSTAIN - 1) + [1.0]))
    assert urgency.columns_are_urgent(norms([1.0] + [RISE * 2] * SUSTAIN))


def test_memory_about_to_reach_its_limit_is_urgent_and_memory_standing_still_is_not() -> None:
    """Judged on the rate since the reading before: an OOM kill seconds away takes the points
    not yet sent with it; a high but steady memory waits its turn."""
    urgency = Urgency()
    gib = 2.0**30

    def host(used: float, now: float, limit: float = 16 * gib) -> bool:
        return urgency.memory_is_urgent(
            {HOST_RSS: used, HOST_LIMIT: limit, "host/cpu_percent": 50}, now
        )

    assert not host(15 * gib, 0.0)  # high, but one reading has no rate
    assert not host(15 * gib, 1.0)  # and standing still
    assert not host(10 * gib, 2.0)  # falling
    assert not host(10.4 * gib, 3.0)  # 0.4 GiB/s: 14 s left
    assert host(11 * gib, 4.0)  # 0.6 GiB/s: 8.3 s left (< MEMORY_ETA)
    assert host(16 * gib, 4.5)  # at the limit
    assert not host(1 * gib, 9.0) and not host(1.5 * gib, 10.0)  # 0.5 GiB/s, far off
    # A GPU by TensorFlow's allocator where it reports (NVML's "used" is the reservation),
    # by NVML otherwise; each memory on its own history.
    tf_gpu = {"gpu0/mem_total": 80e9, "gpu0/mem_used": 79e9, "gpu1/mem_total": 80e9}
    assert not urgency.memory_is_urgent(
        {**tf_gpu, "gpu0/tf_current": 10e9, "gpu1/mem_used": 5e9}, 20.0
    )
    assert not urgency.memory_is_urgent(
        {**tf_gpu, "gpu0/tf_current": 10e9, "gpu1/mem_used": 5e9}, 21.0
    )
    assert urgency.memory_is_urgent({**tf_gpu, "gpu0/tf_current": 75e9, "gpu1/mem_used": 5e9}, 22.0)
    assert urgency.memory_is_urgent(
        {**tf_gpu, "gpu0/tf_current": 75e9, "gpu1/mem_used": 75e9}, 23.0
    )
    assert not urgency.memory_is_urgent({HOST_RSS: math.nan, HOST_LIMIT: 16 * gib}, 24.0)
    assert MEMORY_ETA == 10.0


def test_a_peek_judges_norms_without_learning_them() -> None:
    """The sender judges rows it has read before they are recorded: a peek must not add
    their norms to the history, or recording them would judge them against themselves."""
    urgency = Urgency()
    assert not urgency.columns_are_urgent(norms([1.0] * MIN_HISTORY))
    high = {GRAD_GLOBAL_NORM: [RISE * 1.05] * 400}
    assert urgency.would_be_urgent(high) and urgency.would_be_urgent(
        high
    )  # looked at twice, still a rise
    assert urgency.columns_are_urgent(
        norms(high[GRAD_GLOBAL_NORM])
    )  # recorded: judged, then learnt
    assert not urgency.would_be_urgent(high)
    assert urgency.would_be_urgent({LOSS: [0.1, math.nan]}) and not urgency.would_be_urgent(
        {LOSS: [0.1]}
    )
