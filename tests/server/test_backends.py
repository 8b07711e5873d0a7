"""The simulated backend: durations, failures, streams, cold start and ramp."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.vtime import VirtualTimeLoop
from yieldgate.server.backends import (
    BackendError,
    SimulatedBackend,
    SimulatedConfig,
    StopText,
    Work,
    parse_mix,
    stop_sequences,
)
from yieldgate.server.governor import Governor, GovernorConfig, Slot, Yield

pytestmark = pytest.mark.anyio


def test_parse_mix() -> None:
    assert parse_mix("300:0.8, 3000:0.2") == ((300.0, 0.8), (3000.0, 0.2))
    assert parse_mix("50") == ((50.0, 1.0),)
    with pytest.raises(ValueError, match="MS:WEIGHT"):
        parse_mix("fast:1")
    with pytest.raises(ValueError, match="empty"):
        parse_mix(" , ")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"exec_ms": -1}, "exec_ms"),
        ({"exec_ms": float("nan")}, "exec_ms"),
        ({"mix": ((10.0, 0.0),)}, "mix"),
        ({"fail_rate": 1.5}, "fail_rate"),
        ({"cold_start_s": -1}, "cold_start_s"),
        ({"ramp_s": float("inf")}, "ramp_s"),
        ({"stream_chunks": 0}, "stream_chunks"),
    ],
)
def test_config_validation(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimulatedConfig(**kw)


def test_mix_draws_are_seeded_and_weighted() -> None:
    def draws(seed: int) -> list[float]:
        backend = SimulatedBackend(SimulatedConfig(mix=((300, 0.8), (3000, 0.2)), seed=seed))
        return [backend._duration_ms(Work(id="x", body="")) for _ in range(2000)]

    first = draws(7)
    assert first == draws(7)
    assert first != draws(8)
    assert set(first) == {300.0, 3000.0}
    assert 0.75 < first.count(300.0) / len(first) < 0.85


async def test_execute_echoes_the_body_after_its_duration() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=30))
    start = anyio.current_time()
    echo = {"text": "hi", "prompt_tokens": 2, "completion_tokens": 2}
    assert await backend.execute(Work(id="a", body="hi"), None) == echo
    assert anyio.current_time() - start >= 0.029


async def test_params_override_duration_and_force_failure() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=60_000))
    work = Work(id="a", body="x", params={"exec_ms": 1})
    assert backend.estimate_ms(work) == 1.0
    assert backend.estimate_ms(Work(id="n", body="x")) is None
    assert (await backend.execute(work, None))["text"] == "x"
    with pytest.raises(BackendError) as info:
        await backend.execute(Work(id="b", body="x", params={"exec_ms": 1, "fail": True}), None)
    assert info.value.retryable is True
    with pytest.raises(BackendError, match=r"params\.exec_ms") as bad:
        await backend.execute(Work(id="c", body="x", params={"exec_ms": -5}), None)
    assert bad.value.retryable is False


async def test_fail_rate() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=0, fail_rate=0.5, seed=3))
    failures = 0
    for i in range(200):
        try:
            await backend.execute(Work(id=str(i), body=""), None)
        except BackendError:
            failures += 1
    assert 70 < failures < 130


async def test_stream_pieces_concatenate_to_the_result() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=5))
    pieces: list[Any] = []

    async def emit(data: Any) -> None:
        pieces.append(data)

    body = "the quick brown fox"
    work = Work(id="s", body=body, stream=True, params={"chunks": 6})
    result = await backend.execute(work, emit)
    assert len(pieces) == 6
    assert "".join(p["text"] for p in pieces) == result["text"] == body
    with pytest.raises(BackendError, match="chunks"):
        await backend.execute(Work(id="t", body="", params={"chunks": 0}), emit)


def test_stop_text_holds_back_what_could_start_a_stop_sequence() -> None:
    stop = StopText(["END", "xy"])
    # "EN" is held until "x" shows it is no "END"; then "x" is held, and "xy" cuts before it.
    assert [stop.feed(p) for p in ("ab", "cE", "N", "x")] == ["ab", "c", "", "EN"]
    assert not stop.stopped
    assert stop.feed("yz") == ""
    assert (stop.stopped, stop.matched) == (True, "xy")
    assert (stop.feed("more"), stop.flush()) == ("", "")
    open_tail = StopText(["END"])
    assert (open_tail.feed("aE"), open_tail.flush()) == ("a", "E")
    earliest = StopText(["bc", "a"])
    assert (earliest.feed("xabc"), earliest.matched) == ("x", "a")
    tie = StopText(["ab", "abc"])  # both start there: the first given is the one found
    assert (tie.feed("xabc"), tie.matched) == ("x", "ab")
    assert StopText(["z"]).matched is None


def test_stop_sequences_are_checked() -> None:
    assert stop_sequences({}) == ()
    assert stop_sequences({"stop": "s"}) == ("s",)
    for bad in ([""], ["a"] * 5, 3, [1]):
        with pytest.raises(BackendError, match="stop"):
            stop_sequences({"stop": bad})


async def test_the_echo_ends_before_a_stop_sequence() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=0))
    work = Work(id="a", body="one. two. three", params={"stop": [". t"]})
    assert await backend.execute(work, None) == {
        "text": "one",
        "prompt_tokens": 15,
        "completion_tokens": 3,
        "finish_reason": "stop_sequence",
        "stop_sequence": ". t",
    }
    pieces: list[Any] = []

    async def emit(data: Any) -> None:
        pieces.append(data["text"])

    streamed = Work(id="b", body="one. two", params={"stop": "two", "chunks": 2}, stream=True)
    result = await backend.execute(streamed, emit)
    assert "".join(pieces) == result["text"] == "one. "


async def test_the_echo_honours_max_tokens_in_bytes_at_a_character_boundary() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=0))

    async def echo(body: str, **params: Any) -> Any:
        return await backend.execute(Work(id="a", body=body, params=params), None)

    # "é" is two bytes: 3 bytes of "aéb" hold "aé", 2 only "a".
    assert await echo("aéb", max_tokens=3) == {
        "text": "aé",
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "finish_reason": "length",
    }
    assert (await echo("aéb", max_tokens=2))["text"] == "a"
    assert (await echo("🙂", max_tokens=3))["text"] == ""
    assert "finish_reason" not in await echo("aéb", max_tokens=4)  # nothing cut: its own end
    # A stop sequence inside what max_tokens keeps ends it first.
    assert (await echo("ab. cd", max_tokens=5, stop=". "))["finish_reason"] == "stop_sequence"
    assert (await echo("ab. cd", max_tokens=3, stop=". "))["finish_reason"] == "length"
    pieces: list[Any] = []

    async def emit(data: Any) -> None:
        pieces.append(data)

    streamed = Work(id="s", body="abcdef", params={"max_tokens": 4, "chunks": 2}, stream=True)
    result = await backend.execute(streamed, emit)
    assert pieces == [{"text": "ab"}, {"text": "cd", "last": True}]
    assert (result["text"], result["finish_reason"]) == ("abcd", "length")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4", True])
def test_a_bad_max_tokens_is_refused_before_admission(bad: Any) -> None:
    backend = SimulatedBackend()
    with pytest.raises(BackendError, match="max_tokens") as caught:
        backend.estimate_ms(Work(id="a", body="x", params={"max_tokens": bad}))
    assert caught.value.retryable is False


async def test_a_short_stream_sends_no_empty_piece() -> None:
    backend = SimulatedBackend(SimulatedConfig(exec_ms=0))
    pieces: list[Any] = []

    async def emit(data: Any) -> None:
        pieces.append(data)

    await backend.execute(Work(id="s", body="ab", params={"chunks": 5}, stream=True), emit)
    # The last of the 5 pieces is empty: none is marked last.
    assert pieces == [{"text": "a"}, {"text": "b"}]


# Virtual time: the sleeps below are exact, however loaded the machine is.
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"loop_factory": VirtualTimeLoop})])
async def test_cold_start_then_capacity_ramp() -> None:
    gov = Governor(GovernorConfig(max_inflight=3), clock=anyio.current_time)
    backend = SimulatedBackend(SimulatedConfig(cold_start_s=0.2, ramp_s=0.2))
    async with anyio.create_task_group() as tg:
        tg.start_soon(backend.start, gov)
        await anyio.sleep(0.05)
        cold = gov.try_acquire()
        assert isinstance(cold, Yield)
        assert cold.reason == "cold_start"
        assert cold.retry_hint_ms == 150
        await anyio.sleep(0.2)  # warm at 0.2 s; the ramp's first step is at 0.3 s
        assert not gov.is_cold
        assert gov.capacity == 1
        await anyio.sleep(0.1)
        assert gov.capacity == 2
    assert gov.capacity == 3
    assert isinstance(gov.try_acquire(), Slot)


@pytest.mark.parametrize(
    "params",
    [{"exec_ms": -1}, {"exec_ms": 10**400}, {"exec_ms": "5"}, {"exec_ms": True}],
)
def test_bad_exec_ms_is_refused_by_the_estimate(params: dict[str, Any]) -> None:
    backend = SimulatedBackend()
    with pytest.raises(BackendError, match=r"params\.exec_ms") as info:
        backend.estimate_ms(Work(id="a", body="", params=params))
    assert info.value.retryable is False


def test_bad_chunks_are_refused_by_the_estimate_for_streams_only() -> None:
    backend = SimulatedBackend()
    bad = {"chunks": 0}
    assert backend.estimate_ms(Work(id="a", body="", params=bad)) is None
    with pytest.raises(BackendError, match="chunks"):
        backend.estimate_ms(Work(id="a", body="", params=bad, stream=True))
