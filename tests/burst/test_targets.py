"""Targets and workloads: URLs, prompts."""

from __future__ import annotations

import pytest

from yieldgate.burst import Target, Workload


@pytest.mark.parametrize(
    ("url", "kind", "port", "path", "dialect"),
    [
        ("tcp://127.0.0.1:7070", "tcp", 7070, "", "governed"),
        ("openai+http://localhost:8000", "openai", 8000, "", "openai"),
        ("hf+http://127.0.0.1:8000/models/tiny", "hf", 8000, "/models/tiny", "huggingface"),
        ("tgi+http://127.0.0.1:8080/", "tgi", 8080, "", "tgi"),
        ("raw+http://127.0.0.1:8000", "raw", 8000, "", "openai"),
        ("tcp://", "tcp", None, "", "governed"),
    ],
)
def test_parse(url: str, kind: str, port: int | None, path: str, dialect: str) -> None:
    target = Target.parse(url)
    assert (target.kind, target.port, target.path, target.default_dialect) == (
        kind,
        port,
        path,
        dialect,
    )


def test_a_bare_scheme_gets_its_address_later() -> None:
    target = Target.parse("openai+http://")
    with pytest.raises(ValueError, match="no port"):
        target.require_address()
    live = target.at("127.0.0.1", 9000)
    assert live.url == "openai+http://127.0.0.1:9000"
    assert live.http_base == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("url", "message"),
    [("http://127.0.0.1:80", "scheme must be"), ("tcp://h:1/x", "no path"), ("tcp://h:x", "port")],
)
def test_bad_targets(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Target.parse(url)


def test_prompts_follow_the_mix() -> None:
    workload = Workload(prompt_tokens=((32, 3.0), (320, 1.0)))
    lengths = [len(workload.prompt(i, i / 100)) for i in range(100)]
    assert lengths.count(32) == 75
    assert lengths.count(320) == 25
    # Distinct heads: the prefix cache cannot serve one prompt from another.
    assert workload.prompt(1, 0.0) != workload.prompt(2, 0.0)
    assert Workload().prompt(7, 0.5) == "request 7"


def test_workload_validation() -> None:
    with pytest.raises(ValueError, match="prompt_tokens"):
        Workload(prompt_tokens=((0, 1.0),))
    with pytest.raises(ValueError, match="max_tokens"):
        Workload(max_tokens=0)
