"""Scraping a Prometheus endpoint: the text format, vLLM's / TGI's / yieldgate's names, memory."""

from __future__ import annotations

import os

import httpx
import pytest

from yieldgate.burst._scrape import common_series, parse_exposition, process_rss_bytes

# The shapes of vLLM's exposition (v1 engine, labelled by model and engine), written
# for this test: its gauges are fractions despite the "_perc" name.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 7.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B"} 0.5
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 9.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 9.0
"""
VLLM_OLD = """\
vllm:num_requests_running{model_name="m"} 3
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"""
# TGI's router: unlabelled gauges, histograms with a method label; no KV-cache gauge.
TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 3
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096
# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{method="decode",le="0.01"} 10
tgi_batch_inference_duration_sum{method="decode"} 0.7
tgi_request_count 120 1700000000000
"""


def test_vllm_names_sum_over_engines_and_average_the_cache() -> None:
    series = common_series(parse_exposition(VLLM))
    assert (series.queue, series.running) == (8.0, 16.0)
    assert series.kv_cache == pytest.approx(0.7)
    assert series.sources == (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    )
    old = common_series(parse_exposition(VLLM_OLD))
    assert (old.queue, old.running, old.kv_cache) == (0.0, 3.0, 0.25)


def test_tgi_names() -> None:
    samples = parse_exposition(TGI)
    assert samples["tgi_request_count"] == [({}, 120.0)]  # a timestamp is ignored
    assert samples["tgi_batch_inference_duration_bucket"] == [
        ({"method": "decode", "le": "0.01"}, 10.0)
    ]
    series = common_series(samples)
    assert (series.queue, series.running, series.kv_cache) == (5.0, 3.0, None)
    assert series.as_dict() == {"queue": 5.0, "running": 3.0, "kv_cache": None}


def test_the_text_format_edges() -> None:
    samples = parse_exposition(
        'a{path="x\\"y\\\\z",b="1,2"} +Inf\nb_total NaN\n\n# EOF\nc{} -1.5e3\nd{x="1",} 2\n'
    )
    assert samples["a"] == [({"path": 'x"y\\z', "b": "1,2"}, float("inf"))]
    assert samples["c"] == [({}, -1500.0)]
    assert samples["d"] == [({"x": "1"}, 2.0)]
    assert common_series(samples).queue is None
    for bad in ("just words here", "m{x=1} 2", "m 1 2 3", "m notanumber"):
        with pytest.raises(ValueError, match=r"line|Prometheus"):
            parse_exposition(bad)


def test_the_reference_servers_metrics_endpoint() -> None:
    from yieldgate.server import spawn

    with spawn("--max-inflight", "3", "--queue", "4", http=True) as server:
        assert server.http_address is not None
        host, port = server.http_address
        text = httpx.get(f"http://{host}:{port}/metrics", timeout=10).text
        series = common_series(parse_exposition(text))
        assert (series.queue, series.running) == (0.0, 0.0)
        assert series.kv_cache is None
        assert parse_exposition(text)["yieldgate_max_inflight"] == [({}, 3.0)]
        rss = process_rss_bytes(server.pid)
    if os.path.exists("/proc/self/status"):
        assert rss is not None
        assert rss > 10 * 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_rss_of_a_process_tree() -> None:
    own = process_rss_bytes(os.getpid(), tree=False)
    assert own is not None
    assert own > 2**20
    tree = process_rss_bytes(os.getpid())
    assert tree is not None
    assert tree >= own
    assert process_rss_bytes(2**22 + 12345) is None  # no such process
