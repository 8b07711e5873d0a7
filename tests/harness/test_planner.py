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
    planner = Planner(CONFIG)
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
    planner = Planner(CONFIG)
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
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 5, ttft=300, tpot=5, prompt=10)
    assert planner.decide(now, Split(workers=0).capacity()) == []
    assert planner.last_hold == "ttft_over_objective_short_prompts"


def test_both_objectives_missed_is_not_a_split_problem() -> None:
    planner = Planner(CONFIG)
    now = feed(planner, 0.0, 5, ttft=300, tpot=50, prompt=500)
    assert planner.decide(now, Split().capacity()) == []
    assert planner.last_hold == "overloaded"


def test_both_missed_with_a_prefill_backlog_adds_a_prefill_worker() -> None:
    planner = Planner(CONFIG)
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
