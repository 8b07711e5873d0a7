"""The planner as a pure policy: scripted traffic on a fake clock, decisions out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from yieldgate.harness.planner import Capacity, Decision, Planner, PlannerConfig

CONFIG = PlannerConfig(
    ttft_ms=100.0,
    tpot_ms=20.0,
    window_s=5.0,
    min_samples=4,
    interval_s=0.5,
    cooldown_s=1.0,
    max_prefill_workers=2,
    min_decode_seqs=2,
    max_decode_seqs=8,
    decode_step=2,
    long_prompt_tokens=100,
)
# Issue 32's rule: idle workers stopped, a TTFT miss never moves the batch, a lagging window.
LEGACY = replace(CONFIG, stop_idle_workers=True, ttft_bounds_batch=False, mix_shift=None)


class Split:
    """A fake harness: the split in force, changed by applying the planner's decisions."""

    def __init__(self, workers: int = 1, decode_seqs: int = 8) -> None:
        self.workers = workers
        self.decode_seqs = decode_seqs
        self.prefill_queue = 0
        self.decode_running = 0

    def capacity(self) -> Capacity:
        return Capacity(
            prefill_workers=self.workers,
            prefill_queue=self.prefill_queue,
            decode_seqs=self.decode_seqs,
            decode_running=self.decode_running,
        )

    def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if decision.action == "set_decode_seqs":
                self.decode_seqs = decision.target
            else:
                self.workers = decision.target


def feed(planner: Planner, start: float, n: int, *, ttft: float, tpot: float, prompt: int) -> float:
    """``n`` finished requests, 0.1 s apart from ``start``; returns the time after the last."""
    now = start
    for _ in range(n):
        planner.record(now, ttft_ms=ttft, tpot_ms=tpot, prompt_tokens=prompt)
        now += 0.1
    return now


def test_it_holds_until_it_has_seen_enough() -> None:
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 3, ttft=500, tpot=5, prompt=400)
    assert planner.decide(now, Split().capacity()) == []
    assert planner.last_hold == "too_few_samples"


def test_a_traffic_shift_moves_capacity_both_ways() -> None:
    """Long prompts and short outputs, then short prompts and long outputs, then calm."""
    planner = Planner(LEGACY)
    split = Split(workers=1, decode_seqs=8)
    log: list[tuple[str, int, str]] = []
    now = 0.0

    def step(n: int, **kwargs: float) -> None:
        nonlocal now
        now = feed(planner, now, n, **kwargs)  # type: ignore[arg-type]
        decisions = planner.decide(now, split.capacity())
        split.apply(decisions)
        log.extend((d.action, d.target, d.reason) for d in decisions)
        now += 1.0  # past the cooldown

    # Phase 1: summarisation. Long prompts, TTFT over its objective: more prefill.
    split.prefill_queue = 3
    step(6, ttft=400, tpot=10, prompt=1000)
    step(6, ttft=300, tpot=10, prompt=1000)
    step(6, ttft=250, tpot=10, prompt=1000)  # at max_prefill_workers: holds
    assert planner.last_hold == "prefill_at_max"
    # Phase 2: reasoning. Short prompts, long outputs, TPOT over: prefill gives way.
    split.prefill_queue = 0
    split.decode_running = 8
    step(6, ttft=30, tpot=40, prompt=20)
    # Phase 1's slow first tokens are still in the window: both objectives missed.
    assert planner.last_hold == "overloaded"
    for _ in range(7):
        step(6, ttft=30, tpot=40, prompt=20)
    assert planner.last_hold == "decode_at_min"
    # Phase 3: calm, decode full with headroom: the batch grows again.
    split.decode_running = 1
    now += CONFIG.window_s  # phase 2's slow tokens leave the window
    step(6, ttft=30, tpot=5, prompt=20)
    assert planner.last_hold == "within_objectives"  # decode is not full: no need
    split.decode_running = 2
    step(6, ttft=30, tpot=5, prompt=20)
    assert log == [
        ("start_prefill_worker", 2, "ttft_over_objective"),
        ("stop_prefill_worker", 1, "reassign_to_decode"),
        ("stop_prefill_worker", 0, "reassign_to_decode"),
        ("set_decode_seqs", 6, "tpot_over_objective"),
        ("set_decode_seqs", 4, "tpot_over_objective"),
        ("set_decode_seqs", 2, "tpot_over_objective"),
        ("set_decode_seqs", 4, "decode_headroom"),
    ]
    assert (split.workers, split.decode_seqs) == (0, 4)
    stats = planner.stats()
    assert stats["decisions_total"] == 7
    first = stats["decisions"][0]
    assert first["reason"] == "ttft_over_objective"
    assert first["ttft_ms"] == 400
    assert first["capacity"]["prefill_workers"] == 1


def test_colocated_serving_when_offload_does_not_pay_and_back() -> None:
    planner = Planner(LEGACY)
    split = Split(workers=2)
    now = feed(planner, 0.0, 5, ttft=20, tpot=5, prompt=10)
    split.apply(planner.decide(now, split.capacity()))
    now = feed(planner, now + 2, 5, ttft=20, tpot=5, prompt=10)
    split.apply(planner.decide(now, split.capacity()))
    reasons = [d.reason for d in planner.decisions]
    assert reasons == ["offload_unused", "colocate"]
    assert split.workers == 0
    # Long prompts come back and the TTFT misses: disaggregate again.
    now = feed(planner, now + 2, 5, ttft=300, tpot=5, prompt=500)
    split.apply(planner.decide(now, split.capacity()))
    assert planner.decisions[-1].reason == "disaggregate"
    assert split.workers == 1


def test_short_prompts_missing_ttft_get_no_prefill_worker() -> None:
    planner = Planner(LEGACY)
    now = feed(planner, 0.0, 5, ttft=300, tpot=5, prompt=10)
    assert planner.decide(now, Split(workers=0).capacity()) == []
    assert planner.last_hold == "ttft_over_objective_short_prompts"


def test_both_objectives_missed_is_not_a_split_problem() -> None:
    planner = Planner(LEGACY)
    now = feed(planner, 0.0, 5, ttft=300, tpot=50, prompt=500)
    assert planner.decide(now, Split().capacity()) == []
    assert planner.last_hold == "overloaded"


def test_both_missed_with_a_prefill_backlog_adds_a_prefill_worker() -> None:
    planner = Planner(LEGACY)
    split = Split(workers=1)
    split.prefill_queue = 2  # one prompt waiting behind the one being prefilled
    now = feed(planner, 0.0, 5, ttft=300, tpot=50, prompt=500)
    split.apply(planner.decide(now, split.capacity()))
    assert planner.decisions[-1].reason == "prefill_backlog"
    assert split.workers == 2
    split.prefill_queue = 2  # one each: no backlog
    now = feed(planner, now + 2, 5, ttft=300, tpot=50, prompt=500)
    assert planner.decide(now, split.capacity()) == []
    assert planner.last_hold == "overloaded"


def test_a_full_decode_batch_with_sequences_swapped_out_is_not_grown() -> None:
    # Issue 32: swapped-out sequences are decode load too. Memory, not the batch
    # size, holds them back, so a bigger batch would only admit more to swap.
    planner = Planner(CONFIG)
    state = Capacity(
        prefill_workers=1, prefill_queue=0, decode_seqs=4, decode_running=4, decode_swapped=2
    )
    now = feed(planner, 0.0, 5, ttft=30, tpot=5, prompt=500)
    assert planner.decide(now, state) == []
    assert planner.last_hold == "decode_memory_bound"
    now = feed(planner, now + 2, 5, ttft=30, tpot=5, prompt=500)
    (grow,) = planner.decide(now, replace(state, decode_swapped=0))
    assert (grow.action, grow.target, grow.reason) == ("set_decode_seqs", 6, "decode_headroom")


def test_pacing_interval_cooldown_and_a_fresh_window() -> None:
    planner = Planner(CONFIG)
    split = Split(workers=0)
    now = feed(planner, 0.0, 5, ttft=300, tpot=5, prompt=500)
    split.apply(planner.decide(now, split.capacity()))
    assert split.workers == 1
    # Within the interval: not even looked at.
    assert planner.decide(now + 0.1, split.capacity()) == []
    # Samples from before the change are gone: the window starts again.
    assert planner.stats()["samples"] == 0
    feed(planner, now, 5, ttft=300, tpot=5, prompt=500)
    assert planner.decide(now + 0.6, split.capacity()) == []
    assert planner.last_hold == "cooldown"
    assert planner.decide(now + 1.2, split.capacity())[0].target == 2


def test_old_samples_leave_the_window() -> None:
    planner = Planner(CONFIG)
    feed(planner, 0.0, 5, ttft=300, tpot=5, prompt=500)
    assert planner.decide(100.0, Split().capacity()) == []
    assert planner.last_hold == "too_few_samples"


def test_issue_42_a_shift_moves_the_batch_and_keeps_the_workers() -> None:
    """Summarise at max prefill workers: the TTFT misses, so the batch bounds the queue.
    Then reason: short prompts, a full batch with headroom on both objectives: it grows
    with the headroom.
    The idle prefill workers stay (stopping them would free no CPU and cost a restart)."""
    planner = Planner(CONFIG)
    split = Split(workers=2, decode_seqs=8)
    log: list[tuple[str, int, str]] = []
    now = 0.0

    def step(n: int, **kwargs: float) -> None:
        nonlocal now
        now = feed(planner, now, n, **kwargs)  # type: ignore[arg-type]
        decisions = planner.decide(now, split.capacity())
        split.apply(decisions)
        log.extend((d.action, d.target, d.reason) for d in decisions)
        now += 1.0

    split.prefill_queue = 1
    step(6, ttft=130, tpot=0, prompt=1000)  # 8 x 100/130: 6
    step(6, ttft=150, tpot=0, prompt=1000)  # 6 x 100/150: 4
    step(6, ttft=90, tpot=0, prompt=1000)  # met, without headroom: no growth
    assert planner.last_hold == "within_objectives"
    split.prefill_queue = 0
    split.decode_running = 4
    # Headroom x4 on the TPOT, x5 on the TTFT: 4 x 0.5 x 4, in one step (at most doubling).
    step(6, ttft=20, tpot=5, prompt=20)
    split.decode_running = 8
    step(6, ttft=20, tpot=5, prompt=20)  # at max_decode_seqs; workers idle, kept
    assert planner.last_hold == "within_objectives"
    assert log == [
        ("set_decode_seqs", 6, "ttft_queue_bound"),
        ("set_decode_seqs", 4, "ttft_queue_bound"),
        ("set_decode_seqs", 8, "decode_headroom"),
    ]
    assert split.workers == 2


def test_issue_42_a_ttft_miss_still_adds_a_prefill_worker_first() -> None:
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 5, ttft=300, tpot=5, prompt=500)
    [decision] = planner.decide(now, Split(workers=1).capacity())
    assert (decision.action, decision.reason) == ("start_prefill_worker", "ttft_over_objective")


def test_issue_42_short_prompts_missing_ttft_bound_the_batch() -> None:
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 5, ttft=300, tpot=5, prompt=10)
    [decision] = planner.decide(now, Split(workers=0, decode_seqs=8).capacity())
    # In proportion to the miss: 8 x 100 / 300, not one step of 2.
    assert (decision.action, decision.target, decision.reason) == (
        "set_decode_seqs",
        2,
        "ttft_queue_bound",
    )
    now = feed(planner, now + 2, 5, ttft=300, tpot=5, prompt=10)
    assert planner.decide(now, Split(workers=0, decode_seqs=2).capacity()) == []
    assert planner.last_hold == "ttft_over_objective_short_prompts"


def test_issue_42_both_missed_lowers_the_batch() -> None:
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 5, ttft=300, tpot=50, prompt=500)
    [decision] = planner.decide(now, Split(workers=2, decode_seqs=8).capacity())
    assert (decision.action, decision.target, decision.reason) == (
        "set_decode_seqs",
        6,
        "overloaded",
    )


def test_issue_42_idle_workers_are_kept_unless_asked() -> None:
    """TPOT missed, nothing queued at the workers: the batch shrinks, no worker stops."""
    split = Split(workers=1, decode_seqs=8)
    for config, expected in (
        (CONFIG, ("set_decode_seqs", "tpot_over_objective")),
        (replace(CONFIG, stop_idle_workers=True), ("stop_prefill_worker", "reassign_to_decode")),
    ):
        planner = Planner(config)
        now = feed(planner, 0.0, 5, ttft=20, tpot=50, prompt=10)
        [decision] = planner.decide(now, split.capacity())
        assert (decision.action, decision.reason) == expected
    # Both met with short prompts: the worker stays, by default.
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 5, ttft=20, tpot=15, prompt=10)
    assert planner.decide(now, split.capacity()) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ttft_ms": 0}, "ttft_ms"),
        ({"tpot_ms": -1.0}, "tpot_ms"),
        ({"percentile": 101}, "percentile"),
        ({"headroom": 1.5}, "headroom"),
        ({"min_long_share": 2.0}, "min_long_share"),
        ({"min_samples": 0}, "min_samples"),
        ({"min_prefill_workers": 3, "max_prefill_workers": 2}, "max_prefill_workers"),
        ({"min_decode_seqs": 0}, "min_decode_seqs"),
        ({"max_decode_seqs": 1, "min_decode_seqs": 2}, "max_decode_seqs"),
        ({"decode_step": 0}, "decode_step"),
        ({"window_s": float("inf")}, "window_s"),
        ({"interval_s": True}, "interval_s"),
        ({"stop_idle_workers": 1}, "stop_idle_workers"),
        ({"ttft_bounds_batch": "yes"}, "ttft_bounds_batch"),
    ],
)
def test_bad_configs_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PlannerConfig(**kwargs)  # type: ignore[arg-type]


def test_bad_samples_are_refused() -> None:
    planner = Planner(CONFIG)
    with pytest.raises(ValueError, match="ttft_ms"):
        planner.record(0.0, ttft_ms=-1.0, tpot_ms=None, prompt_tokens=1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        planner.record(0.0, ttft_ms=1.0, tpot_ms=None, prompt_tokens=-1)


def test_issue_42_a_change_in_the_prompt_mix_empties_the_window() -> None:
    """The requests of a phase that ended no longer judge the split of the next one."""
    planner = Planner(CONFIG)
    split = Split(workers=2, decode_seqs=6)
    split.decode_running = 6
    now = feed(planner, 0.0, 8, ttft=95, tpot=0, prompt=1000)  # long prompts, TTFT just met
    now = feed(planner, now, 1, ttft=20, tpot=5, prompt=20)  # one short prompt: no shift yet
    assert planner.decide(now, split.capacity()) == []
    assert planner.last_hold == "within_objectives"  # the long prompts' TTFT lacks headroom
    assert planner.stats()["mix_shifts"] == 0
    now = feed(planner, now + 1, 3, ttft=20, tpot=5, prompt=20)  # min_samples short ones now
    [grow] = planner.decide(now, split.capacity())
    assert (grow.reason, grow.samples) == ("decode_headroom", 4)
    assert planner.stats()["mix_shifts"] == 1
    # Without the rule, the long prompts' TTFT keeps the batch where it is.
    lagging = Planner(replace(CONFIG, mix_shift=None))
    now = feed(lagging, 0.0, 8, ttft=95, tpot=0, prompt=1000)
    now = feed(lagging, now + 1, 8, ttft=20, tpot=5, prompt=20)
    assert lagging.decide(now, split.capacity()) == []


def test_issue_42_growth_follows_the_headroom_within_bounds() -> None:
    config = replace(CONFIG, max_decode_seqs=16)
    targets = []
    for seqs, tpot in ((4, 1.0), (6, 10.0)):  # x20 headroom: doubles; x2 x 0.5: one step
        planner = Planner(config)
        now = feed(planner, 0.0, 5, ttft=1, tpot=tpot, prompt=10)
        state = Capacity(prefill_workers=0, prefill_queue=0, decode_seqs=seqs, decode_running=seqs)
        [grow] = planner.decide(now, state)
        assert grow.reason == "decode_headroom"
        targets.append(grow.target)
    assert targets == [8, 8]
