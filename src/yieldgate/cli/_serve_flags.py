"""The flags of ``yieldgate serve``, as ``--help`` shows them.

``add_arguments`` declares every flag, by group (network, provider quota,
governor, simulated backend, harness backend), with the checkers of their
values (``_positive_int``, ``_queue_bound``). Apart from ``_serve``, which
turns the parsed flags into a ``Server`` and runs it: the command's interface
here, what it does there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from yieldgate.cli._common import add_log_level
from yieldgate.protocol import DEFAULT_MAX_FRAME_BYTES

__all__ = ["FLAGS", "add_arguments"]

# The configs' names for what the flags set, as their errors spell them: each becomes
# its flag in the one line the command prints (``max_inflight`` -> ``--max-inflight``).
FLAGS = {
    "port": "--port",
    "http port": "--http-port",
    "max_frame_bytes": "--max-frame-bytes",
    "idle_timeout_s": "--idle-timeout-s",
    "max_connections": "--max-connections",
    "http max_connections": "--http-max-connections",
    "write_timeout_s": "--write-timeout-s",
    "max_body_bytes": "--max-body-bytes",
    "model_name": "--model-name",
    "head_timeout_s": "--http-head-timeout-s",
    "body_timeout_s": "--http-body-timeout-s",
    "http parser": "--http-parser",
    "grace_s": "--grace-s",
    "quota rpm": "--quota-rpm",
    "quota tpm": "--quota-tpm",
    "quota itpm": "--quota-itpm",
    "quota otpm": "--quota-otpm",
    "quota window_s": "--quota-window-s",
    "quota default_max_tokens": "--default-max-tokens",
    "quota headers": "--quota-headers",
    "quota model": "--quota-model",
    "a quota's model": "--quota-model's model",
    "max_inflight": "--max-inflight",
    "max_queued": "--queue",
    "reserved slot counts": "--reserve-high and --reserve-normal",
    "reserved slots": "--reserve-high and --reserve-normal",
    "initial_exec_ms": "--initial-exec-ms",
    "exec_ms": "--exec-ms",
    "bad mix entry": "--exec-mix: bad entry",
    "empty execution-time mix": "--exec-mix: empty mix",
    "fail_rate": "--fail-rate",
    "cold_start_s": "--cold-start-s",
    "ramp_s": "--ramp-s",
    "device": "--device",
    "num_blocks": "--kv-blocks",
    "block_size": "--block-size",
    "host_kv_blocks": "--host-kv-blocks",
    "host_prefix_blocks": "--host-prefix-blocks",
    "kv_dtype": "--kv-dtype",
    "resident_kv": "--resident-kv",
    "dtype": "--dtype",
    "max_num_seqs": "--max-inflight",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "priority_age_bound": "--priority-age-bound",
    "prefill_chunk": "--prefill-chunk",
    "default_max_tokens": "--default-max-tokens",
    "torch_threads": "--torch-threads",
    "prefill_workers": "--prefill-workers",
    "k": "--speculative-k",
    "draft_layers": "--draft-layers",
    "ttft_ms_low": "--slo-ttft-ms LOW",
    "ttft_ms_normal": "--slo-ttft-ms NORMAL",
    "ttft_ms_high": "--slo-ttft-ms HIGH",
    "tpot_ms": "--slo-tpot-ms",
    "degrade": "--degrade",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Declare every flag of ``yieldgate serve`` on ``p``."""
    net = p.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    net.add_argument("--port", type=int, default=7070, help="TCP port; 0 picks a free one")
    net.add_argument(
        "--max-frame-bytes",
        type=int,
        default=DEFAULT_MAX_FRAME_BYTES,
        help="longest accepted frame; longer ones get frame_too_large and the connection closes",
    )
    net.add_argument(
        "--idle-timeout-s",
        type=float,
        default=300.0,
        help="close a TCP connection that has nothing in flight and completes no frame this long",
    )
    net.add_argument(
        "--max-connections",
        type=int,
        default=10_000,
        help="TCP connections beyond this many are closed at once (default 10000)",
    )
    net.add_argument(
        "--write-timeout-s",
        type=float,
        default=30.0,
        help=(
            "close a connection (TCP or HTTP) whose peer takes no reply bytes this long, "
            "cancelling its work"
        ),
    )
    net.add_argument(
        "--secret-file",
        type=Path,
        help=(
            "file holding a shared secret; every TCP request must then carry it as 'auth', "
            "every HTTP request but GET /health as 'Authorization: Bearer SECRET' (or "
            "'x-api-key: SECRET', as the anthropic client sends it)"
        ),
    )
    net.add_argument(
        "--http-port",
        type=int,
        help=(
            "also serve HTTP (OpenAI, Anthropic, HuggingFace, TGI routes) on this port; "
            "0 picks a free one"
        ),
    )
    net.add_argument("--http-host", help="address the HTTP front binds (default: --host)")
    net.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_FRAME_BYTES,
        help="largest accepted HTTP request body; larger ones get 413",
    )
    net.add_argument(
        "--http-head-timeout-s",
        type=float,
        default=10.0,
        help=(
            "close an HTTP connection whose request line and headers do not arrive whole "
            "this long after it opens or after its previous response"
        ),
    )
    net.add_argument(
        "--http-body-timeout-s",
        type=float,
        default=30.0,
        help="answer 408 (and close) when a request body does not arrive whole this long",
    )
    net.add_argument(
        "--http-max-connections",
        type=int,
        default=10_000,
        help="HTTP connections beyond this many are closed at once (default 10000)",
    )
    net.add_argument(
        "--http-parser",
        choices=("auto", "httptools", "h11"),
        default="auto",
        help=(
            "the HTTP request parser: httptools (C, fast) or h11 (pure Python); "
            "auto (the default) is httptools when it is installed"
        ),
    )
    net.add_argument(
        "--model-name",
        default="yieldgate-sim",
        help="the model GET /v1/models lists (default: yieldgate-sim)",
    )
    net.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        help="on SIGINT/SIGTERM, how long admitted work may run before it is cancelled",
    )

    quota = p.add_argument_group(
        "provider quota (HTTP inference routes; a request costs ceil(prompt chars / 4) + "
        "max_tokens tokens, --default-max-tokens when it names none; the Messages route "
        "has buckets of its own, as Anthropic's)"
    )
    quota.add_argument(
        "--quota-rpm",
        type=_positive_int,
        metavar="N",
        help="answer as OpenAI does past N requests per window: x-ratelimit-* headers, 429s",
    )
    quota.add_argument(
        "--quota-tpm",
        type=_positive_int,
        metavar="N",
        help="answer as OpenAI does past N tokens per window: x-ratelimit-* headers, 429s",
    )
    quota.add_argument(
        "--quota-itpm",
        type=_positive_int,
        metavar="N",
        help="answer as Anthropic does past N input tokens per window on POST /v1/messages: "
        "anthropic-ratelimit-* headers, 429 rate_limit_error",
    )
    quota.add_argument(
        "--quota-otpm",
        type=_positive_int,
        metavar="N",
        help="the same past N output tokens per window on POST /v1/messages: max_tokens "
        "charged at the door, what the answer did not use given back",
    )
    quota.add_argument(
        "--quota-window-s",
        type=float,
        metavar="S",
        help="the quota's window in seconds (default 60: per minute; shorter to rehearse)",
    )
    quota.add_argument(
        "--quota-per-model",
        action="store_true",
        help="give each model its own buckets of --quota-rpm and --quota-tpm, as OpenAI does",
    )
    quota.add_argument(
        "--quota-model",
        action="append",
        default=[],
        metavar="MODEL=RPM:TPM",
        help="limits of MODEL's own (either side may be empty: not limited); implies "
        "--quota-per-model; repeatable",
    )
    quota.add_argument(
        "--quota-headers",
        choices=("openai", "azure"),
        default="openai",
        help="the rate-limit headers sent: OpenAI's (limit, remaining, reset) or Azure's "
        "(remaining alone; retry-after-ms on a 429)",
    )

    gov = p.add_argument_group("governor")
    gov.add_argument("--max-inflight", type=int, default=4, help="hard cap on executing submits")
    gov.add_argument(
        "--reserve-high",
        type=int,
        default=0,
        help="slots only high-priority submits may use",
    )
    gov.add_argument(
        "--reserve-normal",
        type=int,
        default=0,
        help="further slots that low-priority submits may not use",
    )
    gov.add_argument(
        "--queue",
        type=_queue_bound,
        default=0,
        metavar="N|unbounded",
        help=(
            "buffer as vLLM and TGI do: up to N requests past --max-inflight wait for a slot "
            "(FIFO within each priority, under their deadline) before any is refused; "
            "'unbounded' for no limit; 0 (the default) yields at once"
        ),
    )
    gov.add_argument(
        "--initial-exec-ms",
        type=float,
        help="execution-time estimate for hints until one is measured (default: the backend's)",
    )

    p.add_argument(
        "--backend",
        choices=["sleep", "harness"],
        default="sleep",
        help=(
            "what executes work: 'sleep' simulates a model; 'harness' serves the tiny torch "
            "transformer with continuous batching (needs the 'harness' extra)"
        ),
    )
    sim = p.add_argument_group("simulated backend (--backend sleep)")
    sim.add_argument("--exec-ms", type=float, default=500.0, help="execution time of each submit")
    sim.add_argument(
        "--exec-mix",
        metavar="MS:WEIGHT,...",
        help="draw execution times from a weighted mix, e.g. 300:0.8,3000:0.2",
    )
    sim.add_argument("--fail-rate", type=float, default=0.0, help="share of executions that fail")
    sim.add_argument(
        "--cold-start-s", type=float, default=0.0, help="yield cold_start for this long at start"
    )
    sim.add_argument(
        "--ramp-s",
        type=float,
        default=0.0,
        help="after the cold start, ramp capacity from 1 to --max-inflight over this long",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed for every random draw")

    har = p.add_argument_group(
        "harness backend (--backend harness; --max-inflight is also the engine's max_num_seqs)"
    )
    har.add_argument(
        "--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N"
    )
    har.add_argument(
        "--kv-blocks", type=int, default=1024, help="KV cache capacity, in blocks (default 1024)"
    )
    har.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    har.add_argument(
        "--host-kv-blocks",
        type=int,
        default=0,
        help=(
            "KV blocks in host memory that running sequences are paged out to when the "
            "device pool is full (default 0: preempt and recompute instead)"
        ),
    )
    har.add_argument(
        "--host-prefix-blocks",
        type=int,
        default=0,
        help=(
            "KV blocks in host memory that cached prefix blocks evicted from the device pool "
            "are kept in (LRU) and paged back from on a prefix hit (default 0: dropped)"
        ),
    )
    har.add_argument(
        "--dtype",
        default="float32",
        help=(
            "the model's weights, activations and attention: float32, bfloat16 or float16 "
            "(default float32)"
        ),
    )
    har.add_argument(
        "--kv-dtype",
        choices=("auto", "float32", "bfloat16", "float16", "int8"),
        default="auto",
        help=(
            "KV cache storage: auto (--dtype), int8 with a float32 scale per block and head, "
            "or bfloat16 or float16 for a float32 model (default auto)"
        ),
    )
    har.add_argument(
        "--resident-kv",
        choices=("auto", "on", "off"),
        default="auto",
        help=(
            "decode attends over each running context kept in place between steps (on) or "
            "gathered from the paged cache every step (off); costs a second copy of the running "
            "KV. auto: on for a float KV cache on a CPU (default auto)"
        ),
    )
    har.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="prompt tokens one prefill step may compute; longer prompts are refused",
    )
    har.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        metavar="TOKENS",
        help=(
            "compute a prompt on the engine at most TOKENS a step, a decode step between two "
            "pieces, so a long prompt holds the decoding requests up one piece at a time "
            "(default 0: each prompt in one step)"
        ),
    )
    har.add_argument(
        "--no-engine-priority",
        dest="engine_priority",
        action="store_false",
        help=(
            "serve the engine's waiting and prefill queues first come, first served "
            "(default: high before normal before low, and low preempted first)"
        ),
    )
    har.add_argument(
        "--priority-age-bound",
        type=int,
        default=1000,
        metavar="STEPS",
        help="engine steps after which a waiting request is served as if high (default 1000)",
    )
    har.add_argument(
        "--default-max-tokens",
        type=int,
        default=16,
        help=(
            "tokens generated when a request does not say (default 16); also what such a "
            "request's output costs against --quota-tpm"
        ),
    )
    har.add_argument("--checkpoint", type=Path, help="load the model from this checkpoint file")
    har.add_argument(
        "--model-seed", type=int, default=0, help="seed of the model's weights (no checkpoint)"
    )
    har.add_argument(
        "--torch-threads", type=int, default=1, help="torch threads of the engine (default 1)"
    )
    har.add_argument(
        "--prefill-workers",
        type=int,
        default=0,
        help="prefill worker processes (0: prefill colocated with decode)",
    )
    har.add_argument(
        "--speculative-k",
        type=int,
        default=0,
        help="draft this many tokens per decode step for greedy requests (default 0: off)",
    )
    har.add_argument(
        "--draft-layers",
        type=int,
        default=1,
        help="layers of the speculative draft (the target's first ones; default 1)",
    )
    har.add_argument(
        "--qos",
        action="store_true",
        help="reject early (yield 'slo') requests whose estimated TTFT would miss its objective",
    )
    har.add_argument(
        "--slo-ttft-ms",
        metavar="LOW,NORMAL,HIGH",
        default="500,2000,none",
        help="TTFT objectives by priority, in ms; 'none' for no objective (default 500,2000,none)",
    )
    har.add_argument(
        "--slo-tpot-ms", type=float, default=100.0, help="TPOT objective for goodput (default 100)"
    )
    har.add_argument(
        "--router-config",
        type=Path,
        help="JSON file of routing thresholds, reread when it changes (default: built in)",
    )
    har.add_argument(
        "--degrade",
        action="store_true",
        help=(
            "graceful degradation: low priority prefilled locally while the prefill workers "
            "serve high priority, its output cut under sustained overload, then rejected; "
            "with --qos, a low request that would still miss its TTFT objective on the route "
            "it takes is rejected at once as well"
        ),
    )
    har.add_argument(
        "--planner",
        action="store_true",
        help=(
            "move capacity between prefill workers (0 to max(2, --prefill-workers)) and the "
            "decode batch as TTFT and TPOT miss their objectives"
        ),
    )

    add_log_level(p)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _queue_bound(text: str) -> int | None:
    """``--queue``: a count >= 0, or ``unbounded`` (``None``)."""
    if text.strip().lower() == "unbounded":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of requests >= 0 or 'unbounded', got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"must be a number of requests >= 0 or 'unbounded', got {value}"
        )
    return value
