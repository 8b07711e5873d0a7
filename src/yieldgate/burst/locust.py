"""yieldgate's burst strategies as Locust users, for load beyond one machine.

Import it from a locustfile (it imports ``locust``, which nothing else in
yieldgate does, and Locust monkey-patches the process with gevent)::

    # locustfile.py
    from yieldgate.burst.locust import YieldgateFastHttpUser  # noqa: F401

    $ locust -f locustfile.py --host http://127.0.0.1:8000 --yieldgate-strategy yieldgate,naive

Each user sends OpenAI chat completions (``POST /v1/chat/completions``) back to
back through one strategy of ``yieldgate burst``: ``yieldgate`` (a Gate, on
its sync driver; one Gate per process and strategy, shared by that process's
users, as an application shares one), ``naive`` (one attempt),
``tenacity`` (exponential backoff with jitter, 10 attempts, blind to hints),
``openai-default`` (the official client's rule: 2 retries, a hint slept
exactly) or ``anthropic-default`` (anthropic's: the same, any hint slept).
``--yieldgate-strategy`` lists the strategies; users are dealt round-robin
among them, all against the same server at once.

Locust's statistics get one entry per *request*, whatever the attempts it
took: the request type is the strategy, the name ``chat`` (``--yieldgate-name``),
the response time the whole request's, a failure a request that failed in the
end. Attempts are sent with Locust's own client (``HttpUser``: requests;
``FastHttpUser``: geventhttpclient) but not reported one by one; yieldgate's
counters (requests, attempts, yields, failures per strategy) travel from the
workers to the master with Locust's worker reports, are printed when the
master quits and written as JSON with ``--yieldgate-json PATH``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from locust import FastHttpUser, HttpUser, constant, events
from locust.event import EventHook
from locust.runners import WorkerRunner

import yieldgate
from yieldgate.burst._strategies import (
    OFFICIAL,
    STRATEGY_NAMES,
    TENACITY_ATTEMPTS,
    Strategy,
    tenacity_wait,
)
from yieldgate.burst._targets import Workload
from yieldgate.dialects import HttpDialect, get_dialect
from yieldgate.gate import OutcomeKind

__all__ = ["COUNTER_NAMES", "YieldgateFastHttpUser", "YieldgateHttpUser", "counters"]

COUNTER_NAMES = ("requests", "succeeded", "failed", "attempts", "yields")
_RETRYABLE = (OutcomeKind.YIELD, OutcomeKind.OVERLOADED, OutcomeKind.RETRYABLE)
_YIELDS = (OutcomeKind.YIELD, OutcomeKind.OVERLOADED)


class _Counters:
    """Per-strategy counts in one process; a worker hands its new ones to the master."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, int]] = {}
        self._total: dict[str, dict[str, int]] = {}

    def add(self, strategy: str, **counts: int) -> None:
        with self._lock:
            for book in (self._pending, self._total):
                row = book.setdefault(strategy, dict.fromkeys(COUNTER_NAMES, 0))
                for name, n in counts.items():
                    row[name] += n

    def take(self) -> dict[str, dict[str, int]]:
        """The counts since the last ``take`` (what a worker reports)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def merge(self, reported: Mapping[str, Mapping[str, int]]) -> None:
        """Counts a worker reported (on the master)."""
        for strategy, row in reported.items():
            with self._lock:
                mine = self._total.setdefault(strategy, dict.fromkeys(COUNTER_NAMES, 0))
                for name in COUNTER_NAMES:
                    mine[name] += int(row.get(name, 0))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            rows: dict[str, dict[str, Any]] = {
                s: dict(row) for s, row in sorted(self._total.items())
            }
        for row in rows.values():
            n = row["requests"]
            row["attempts_per_request"] = row["attempts"] / n if n else 0.0
            row["success_rate"] = row["succeeded"] / n if n else 0.0
        return rows

    def reset(self) -> None:
        with self._lock:
            self._pending.clear()
            self._total.clear()


_COUNTERS = _Counters()


def counters() -> dict[str, dict[str, Any]]:
    """This process's counts per strategy (the master's: every worker's, as reported)."""
    return _COUNTERS.snapshot()


# -- Locust hooks -----------------------------------------------------------------------


def _options(parser: Any) -> None:
    group = parser.add_argument_group("yieldgate")
    group.add_argument(
        "--yieldgate-strategy",
        default="yieldgate",
        help=f"comma-separated, from {', '.join(STRATEGY_NAMES)}; users are dealt round-robin",
    )
    group.add_argument(
        "--yieldgate-policy",
        default=None,
        help="the yieldgate strategy's Gate policy: a preset or a JSON file (yieldgate burst's)",
    )
    group.add_argument("--yieldgate-dialect", default="openai", help="how replies are read")
    group.add_argument("--yieldgate-model", default="yieldgate-sim", help="the model asked for")
    group.add_argument("--yieldgate-max-tokens", type=int, default=None, help="max_tokens")
    group.add_argument("--yieldgate-name", default="chat", help="the name in Locust's stats")
    group.add_argument(
        "--yieldgate-json", default=None, help="write yieldgate's counters here when done"
    )


def _report(client_id: str, data: dict[str, Any]) -> None:
    data["yieldgate"] = _COUNTERS.take()


def _worker_report(client_id: str, data: dict[str, Any]) -> None:
    _COUNTERS.merge(data.get("yieldgate") or {})


def _test_start(environment: Any, **_: Any) -> None:
    _COUNTERS.reset()


def _quitting(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    rows = counters()
    for strategy, row in rows.items():
        print(
            f"yieldgate {strategy}: {row['requests']} requests, {row['succeeded']} succeeded, "
            f"{row['attempts_per_request']:.2f} attempts/request, {row['yields']} yields"
        )
    path = getattr(environment.parsed_options, "yieldgate_json", None)
    if path:
        Path(path).write_text(json.dumps({"strategies": rows}, indent=1) + "\n", encoding="utf-8")


events.init_command_line_parser.add_listener(_options)
events.report_to_master.add_listener(_report)
events.worker_report.add_listener(_worker_report)
events.test_start.add_listener(_test_start)
events.quitting.add_listener(_quitting)


# -- the users --------------------------------------------------------------------------

_GATES: dict[tuple[str, str | None], yieldgate.Gate] = {}
_GATES_LOCK = threading.Lock()
_DEAL = itertools.count()


def _gate(policy: str | None) -> yieldgate.Gate:
    """One Gate per process and policy, shared by its users."""
    with _GATES_LOCK:
        key = ("yieldgate", policy)
        if key not in _GATES:
            _GATES[key] = Strategy.parse("yieldgate", policy=policy).make_gate()
        return _GATES[key]


class _Failed(Exception):
    """A request that failed in the end: its last status or error."""


class _Retryable(_Failed):
    """An attempt that another may fix (for tenacity's ``retry``)."""


class _Strategic:
    """What both user classes share: the strategy, the attempts, the reports."""

    abstract = True
    wait_time = constant(0)
    path = "/v1/chat/completions"
    client: Any
    environment: Any

    def _setup(self) -> None:
        options = self.environment.parsed_options
        names = [n.strip() for n in getattr(options, "yieldgate_strategy", "yieldgate").split(",")]
        unknown = [n for n in names if n not in STRATEGY_NAMES]
        if unknown or not names:
            raise ValueError(f"--yieldgate-strategy: use {', '.join(STRATEGY_NAMES)}")
        self.strategy = names[next(_DEAL) % len(names)]
        policy = getattr(options, "yieldgate_policy", None)
        self.dialect: HttpDialect = get_dialect(getattr(options, "yieldgate_dialect", "openai"))
        self.model = getattr(options, "yieldgate_model", "yieldgate-sim")
        self.max_tokens = getattr(options, "yieldgate_max_tokens", None)
        self.request_name = getattr(options, "yieldgate_name", "chat")
        self.gate = _gate(policy) if self.strategy == "yieldgate" else None
        self.label = Strategy.parse(self.strategy, policy=policy).label
        self.rng = random.Random()  # noqa: S311 - jitter
        self.workload = Workload(model=self.model, max_tokens=self.max_tokens)
        self.sent = 0
        # Attempts go through Locust's client, but only whole requests are reported.
        self.client.request_event = EventHook()

    def _attempt(self, prompt: str) -> Any:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        response = self.client.post(self.path, json=body)
        error = getattr(response, "error", None)
        if not response.status_code and isinstance(error, BaseException):
            raise error  # no reply: a connection failure, retryable
        return response

    def _once(self, prompt: str) -> tuple[Any, Any]:
        """One attempt and its Outcome (what the Gate's classifier makes of it)."""
        _COUNTERS.add(self.label, attempts=1)
        try:
            response = self._attempt(prompt)
        except Exception as exc:
            return None, yieldgate.default_classify(None, exc)
        outcome = self.dialect(response, None)
        if outcome.kind in _YIELDS:
            _COUNTERS.add(self.label, yields=1)
        return response, outcome

    def _send(self, prompt: str) -> Any:
        if self.gate is not None:
            return self._through_gate(prompt)
        if self.strategy == "tenacity":
            return self._tenacity(prompt)
        # naive, or an official client's rule (its client is not the one sending here)
        _, retries, longest_hint = OFFICIAL.get(self.strategy, ("openai", 0, 0.0))
        attempts = retries + 1
        for n in range(attempts):
            response, outcome = self._once(prompt)
            if outcome.kind is OutcomeKind.OK:
                return response
            if outcome.kind not in _RETRYABLE or n == attempts - 1:
                raise _Failed(_describe(response, outcome))
            hint = outcome.hint_s
            if hint is not None and 0 < hint <= longest_hint:
                time.sleep(hint)  # exactly, as the official client does
            else:
                time.sleep(min(0.5 * 2**n, 8.0) * (1 - 0.25 * self.rng.random()))
        raise AssertionError("unreachable")  # pragma: no cover

    def _tenacity(self, prompt: str) -> Any:
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
        )

        def one() -> Any:
            response, outcome = self._once(prompt)
            if outcome.kind is OutcomeKind.OK:
                return response
            if outcome.kind in _RETRYABLE:
                raise _Retryable(_describe(response, outcome))
            raise _Failed(_describe(response, outcome))

        # The burst tool's tenacity strategy, on the sync side.
        retrying = Retrying(
            stop=stop_after_attempt(TENACITY_ATTEMPTS),
            wait=tenacity_wait(),
            retry=retry_if_exception_type(_Retryable),
            reraise=True,
        )
        return retrying(one)

    def _through_gate(self, prompt: str) -> Any:
        assert self.gate is not None

        def attempt() -> Any:
            _COUNTERS.add(self.label, attempts=1)
            return self._attempt(prompt)

        def classify(value: Any, error: BaseException | None) -> Any:
            if error is not None:
                outcome = yieldgate.default_classify(None, error)
            else:
                outcome = self.dialect(value, None)
            if outcome.kind in _YIELDS:
                _COUNTERS.add(self.label, yields=1)
            return outcome

        try:
            return self.gate.call_sync(attempt, classify=classify)
        except yieldgate.YieldgateError as exc:
            raise _Failed(type(exc).__name__) from exc

    def chat(self) -> None:
        prompt = self.workload.prompt(self.sent, 0.0)
        self.sent += 1
        started = time.perf_counter()
        response: Any = None
        error: BaseException | None = None
        try:
            response = self._send(prompt)
        except _Failed as exc:
            error = exc
        elapsed_ms = (time.perf_counter() - started) * 1000
        # Attempts and yields were counted as they happened: a request cut off when the
        # run stops leaves its attempts counted (as the server saw them), not itself.
        _COUNTERS.add(self.label, requests=1, **{"succeeded" if error is None else "failed": 1})
        length = 0
        if response is not None:
            with contextlib.suppress(Exception):
                length = len(response.content or b"")
        self.environment.events.request.fire(
            request_type=self.label,
            name=self.request_name,
            response_time=elapsed_ms,
            response_length=length,
            response=response,
            context={},
            exception=error,
        )


def _describe(response: Any, outcome: Any) -> str:
    status = getattr(response, "status_code", None)
    if status:
        return f"HTTP {status} ({outcome.kind})"
    return f"{outcome.reason or outcome.kind}"


def _chat(user: _Strategic) -> None:
    user.chat()


class YieldgateHttpUser(_Strategic, HttpUser):  # type: ignore[misc]
    """The strategies over Locust's ``HttpUser`` (requests)."""

    abstract = False
    tasks: ClassVar[list[Callable[..., None]]] = [_chat]

    def on_start(self) -> None:
        self._setup()


class YieldgateFastHttpUser(_Strategic, FastHttpUser):  # type: ignore[misc]
    """The strategies over Locust's ``FastHttpUser`` (geventhttpclient)."""

    abstract = False
    tasks: ClassVar[list[Callable[..., None]]] = [_chat]

    def on_start(self) -> None:
        self._setup()
