from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.router import (
    REASONS,
    PrefixTracker,
    Route,
    Router,
    RouterConfig,
    RouterConfigFile,
    WorkerLoad,
    should_offload_prefill,
)
from yieldgate.harness.sequence import SamplingParams, Sequence

CONFIG = RouterConfig(
    prefill_length_threshold=100,
    busy_length_threshold=40,
    decode_busy_running=4,
    max_prefill_queue=3,
)


def idle(index: int, **changes: Any) -> WorkerLoad:
    values: dict[str, Any] = {
        "index": index,
        "alive": True,
        "queued": 0,
        "queued_tokens": 0,
        "cached_tokens": 0,
    }
    values.update(changes)
    return WorkerLoad(**values)


def route(router: Router, prompt: int, workers: list[WorkerLoad], **kw: int) -> Route:
    return router.route(
        prompt_tokens=prompt,
        prefix_hit_tokens=kw.get("hit", 0),
        decode_running=kw.get("running", 0),
        workers=workers,
    )


# -- RouterConfig ------------------------------------------------------------


def test_config_defaults_are_valid() -> None:
    config = RouterConfig()
    assert config.prefill_length_threshold == 128
    assert config.busy_length_threshold == 48
    assert config.max_prefill_queue == 4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prefill_length_threshold": 0}, "prefill_length_threshold"),
        ({"busy_length_threshold": 0}, "busy_length_threshold"),
        ({"decode_busy_running": -1}, "decode_busy_running"),
        ({"max_prefill_queue": 0}, "max_prefill_queue"),
        ({"max_prefill_queue": 2.0}, "max_prefill_queue"),
        ({"max_prefill_queue": True}, "max_prefill_queue"),
        ({"busy_length_threshold": 200}, "must not exceed"),
        ({"queue_weight": -1.0}, "queue_weight"),
        ({"cache_weight": float("nan")}, "cache_weight"),
        ({"queued_tokens_weight": float("inf")}, "queued_tokens_weight"),
    ],
)
def test_config_rejects_bad_values(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterConfig(**changes)


def test_from_mapping_fills_defaults_and_accepts_integer_weights() -> None:
    config = RouterConfig.from_mapping({"prefill_length_threshold": 256, "cache_weight": 2})
    assert config.prefill_length_threshold == 256
    assert config.cache_weight == 2.0
    assert isinstance(config.cache_weight, float)
    assert config.busy_length_threshold == 48


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"prefill_threshold": 10}, "unknown router config key.*prefill_threshold"),
        ({"max_prefill_queue": "4"}, "max_prefill_queue must be an integer"),
        ({"max_prefill_queue": 4.0}, "max_prefill_queue must be an integer"),
        ({"queue_weight": "1"}, "queue_weight must be a number"),
        ({"queue_weight": True}, "queue_weight must be a number"),
        ({"queue_weight": None}, "queue_weight must be a number"),
    ],
)
def test_from_mapping_rejects_unknown_keys_and_wrong_types(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RouterConfig.from_mapping(data)


def test_from_mapping_rejects_a_non_object() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        RouterConfig.from_mapping([1, 2])  # type: ignore[arg-type]


# -- should_offload_prefill ---------------------------------------------------


def test_short_prompt_stays_local() -> None:
    assert should_offload_prefill(99, 0, 0, 0, CONFIG) == (False, "short")


def test_long_prompt_is_offloaded_at_the_threshold() -> None:
    assert should_offload_prefill(100, 0, 0, 0, CONFIG) == (True, "long")
    assert should_offload_prefill(5000, 0, 2, 0, CONFIG) == (True, "long")


def test_prefix_hit_makes_a_long_prompt_local() -> None:
    assert should_offload_prefill(300, 250, 0, 0, CONFIG) == (False, "prefix_hit")
    # What is left after the hit still counts.
    assert should_offload_prefill(300, 200, 0, 0, CONFIG) == (True, "long")
    # A hit larger than the prompt is an empty prefill, not a negative one.
    assert should_offload_prefill(100, 150, 0, 0, CONFIG) == (False, "prefix_hit")


def test_full_prefill_queue_keeps_it_local() -> None:
    assert should_offload_prefill(500, 0, 3, 0, CONFIG) == (False, "queue_full")
    assert should_offload_prefill(500, 0, 2, 0, CONFIG) == (True, "long")


def test_busy_decode_offloads_moderately_long_prompts() -> None:
    assert should_offload_prefill(60, 0, 0, 3, CONFIG) == (False, "short")
    assert should_offload_prefill(60, 0, 0, 4, CONFIG) == (True, "busy_decode")
    assert should_offload_prefill(39, 0, 0, 10, CONFIG) == (False, "short")
    assert should_offload_prefill(60, 30, 0, 4, CONFIG) == (False, "prefix_hit")
    assert should_offload_prefill(60, 0, 3, 4, CONFIG) == (False, "queue_full")
    # Long enough on its own: the reason is the length, busy or not.
    assert should_offload_prefill(150, 0, 0, 4, CONFIG) == (True, "long")


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        should_offload_prefill(-1, 0, 0, 0, CONFIG)


# -- Router --------------------------------------------------------------------


def test_router_keeps_short_prompts_local() -> None:
    router = Router(CONFIG)
    assert route(router, 10, [idle(0)]) == Route(
        remote=False, worker=None, reason="short", effective_tokens=10
    )


def test_router_offloads_long_prompts_with_effective_tokens() -> None:
    router = Router(CONFIG)
    assert route(router, 400, [idle(0)], hit=64) == Route(
        remote=True, worker=0, reason="long", effective_tokens=336
    )


def test_keep_local_overrides_the_offload_rule_only() -> None:
    """Degradation: a prompt the rule would offload stays local; a short one is just short."""
    router = Router(CONFIG)
    kept = router.route(
        prompt_tokens=400, prefix_hit_tokens=0, decode_running=0, workers=[idle(0)], keep_local=True
    )
    assert kept == Route(remote=False, worker=None, reason="yield_to_high", effective_tokens=400)
    short = router.route(
        prompt_tokens=10, prefix_hit_tokens=0, decode_running=0, workers=[idle(0)], keep_local=True
    )
    assert short.reason == "short"
    stats = router.stats()
    assert stats["decisions"]["yield_to_high"] == 1
    assert stats["remote"] == 0


def test_router_skips_dead_workers() -> None:
    router = Router(CONFIG)
    workers = [idle(0, alive=False), idle(1, queued=2), idle(2, alive=False)]
    assert route(router, 400, workers).worker == 1


def test_router_stays_local_when_no_worker_is_alive() -> None:
    router = Router(CONFIG)
    decision = route(router, 400, [idle(0, alive=False), idle(1, alive=False)])
    assert (decision.remote, decision.worker, decision.reason) == (False, None, "no_worker")
    assert route(router, 400, []).reason == "no_worker"


def test_router_stays_local_when_every_live_queue_is_full() -> None:
    router = Router(CONFIG)
    workers = [idle(0, queued=3), idle(1, queued=7), idle(2, alive=False)]
    decision = route(router, 400, workers)
    assert (decision.remote, decision.reason) == (False, "queue_full")
    # One worker below the limit is enough, however loaded.
    workers.append(idle(3, queued=2, queued_tokens=90_000))
    assert route(router, 400, workers).worker == 3


def test_router_picks_the_shortest_queue() -> None:
    router = Router(CONFIG)
    workers = [idle(0, queued=2), idle(1, queued=1), idle(2, queued=2)]
    assert route(router, 400, workers).worker == 1


def test_router_weighs_queued_tokens() -> None:
    router = Router(CONFIG)
    # Same queue length; worker 1 has far fewer tokens ahead.
    workers = [idle(0, queued=1, queued_tokens=3000), idle(1, queued=1, queued_tokens=200)]
    assert route(router, 400, workers).worker == 1


def test_router_prefers_the_best_cache_match() -> None:
    router = Router(CONFIG)
    workers = [idle(0), idle(1, cached_tokens=256), idle(2, cached_tokens=128)]
    assert route(router, 400, workers).worker == 1


def test_cache_match_trades_against_queue_by_weight() -> None:
    workers = [idle(0), idle(1, queued=1, cached_tokens=2000)]
    # cost 0 vs 1 - 2 = -1: the cache wins.
    assert route(Router(CONFIG), 4000, workers).worker == 1
    heavy_queue = RouterConfig(prefill_length_threshold=100, queue_weight=3)
    # cost 0 vs 3 - 2 = 1: the empty queue wins.
    assert route(Router(heavy_queue), 4000, workers).worker == 0


def test_ties_go_to_the_lowest_index() -> None:
    router = Router(CONFIG)
    workers = [idle(2, queued=1), idle(1, queued=1), idle(3, queued=1)]
    assert route(router, 400, workers).worker == 1


def test_router_busy_decode_offloads() -> None:
    router = Router(CONFIG)
    decision = route(router, 60, [idle(0)], running=4)
    assert (decision.remote, decision.reason) == (True, "busy_decode")
    assert route(router, 60, [idle(0)], running=3).remote is False


def test_router_stats_count_decisions() -> None:
    router = Router(CONFIG)
    assert router.stats()["offload_ratio"] is None
    route(router, 10, [idle(0)])
    route(router, 400, [idle(0), idle(1, queued=1)])
    route(router, 400, [idle(0, queued=3)])
    route(router, 60, [idle(0, queued=2), idle(1)], running=5)
    stats = router.stats()
    assert set(stats["decisions"]) == set(REASONS)
    assert stats["decisions"]["short"] == 1
    assert stats["decisions"]["long"] == 1
    assert stats["decisions"]["queue_full"] == 1
    assert stats["decisions"]["busy_decode"] == 1
    assert stats["decisions"]["prefix_hit"] == 0
    assert (stats["remote"], stats["local"]) == (2, 2)
    assert stats["offload_ratio"] == 0.5
    assert stats["by_worker"] == {"0": 1, "1": 1}
    assert stats["config"]["prefill_length_threshold"] == 100
    assert stats["config_reloads"] == 0
    json.dumps(stats)


# -- RouterConfigFile --------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, data: object, mtime: int) -> None:
    """Write ``data`` as JSON with an explicit mtime, so that a change is always seen."""
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    os.utime(path, ns=(mtime * 10**9, mtime * 10**9))


def test_config_file_loads_and_reloads_an_edit(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    write(path, {"prefill_length_threshold": 200}, mtime=1)
    clock = FakeClock()
    source = RouterConfigFile(path, clock=clock)
    assert source.current().prefill_length_threshold == 200
    write(path, {"prefill_length_threshold": 300, "max_prefill_queue": 9}, mtime=2)
    # Not looked at again before the interval is up.
    clock.now += 0.4
    assert source.current().prefill_length_threshold == 200
    clock.now += 0.1
    config = source.current()
    assert (config.prefill_length_threshold, config.max_prefill_queue) == (300, 9)
    assert (source.reloads, source.reload_errors, source.last_error) == (1, 0, None)


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    write(path, {}, mtime=1)
    clock = FakeClock()
    source = RouterConfigFile(path, clock=clock)
    first = source.current()
    clock.now += 10
    assert source.current() is first
    assert source.reloads == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "invalid JSON"),
        ({"prefill_length_threshold": 0}, "prefill_length_threshold"),
        ({"threshold": 5}, "unknown router config key"),
        ("[]", "JSON object"),
    ],
)
def test_a_bad_edit_keeps_the_previous_config(
    tmp_path: Path, bad: object, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "router.json"
    write(path, {"prefill_length_threshold": 200}, mtime=1)
    clock = FakeClock()
    source = RouterConfigFile(path, clock=clock)
    write(path, bad, mtime=2)
    clock.now += 1
    with caplog.at_level(logging.WARNING, logger="yieldgate.harness"):
        assert source.current().prefill_length_threshold == 200
    assert source.reload_errors == 1
    assert source.last_error is not None
    assert message in source.last_error
    assert "not reloaded" in caplog.text
    # The same broken file is one error, not one per check.
    clock.now += 1
    source.current()
    assert source.reload_errors == 1
    # Fixing it loads the fix and clears the error.
    write(path, {"prefill_length_threshold": 250}, mtime=3)
    clock.now += 1
    assert source.current().prefill_length_threshold == 250
    assert (source.reloads, source.reload_errors, source.last_error) == (1, 1, None)


def test_a_vanished_file_keeps_the_previous_config(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    write(path, {"max_prefill_queue": 6}, mtime=1)
    clock = FakeClock()
    source = RouterConfigFile(path, clock=clock)
    path.unlink()
    clock.now += 1
    assert source.current().max_prefill_queue == 6
    assert source.reload_errors == 1
    assert source.last_error is not None
    assert "cannot read" in source.last_error


@pytest.mark.parametrize("content", ["{oops", '{"max_prefill_queue": "x"}', None])
def test_a_bad_first_load_raises(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "router.json"
    if content is not None:
        write(path, content, mtime=1)
    with pytest.raises(ValueError, match="router config"):
        RouterConfigFile(path, clock=FakeClock())


def test_router_follows_its_config_file(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    write(path, {"prefill_length_threshold": 500, "busy_length_threshold": 40}, mtime=1)
    clock = FakeClock()
    router = Router(RouterConfigFile(path, clock=clock))
    assert route(router, 400, [idle(0)]).remote is False
    write(path, {"prefill_length_threshold": 300, "busy_length_threshold": 40}, mtime=2)
    clock.now += 1
    assert route(router, 400, [idle(0)]).remote is True
    write(path, "{", mtime=3)
    clock.now += 1
    assert route(router, 400, [idle(0)]).remote is True
    stats = router.stats()
    assert (stats["config_reloads"], stats["config_reload_errors"]) == (1, 1)
    assert stats["config_last_error"].startswith("invalid JSON")


# -- PrefixTracker ------------------------------------------------------------


def test_tracker_matches_recorded_leading_blocks() -> None:
    tracker = PrefixTracker(block_size=4)
    assert tracker.match(list(range(20))) == 0
    tracker.record(list(range(10)))  # two full blocks; the partial third is not cached
    assert len(tracker) == 2
    assert tracker.match(list(range(20))) == 8
    assert tracker.match([*range(4), 99, 98, 97, 96, 1, 2]) == 4
    assert tracker.match([99, *range(1, 20)]) == 0


def test_tracker_never_counts_the_block_of_the_last_token() -> None:
    tracker = PrefixTracker(block_size=4)
    tracker.record(list(range(12)))
    assert tracker.match(list(range(12))) == 8
    assert tracker.match(list(range(13))) == 12


def test_tracker_agrees_with_the_block_manager() -> None:
    size = 4
    prompt = list(range(30))
    tracker = PrefixTracker(block_size=size)
    tracker.record(prompt)
    blocks = BlockManager(num_blocks=32, block_size=size)
    seq = Sequence(0, prompt, SamplingParams(max_tokens=1))
    blocks.allocate(seq)
    seq.num_computed = len(seq.tokens)
    blocks.commit(seq)
    probes = (prompt, prompt[:17], [*prompt[:9], 0, 0, 0, 0, 0, 0], [*prompt, 5, 6, 7])
    for seq_id, probe in enumerate(probes, start=1):
        again = Sequence(seq_id, probe, SamplingParams(max_tokens=1))
        blocks.allocate(again)
        assert tracker.match(probe) == again.num_cached
        blocks.free(again)


def test_tracker_evicts_least_recently_recorded_later_blocks_first() -> None:
    tracker = PrefixTracker(block_size=2, capacity_blocks=4)
    a = [1, 1, 2, 2, 3, 3]
    b = [7, 7, 8, 8]
    tracker.record(a)
    tracker.record(b)
    assert len(tracker) == 4  # a's third block went first: a's tail, the oldest use
    assert tracker.evictions == 1
    assert tracker.match([*a, 0]) == 4
    assert tracker.match([*b, 0]) == 4
    tracker.record(a)  # a is used again: b's blocks are now the oldest
    assert tracker.match([*a, 0]) == 6
    assert tracker.match([*b, 0]) == 2


def test_tracker_clear_and_validation() -> None:
    tracker = PrefixTracker(block_size=2)
    tracker.record([1, 2, 3, 4])
    tracker.clear()
    assert tracker.match([1, 2, 3, 4, 5]) == 0
    with pytest.raises(ValueError, match="block_size"):
        PrefixTracker(block_size=0)
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixTracker(block_size=2, capacity_blocks=0)
