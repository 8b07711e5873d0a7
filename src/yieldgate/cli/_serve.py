"""``yieldgate serve``: the reference governed server.

Here: turning the parsed flags into a ``Server`` (with the harness backend when
asked) and running it until a signal; the flags themselves are ``_serve_flags``.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from yieldgate._extras import require
from yieldgate.cli._common import CliError, CliFailure, check_input, flag_error, run_async
from yieldgate.cli._serve_flags import FLAGS, add_arguments


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the reference governed server",
        description=(
            "Serve the governed protocol (NDJSON over TCP) and, with --http-port, the OpenAI, "
            "Anthropic, HuggingFace and TGI HTTP APIs over the same slots. At --max-inflight "
            "executing requests, further ones are answered 'yield' (HTTP: 429; Anthropic's "
            "route: 529) with a retry hint at once; "
            "nothing is queued. Prints 'listening tcp://HOST:PORT' (then "
            "'listening http://HOST:PORT') when ready."
        ),
    )
    add_arguments(p)
    p.set_defaults(run=run)


def _quota(args: argparse.Namespace) -> Any:
    """The ``QuotaConfig`` the --quota-* flags ask for, or ``None``."""
    from yieldgate.server import QuotaConfig

    models = dict(_quota_model(text) for text in args.quota_model)
    limits = (args.quota_rpm, args.quota_tpm, args.quota_itpm, args.quota_otpm)
    if all(limit is None for limit in limits) and not models:
        for flag, given in (
            ("--quota-window-s", args.quota_window_s is not None),
            ("--quota-per-model", args.quota_per_model),
            ("--quota-headers", args.quota_headers != "openai"),
        ):
            if given:
                raise CliError(
                    f"{flag} needs --quota-rpm, --quota-tpm, --quota-itpm, --quota-otpm "
                    "or --quota-model"
                )
        return None
    if args.http_port is None:
        raise CliError("the --quota-* flags apply to the HTTP front: add --http-port")
    try:
        return QuotaConfig(
            rpm=args.quota_rpm,
            tpm=args.quota_tpm,
            itpm=args.quota_itpm,
            otpm=args.quota_otpm,
            window_s=60.0 if args.quota_window_s is None else args.quota_window_s,
            default_max_tokens=args.default_max_tokens,
            per_model=args.quota_per_model,
            models=models,
            headers=args.quota_headers,
        )
    except ValueError as exc:
        raise flag_error(exc, FLAGS) from None


def _quota_model(text: str) -> tuple[str, tuple[int | None, int | None]]:
    """``MODEL=RPM:TPM`` (either side may be empty) as ``(model, (rpm, tpm))``."""
    model, sep, limits = text.rpartition("=")
    rpm_text, colon, tpm_text = limits.partition(":")
    if not sep or not model or not colon:
        raise CliError(f"--quota-model wants MODEL=RPM:TPM, got {text!r}")
    try:
        rpm = int(rpm_text) if rpm_text else None
        tpm = int(tpm_text) if tpm_text else None
    except ValueError:
        raise CliError(f"--quota-model {text!r}: RPM and TPM must be whole numbers") from None
    return model, (rpm, tpm)


def _read_secret(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CliError(f"cannot read --secret-file {path}: {exc.strerror}") from None
    if not secret:
        raise CliError(f"--secret-file {path} is empty")
    return secret


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _http_host(args: argparse.Namespace) -> str:
    host: str = args.http_host if args.http_host is not None else args.host
    return host


def _harness_backend(args: argparse.Namespace) -> Any:
    require("torch", "--backend harness")
    from yieldgate.harness import (
        DegradeConfig,
        EngineConfig,
        HarnessBackend,
        HarnessConfig,
        ModelConfig,
        SchedulerConfig,
    )
    from yieldgate.harness.qos import SloConfig
    from yieldgate.harness.router import RouterConfig, RouterConfigFile
    from yieldgate.harness.speculative import SpeculativeConfig

    check_input("--checkpoint", args.checkpoint)
    check_input("--router-config", args.router_config)
    if args.checkpoint is not None:
        from yieldgate.harness import load_checkpoint

        try:
            load_checkpoint(args.checkpoint)  # here, not once serving: a bad file is one line
        except ValueError as exc:
            raise CliError(f"--checkpoint: {exc}") from None
    engine = EngineConfig(
        model=ModelConfig(seed=args.model_seed),
        checkpoint=args.checkpoint,
        device=args.device,
        num_blocks=args.kv_blocks,
        block_size=args.block_size,
        host_kv_blocks=args.host_kv_blocks,
        host_prefix_blocks=args.host_prefix_blocks,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        resident_kv={"auto": None, "on": True, "off": False}[args.resident_kv],
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_inflight,
            max_num_batched_tokens=args.max_num_batched_tokens,
            priority=args.engine_priority,
            priority_age_bound=args.priority_age_bound,
            prefill_chunk=args.prefill_chunk,
        ),
        speculative=(
            SpeculativeConfig(k=args.speculative_k, draft_layers=args.draft_layers)
            if args.speculative_k
            else None
        ),
    )
    low, normal, high = _parse_slo_ttft(args.slo_ttft_ms)
    slo = SloConfig(
        ttft_ms_low=low, ttft_ms_normal=normal, ttft_ms_high=high, tpot_ms=args.slo_tpot_ms
    )
    router: Any = RouterConfig()
    threshold = router.prefill_length_threshold
    if args.router_config is not None:
        # A bad file fails here, before serving.
        threshold = RouterConfigFile(args.router_config).current().prefill_length_threshold
        router = args.router_config
    return HarnessBackend(
        HarnessConfig(
            engine=engine,
            default_max_tokens=args.default_max_tokens,
            torch_threads=args.torch_threads,
            prefill_workers=args.prefill_workers,
            router=router,
            slo=slo,
            qos=args.qos,
            degrade=DegradeConfig() if args.degrade else None,
            planner=_planner_config(args, slo, threshold) if args.planner else None,
        )
    )


def _planner_config(args: argparse.Namespace, slo: Any, long_prompt_tokens: int) -> Any:
    """The planner held to the normal priority's TTFT objective and ``--slo-tpot-ms``.

    A long prompt, for it, is one the router would offload.
    """
    from yieldgate.harness import PlannerConfig

    ttft = slo.ttft_ms_normal or slo.ttft_ms_low or slo.ttft_ms_high
    return PlannerConfig(
        **({"ttft_ms": ttft} if ttft is not None else {}),
        tpot_ms=slo.tpot_ms,
        max_prefill_workers=max(2, args.prefill_workers),
        max_decode_seqs=args.max_inflight,
        long_prompt_tokens=long_prompt_tokens,
    )


def _parse_slo_ttft(text: str) -> tuple[float | None, float | None, float | None]:
    parts = [part.strip().lower() for part in text.split(",")]
    if len(parts) != 3:
        raise ValueError(f"--slo-ttft-ms needs LOW,NORMAL,HIGH, got {text!r}")
    values: list[float | None] = []
    for part in parts:
        if part == "none":
            values.append(None)
            continue
        try:
            values.append(float(part))
        except ValueError:
            raise ValueError(f"--slo-ttft-ms: {part!r} is not a number or 'none'") from None
    return values[0], values[1], values[2]


def build_server(args: argparse.Namespace) -> Any:
    """Turn parsed flags into a ``Server``; bad values raise ``CliError``."""
    from yieldgate.server import (
        GovernorConfig,
        HttpConfig,
        PriorityPolicy,
        Server,
        SimulatedBackend,
        SimulatedConfig,
        TcpConfig,
    )
    from yieldgate.server.backends import parse_mix
    from yieldgate.server.governor import Governor
    from yieldgate.server.http import require_front

    if args.http_port is not None:
        require_front("--http-port")
    try:
        mix = parse_mix(args.exec_mix) if args.exec_mix else ()
        sim = SimulatedConfig(
            exec_ms=args.exec_ms,
            mix=mix,
            fail_rate=args.fail_rate,
            cold_start_s=args.cold_start_s,
            ramp_s=args.ramp_s,
            seed=args.seed,
        )
        backend: Any
        backend = _harness_backend(args) if args.backend == "harness" else SimulatedBackend(sim)
        if args.initial_exec_ms is not None:
            initial = args.initial_exec_ms
        elif args.backend == "harness":
            initial = 100.0  # replaced by the engine's measured step times after warm-up
        elif mix:
            initial = sum(ms * w for ms, w in mix) / sum(w for _, w in mix)
        else:
            initial = args.exec_ms
        governor = Governor(
            GovernorConfig(
                max_inflight=args.max_inflight,
                priority=PriorityPolicy(
                    reserved_for_high=args.reserve_high, reserved_for_normal=args.reserve_normal
                ),
                initial_exec_ms=max(initial, 1.0),
                max_queued=args.queue,
            )
        )
        secret = _read_secret(args.secret_file)
        quota = _quota(args)
        tcp = TcpConfig(
            host=args.host,
            port=args.port,
            max_frame_bytes=args.max_frame_bytes,
            secret=secret,
            idle_timeout_s=args.idle_timeout_s,
            max_connections=args.max_connections,
            write_timeout_s=args.write_timeout_s,
        )
        http = None
        if args.http_port is not None:
            http = HttpConfig(
                host=_http_host(args),
                port=args.http_port,
                max_body_bytes=args.max_body_bytes,
                model_name=args.model_name,
                secret=secret,
                head_timeout_s=args.http_head_timeout_s,
                body_timeout_s=args.http_body_timeout_s,
                write_timeout_s=args.write_timeout_s,
                max_connections=args.http_max_connections,
                parser=args.http_parser,
                quota=quota,
            )
        return Server(governor, backend, tcp=tcp, http=http, grace_s=args.grace_s)
    except ValueError as exc:
        raise flag_error(exc, FLAGS) from None


async def _serve(server: Any) -> None:
    async with anyio.create_task_group() as tg:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                stopping = False
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if stopping:
                        print(f"{name} again: stopping now", file=sys.stderr, flush=True)
                        server.request_stop(hard=True)
                        return
                    print(f"{name}: shutting down gracefully", file=sys.stderr, flush=True)
                    stopping = True
                    server.request_stop()

        tg.start_soon(watch_signals)
        await server.run(on_ready=lambda url: print(f"listening {url}", flush=True))
        tg.cancel_scope.cancel()


def _raise_open_file_limit() -> None:
    """Lift the soft limit on open files to the hard one: each connection is a descriptor."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            logging.getLogger("yieldgate.server").warning("could not raise the open-file limit")


def run(args: argparse.Namespace) -> int:
    _raise_open_file_limit()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = build_server(args)
    if not _is_loopback(args.host) and server.tcp.config.secret is None:
        _warn(
            f"binding {args.host} without --secret-file: anyone who can reach this port "
            "can submit work"
        )
    http = server.http
    if http is not None and not _is_loopback(http.config.host) and http.config.secret is None:
        _warn(
            f"binding HTTP on {http.config.host} without --secret-file: anyone who can reach "
            "--http-port can submit work"
        )
    try:
        run_async(_serve, server)
    except* OSError as group:
        if server.urls:
            raise  # bound and served: not a listening problem
        if server.tcp.address is None:
            where = f"{args.host}:{args.port}"
        else:
            where = f"HTTP {_http_host(args)}:{args.http_port}"
        exc: BaseException = group
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        reason = getattr(exc, "strerror", None) or str(exc)
        raise CliFailure(f"cannot listen on {where}: {reason}") from None
    return 0


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
