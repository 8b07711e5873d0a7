from __future__ import annotations

from typing import Any

import pytest

from yieldgate.harness.qos import (
    MIN_PREFILL_TOKENS,
    QosPolicy,
    SloConfig,
    TtftEstimator,
    prefill_step_counts,
)
from yieldgate.protocol import Priority, YieldReason
from yieldgate.server.governor import Rejection

# -- SloConfig ------------------------------------------------------------------


def test_slo_defaults_and_ttft_for() -> None:
    slo = SloConfig()
    assert slo.ttft_for(Priority.HIGH) is None
    assert slo.ttft_for(Priority.NORMAL) == 2000.0
    assert slo.ttft_for(Priority.LOW) == 500.0
    assert slo.tpot_ms == 100.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ttft_ms_low": 0}, "ttft_ms_low"),
        ({"ttft_ms_normal": -5.0}, "ttft_ms_normal"),
        ({"ttft_ms_high": float("nan")}, "ttft_ms_high"),
        ({"ttft_ms_high": True}, "ttft_ms_high"),
        ({"tpot_ms": None}, "tpot_ms"),
        ({"tpot_ms": float("inf")}, "tpot_ms"),
    ],
)
def test_slo_rejects_bad_values(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SloConfig(**changes)


# -- TtftEstimator ----------------------------------------------------------------


def test_estimator_is_none_until_measured() -> None:
    estimator = TtftEstimator()
    assert (
        estimator.estimate_ms(prompt_tokens=10, queued_prefill_tokens=0, decode_running=0) is None
    )
    estimator.observe_prefill(100, 50.0)
    assert estimator.estimate_ms(prompt_tokens=10, queued_prefill_tokens=0, decode_running=0) == 5.0
    # Decode running but never measured: no estimate rather than a guess.
    assert (
        estimator.estimate_ms(prompt_tokens=10, queued_prefill_tokens=0, decode_running=2) is None
    )


def test_estimate_adds_the_queue_ahead_and_one_decode_step() -> None:
    estimator = TtftEstimator(prefill_ms_per_token=0.5, decode_step_ms=20.0)
    assert estimator.estimate_ms(
        prompt_tokens=100, queued_prefill_tokens=300, decode_running=0
    ) == (200.0)
    assert estimator.estimate_ms(
        prompt_tokens=100, queued_prefill_tokens=300, decode_running=3
    ) == (220.0)


def test_a_chunked_prefill_waits_a_decode_step_between_pieces() -> None:
    estimator = TtftEstimator(prefill_ms_per_token=0.5, decode_step_ms=20.0, prefill_chunk=64)
    # 400 tokens in 7 pieces: the step boundary, then a decode step between each two.
    assert estimator.estimate_ms(
        prompt_tokens=100, queued_prefill_tokens=300, decode_running=3
    ) == (200.0 + 7 * 20.0)
    # Nothing decoding: the pieces run back to back.
    assert estimator.estimate_ms(
        prompt_tokens=100, queued_prefill_tokens=300, decode_running=0
    ) == (200.0)
    # One piece: only the step boundary, as unchunked.
    assert estimator.estimate_ms(prompt_tokens=64, queued_prefill_tokens=0, decode_running=3) == (
        32.0 + 20.0
    )
    # Prefilled at a prefill worker, which computes a prompt in one step: no pieces.
    assert estimator.estimate_ms(
        prompt_tokens=100, queued_prefill_tokens=300, decode_running=3, on_engine=False
    ) == (220.0)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="prefill_chunk"):
            TtftEstimator(prefill_chunk=bad)  # type: ignore[arg-type]


def test_estimator_averages_with_alpha() -> None:
    estimator = TtftEstimator(alpha=0.5)
    estimator.observe_prefill(40, 40.0)  # 1.0 ms/token, the first sets it
    estimator.observe_prefill(40, 120.0)  # 3.0 ms/token -> 2.0
    estimator.observe_prefill(0, 999.0)  # nothing computed: ignored
    assert estimator.prefill_ms_per_token == 2.0
    estimator.observe_decode_step(8.0)
    estimator.observe_decode_step(4.0)
    assert estimator.decode_step_ms == 6.0


def test_a_short_prefill_step_does_not_move_the_per_token_average() -> None:
    """A one-token step (the last token of a prompt whose KV came from a prefill worker)
    costs the step's own time: per token, it would make every prompt look slow."""
    estimator = TtftEstimator()
    estimator.observe_prefill(1, 6.0)  # the first reading sets it, whatever its size
    assert estimator.prefill_ms_per_token == 6.0
    estimator.observe_prefill(768, 192.0)
    assert estimator.prefill_ms_per_token == pytest.approx(6.0 + 0.2 * (0.25 - 6.0))
    settled = TtftEstimator(prefill_ms_per_token=0.25)
    for _ in range(50):
        settled.observe_prefill(1, 6.0)
        settled.observe_prefill(MIN_PREFILL_TOKENS - 1, 8.0)
    assert settled.prefill_ms_per_token == 0.25
    settled.observe_prefill(MIN_PREFILL_TOKENS, MIN_PREFILL_TOKENS * 0.5)
    assert settled.prefill_ms_per_token == pytest.approx(0.25 + 0.2 * 0.25)


def test_a_chunk_smaller_than_the_floor_still_moves_the_average() -> None:
    # Chunks of 16 computed every long prompt in 16-token steps: under the floor
    # of 32 alone, the first reading would have been the last.
    chunked = TtftEstimator(prefill_chunk=16, prefill_ms_per_token=0.25)
    chunked.observe_prefill(16, 16 * 0.5)
    assert chunked.prefill_ms_per_token == pytest.approx(0.25 + 0.2 * 0.25)
    chunked.observe_prefill(15, 15 * 9.0)
    assert chunked.prefill_ms_per_token == pytest.approx(0.25 + 0.2 * 0.25)
    assert prefill_step_counts(1, chunk=0, averaged=False)
    assert not prefill_step_counts(0, chunk=0, averaged=False)
    assert not prefill_step_counts(MIN_PREFILL_TOKENS - 1, chunk=0, averaged=True)
    assert not prefill_step_counts(MIN_PREFILL_TOKENS - 1, chunk=64, averaged=True)
    assert prefill_step_counts(7, chunk=7, averaged=True)


def test_estimator_validates() -> None:
    with pytest.raises(ValueError, match="alpha"):
        TtftEstimator(alpha=0)
    with pytest.raises(ValueError, match="prefill_ms_per_token"):
        TtftEstimator(prefill_ms_per_token=-1.0)
    estimator = TtftEstimator()
    with pytest.raises(ValueError, match="tokens"):
        estimator.observe_prefill(-1, 1.0)
    with pytest.raises(ValueError, match="ms"):
        estimator.observe_decode_step(float("nan"))


# -- QosPolicy ------------------------------------------------------------------------


def policy(per_token: float | None = 1.0, step: float | None = 10.0) -> QosPolicy:
    estimator = TtftEstimator(prefill_ms_per_token=per_token, decode_step_ms=step)
    return QosPolicy(SloConfig(), estimator)


def check(qos: QosPolicy, priority: Priority, queued: int, **kw: int) -> Rejection | None:
    return qos.check(
        priority,
        prompt_tokens=kw.get("prompt", 100),
        queued_prefill_tokens=queued,
        decode_running=kw.get("running", 0),
        decode_steps_ahead=kw.get("ahead", 0),
    )


def test_everything_is_admitted_under_light_load() -> None:
    qos = policy()
    for priority in Priority:
        assert check(qos, priority, queued=200, running=4) is None  # 310 ms


def test_low_is_rejected_first_while_high_is_admitted() -> None:
    qos = policy()
    # 100 + 900 queued tokens at 1 ms, plus a 10 ms step: 1010 ms.
    rejection = check(qos, Priority.LOW, queued=900, running=1)
    assert rejection is not None
    assert rejection.reason is YieldReason.SLO
    assert check(qos, Priority.NORMAL, queued=900, running=1) is None
    assert check(qos, Priority.HIGH, queued=900, running=1) is None
    # Heavier still: 3010 ms misses normal's 2000 ms too; high has no objective.
    assert check(qos, Priority.NORMAL, queued=2900, running=1) is not None
    assert check(qos, Priority.HIGH, queued=100_000, running=1) is None


def test_retry_hint_is_the_excess_and_grows_with_the_queue() -> None:
    qos = policy()
    hints = []
    for queued in (500, 1000, 4000):
        rejection = check(qos, Priority.LOW, queued=queued, running=1)
        assert rejection is not None
        hints.append(rejection.retry_hint_ms)
    # estimate - 500 ms: (100 + queued) * 1 + 10 - 500
    assert hints == [110, 610, 3610]
    assert all(type(hint) is int for hint in hints)


def test_retry_hint_is_rounded_up_and_at_least_one_ms() -> None:
    qos = policy(per_token=0.25, step=None)
    # (100 + 1901) * 0.25 = 500.25 ms: 0.25 ms over, hinted as 1 ms.
    rejection = check(qos, Priority.LOW, queued=1901)
    assert rejection is not None
    assert rejection.retry_hint_ms == 1
    # Exactly on the objective is admitted.
    assert check(qos, Priority.LOW, queued=1900) is None
    # (100 + 1906) * 0.25 = 501.5 ms: 1.5 ms over, hinted as 2 ms.
    rejection = check(qos, Priority.LOW, queued=1906)
    assert rejection is not None
    assert rejection.retry_hint_ms == 2


def test_no_estimate_admits() -> None:
    qos = policy(per_token=None, step=None)
    assert check(qos, Priority.LOW, queued=10**9) is None
    qos = policy(per_token=1.0, step=None)
    assert check(qos, Priority.LOW, queued=10**6, running=1) is None


def test_a_prompt_too_long_for_its_objective_waits_only_for_the_queue() -> None:
    qos = policy()
    # 800 tokens take 800 ms on their own, over low's 500 ms: admitted when idle...
    assert check(qos, Priority.LOW, queued=0, prompt=800) is None
    assert check(qos, Priority.LOW, queued=0, prompt=800, running=2) is None
    # ...and rejected with a hint of just the queue ahead, not of the objective.
    rejection = check(qos, Priority.LOW, queued=300, prompt=800, running=2)
    assert rejection is not None
    assert rejection.retry_hint_ms == 300


def test_stats_count_by_priority() -> None:
    qos = policy()
    check(qos, Priority.LOW, queued=900)
    check(qos, Priority.LOW, queued=0)
    check(qos, Priority.NORMAL, queued=900)
    check(qos, Priority.HIGH, queued=10**6)
    stats = qos.stats()
    assert stats["checked"] == {"high": 1, "normal": 1, "low": 2}
    assert stats["rejected"] == {"high": 0, "normal": 0, "low": 1}
    assert stats["prefill_ms_per_token"] == 1.0
    assert stats["decode_step_ms"] == 10.0


def test_check_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        check(policy(), Priority.LOW, queued=-1)


def test_decode_steps_ahead_are_waited_for_and_are_work_ahead() -> None:
    # Swapped-out sequences hold new prompts back for 50 decode steps (issue 32).
    qos = policy()
    estimator = qos.estimator
    kw = {"prompt_tokens": 100, "queued_prefill_tokens": 0}
    assert estimator.estimate_ms(**kw, decode_running=3, decode_steps_ahead=50) == 600.0
    assert estimator.estimate_ms(**kw, decode_running=3, decode_steps_ahead=0) == 110.0
    assert estimator.estimate_ms(**kw, decode_running=0, decode_steps_ahead=2) == 120.0
    unmeasured = TtftEstimator(prefill_ms_per_token=1.0)
    assert unmeasured.estimate_ms(**kw, decode_running=0, decode_steps_ahead=2) is None
    # Nothing queued, yet low is rejected: 600 ms against its 500 ms, not against
    # the 110 ms the prompt takes with nothing ahead.
    assert check(qos, Priority.LOW, queued=0, running=3) is None
    rejection = check(qos, Priority.LOW, queued=0, running=3, ahead=50)
    assert rejection is not None
    assert rejection.retry_hint_ms == 100
    assert qos.excess_ms(500.0, **kw, decode_running=3, decode_steps_ahead=50) == (600.0, 500.0)
    with pytest.raises(ValueError, match=">= 0"):
        check(qos, Priority.LOW, queued=0, ahead=-1)


def test_policy_follows_new_measurements() -> None:
    estimator = TtftEstimator(alpha=1.0)
    qos = QosPolicy(SloConfig(), estimator)
    estimator.observe_prefill(100, 100.0)  # 1 ms/token
    assert check(qos, Priority.LOW, queued=300) is None  # 400 ms
    estimator.observe_prefill(100, 200.0)  # 2 ms/token
    rejection = check(qos, Priority.LOW, queued=300)  # 800 ms
    assert rejection is not None
    assert rejection.retry_hint_ms == 300
