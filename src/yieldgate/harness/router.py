"""Conditional disaggregation: prefill here, or on a prefill worker?

A decode worker runs the router on every new request. Offloading a prefill
costs a queue wait and a KV transfer, so it only pays for prompts that would
tie up the decode GPU for long. The rule (Dynamo's conditional
disaggregation, plus a busy-decode rule):

- the *effective* prompt is ``prompt_tokens - prefix_hit_tokens``: what the
  local prefix cache does not already hold;
- it is offloaded when it is at least ``prefill_length_threshold`` tokens, or
  at least ``busy_length_threshold`` while the decode worker is busy
  (``decode_busy_running`` sequences or more), so heavy compute stays away
  from the decode batch;
- but never to a worker whose queue is at ``max_prefill_queue`` or above:
  when every worker is that full, or none is alive, the prefill stays local.

Among the workers that may take it, ``Router`` picks the lowest latency cost:
``queue_weight * queued + queued_tokens_weight * queued_tokens / 1000 -
cache_weight * cached_tokens / 1000``, ties to the lowest index.

Every decision carries one reason from a fixed vocabulary (``REASONS``):

- ``short``: local, the effective prompt is under the threshold in force;
- ``prefix_hit``: local, the prompt alone would have been offloaded but the
  local prefix cache makes it short;
- ``no_worker``: local, it would have been offloaded but no worker is alive;
- ``queue_full``: local, it would have been offloaded but every live worker's
  queue is at ``max_prefill_queue``;
- ``long``: remote, the effective prompt reaches ``prefill_length_threshold``;
- ``busy_decode``: remote, shorter than that but reaching
  ``busy_length_threshold`` while decode is busy;
- ``yield_to_high``: local, it would have been offloaded but the caller
  keeps it local (graceful degradation: a low-priority prompt while the
  prefill workers serve high-priority ones).

``RouterConfigFile`` keeps the thresholds in a JSON file that may be edited
while serving; ``PrefixTracker`` estimates which prompt blocks a prefill
worker holds, for the ``cached_tokens`` of its ``WorkerLoad``.

Nothing here is thread-safe: call a ``Router`` and its trackers from one
thread (the event loop that routes).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final

from yieldgate.harness.block_manager import chain_hash

__all__ = [
    "REASONS",
    "PrefixTracker",
    "Route",
    "Router",
    "RouterConfig",
    "RouterConfigFile",
    "WorkerLoad",
    "should_offload_prefill",
]

log = logging.getLogger("yieldgate.harness")

REASONS: Final = (
    "short",
    "prefix_hit",
    "no_worker",
    "queue_full",
    "yield_to_high",
    "long",
    "busy_decode",
)

# The hash chain's root, the same as BlockManager's, so hashes agree with the engine's.
_ROOT_HASH: Final = -1
_INT_FIELDS: Final = frozenset(
    {
        "prefill_length_threshold",
        "busy_length_threshold",
        "decode_busy_running",
        "max_prefill_queue",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    """The router's thresholds and cost weights (see the module docstring)."""

    prefill_length_threshold: int = 128
    busy_length_threshold: int = 48
    decode_busy_running: int = 8
    max_prefill_queue: int = 4
    queue_weight: float = 1.0
    queued_tokens_weight: float = 1.0
    cache_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in sorted(_INT_FIELDS):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.busy_length_threshold > self.prefill_length_threshold:
            raise ValueError(
                f"busy_length_threshold ({self.busy_length_threshold}) must not exceed "
                f"prefill_length_threshold ({self.prefill_length_threshold})"
            )
        for name in ("queue_weight", "queued_tokens_weight", "cache_weight"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value >= 0)
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RouterConfig:
        """A config from parsed JSON; unknown keys and wrong types are a ``ValueError``.

        Keys left out keep their defaults. Integers are accepted for the weights.
        """
        if not isinstance(data, Mapping):
            # A bad config file, like every other bad value: one error type for callers.
            raise ValueError(  # noqa: TRY004
                f"router config must be a JSON object, got {type(data).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise ValueError(f"unknown router config key(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in _INT_FIELDS:
                if type(value) is not int:
                    raise ValueError(f"{key} must be an integer, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number, got {value!r}")
            else:
                value = float(value)
            values[key] = value
        return cls(**values)


class RouterConfigFile:
    """A ``RouterConfig`` kept in a JSON file, picked up again when the file changes.

    ``current()`` looks at the file at most every ``check_interval_s`` seconds
    (one ``stat``) and reads it again when its modification time or size
    changed. An edit that does not load (bad JSON, a bad value, the file gone)
    keeps the config in force, counts in ``reload_errors``, is kept in
    ``last_error`` and logged; the same broken state is counted once. The
    first load, in the constructor, raises ``ValueError`` instead.

    ``reloads`` counts successful loads after the first; ``last_error`` is the
    latest failed attempt's message, ``None`` again once a load succeeds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        check_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(check_interval_s) and check_interval_s >= 0):
            raise ValueError("check_interval_s must be a finite number >= 0")
        self.path = Path(path)
        self.check_interval_s = check_interval_s
        self._clock = clock
        self.reloads = 0
        self.reload_errors = 0
        self.last_error: str | None = None
        self._signature = self._stat()
        try:
            self._config = self._read()
        except ValueError as exc:
            raise ValueError(f"router config {str(self.path)!r}: {exc}") from exc
        self._checked_at = clock()

    def current(self) -> RouterConfig:
        """The config in force, after a cheap check for an edited file."""
        now = self._clock()
        if now - self._checked_at < self.check_interval_s:
            return self._config
        self._checked_at = now
        signature = self._stat()
        if signature == self._signature:
            return self._config
        self._signature = signature
        try:
            config = self._read()
        except ValueError as exc:
            self.reload_errors += 1
            self.last_error = str(exc)
            log.warning(
                "router config %s not reloaded, keeping the previous one: %s", self.path, exc
            )
            return self._config
        self._config = config
        self.reloads += 1
        self.last_error = None
        log.info("router config %s reloaded", self.path)
        return config

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _read(self) -> RouterConfig:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from exc
        return RouterConfig.from_mapping(data)


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One prefill worker as the router sees it.

    ``queued`` prefills waiting or running there, ``queued_tokens`` their
    uncached prompt tokens, ``cached_tokens`` the estimated prefix-cache match
    for this prompt on that worker (``PrefixTracker.match``).
    """

    index: int
    alive: bool
    queued: int
    queued_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Route:
    """A routing decision: ``remote`` on prefill worker ``worker``, or local (``worker`` None)."""

    remote: bool
    worker: int | None
    reason: str
    effective_tokens: int


def _length_rule(
    prompt_tokens: int, prefix_hit_tokens: int, decode_running: int, config: RouterConfig
) -> tuple[int, str]:
    """The effective prompt and the length rule's reason: short, prefix_hit, long or busy_decode."""
    if prompt_tokens < 0 or prefix_hit_tokens < 0 or decode_running < 0:
        raise ValueError("prompt_tokens, prefix_hit_tokens and decode_running must be >= 0")
    effective = max(0, prompt_tokens - prefix_hit_tokens)
    busy = decode_running >= config.decode_busy_running
    threshold = config.busy_length_threshold if busy else config.prefill_length_threshold
    if effective < threshold:
        hit_made_it_short = prefix_hit_tokens > 0 and prompt_tokens >= threshold
        return effective, "prefix_hit" if hit_made_it_short else "short"
    if effective >= config.prefill_length_threshold:
        return effective, "long"
    return effective, "busy_decode"


def should_offload_prefill(
    prompt_tokens: int,
    prefix_hit_tokens: int,
    prefill_queue: int,
    decode_running: int,
    config: RouterConfig,
) -> tuple[bool, str]:
    """Whether to prefill remotely, and why (one of ``REASONS``).

    ``prefill_queue`` is the queue length of the worker it would go to.
    """
    _, reason = _length_rule(prompt_tokens, prefix_hit_tokens, decode_running, config)
    if reason in ("short", "prefix_hit"):
        return False, reason
    if prefill_queue >= config.max_prefill_queue:
        return False, "queue_full"
    return True, reason


class PrefixTracker:
    """An estimate of the prompt blocks one prefill worker holds in its prefix cache.

    ``record`` the prompts sent there; ``match`` says how many leading tokens
    of a new prompt that worker's cache would likely supply. Blocks are
    hashed with ``chain_hash`` from the same root as the engine's
    ``BlockManager``, and like ``BlockManager.cached_prefix`` a match never
    covers the block holding the prompt's last token (that token is always
    computed). Only hashes are kept, so a hash collision overestimates.

    At most ``capacity_blocks`` hashes are kept; the least recently recorded
    go first, a prompt's later blocks before its earlier ones (a later block
    is no use without those before it). ``match`` does not refresh anything:
    it is asked of every worker, and only the chosen one will compute.
    """

    def __init__(self, block_size: int, capacity_blocks: int = 4096) -> None:
        if type(block_size) is not int or block_size < 1:
            raise ValueError("block_size must be an integer >= 1")
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise ValueError("capacity_blocks must be an integer >= 1")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._hashes: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._hashes)

    def match(self, tokens: Sequence[int]) -> int:
        """Leading tokens of ``tokens`` in full blocks this worker was seen to compute."""
        size = self.block_size
        prev = _ROOT_HASH
        matched = 0
        for start in range(0, len(tokens) - size, size):
            prev = chain_hash(prev, tuple(tokens[start : start + size]))
            if prev not in self._hashes:
                break
            matched += size
        return matched

    def record(self, tokens: Sequence[int]) -> None:
        """Note that this worker computed (and now caches) every full block of ``tokens``."""
        size = self.block_size
        prev = _ROOT_HASH
        chain: list[int] = []
        for start in range(0, len(tokens) - size + 1, size):
            prev = chain_hash(prev, tuple(tokens[start : start + size]))
            chain.append(prev)
        # Earliest block last, so it is the most recently used and evicted last.
        for h in reversed(chain):
            self._hashes[h] = None
            self._hashes.move_to_end(h)
        while len(self._hashes) > self.capacity_blocks:
            self._hashes.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        """Forget everything (the worker restarted, so its cache is empty)."""
        self._hashes.clear()


class Router:
    """Decides, per request, local or remote prefill, and on which worker."""

    def __init__(self, config: RouterConfig | RouterConfigFile) -> None:
        self._source = config
        self._decisions: Counter[str] = Counter()
        self._by_worker: Counter[int] = Counter()

    @property
    def config(self) -> RouterConfig:
        """The config in force (a file's is checked for edits first)."""
        source = self._source
        return source.current() if isinstance(source, RouterConfigFile) else source

    def route(
        self,
        *,
        prompt_tokens: int,
        prefix_hit_tokens: int,
        decode_running: int,
        workers: Sequence[WorkerLoad],
        keep_local: bool = False,
    ) -> Route:
        """Route one request; ``prefix_hit_tokens`` is the local (decode worker's) cache hit.

        ``keep_local`` overrides the offload rule: a prompt it would send away
        stays local, reason ``yield_to_high``.
        """
        config = self.config
        effective, reason = _length_rule(prompt_tokens, prefix_hit_tokens, decode_running, config)
        if reason in ("short", "prefix_hit"):
            return self._local(reason, effective)
        if keep_local:
            return self._local("yield_to_high", effective)
        alive = [w for w in workers if w.alive]
        if not alive:
            return self._local("no_worker", effective)
        open_workers = [w for w in alive if w.queued < config.max_prefill_queue]
        if not open_workers:
            return self._local("queue_full", effective)
        best = min(open_workers, key=lambda w: (_cost(w, config), w.index))
        self._decisions[reason] += 1
        self._by_worker[best.index] += 1
        return Route(remote=True, worker=best.index, reason=reason, effective_tokens=effective)

    def _local(self, reason: str, effective: int) -> Route:
        self._decisions[reason] += 1
        return Route(remote=False, worker=None, reason=reason, effective_tokens=effective)

    def stats(self) -> dict[str, Any]:
        """Decisions so far, by reason and by worker, and the config file's reload counters.

        ``offload_ratio`` is remote over all decisions, ``None`` before the first.
        """
        decisions = {reason: self._decisions[reason] for reason in REASONS}
        remote = decisions["long"] + decisions["busy_decode"]
        total = sum(decisions.values())
        source = self._source
        file = source if isinstance(source, RouterConfigFile) else None
        return {
            "decisions": decisions,
            "remote": remote,
            "local": total - remote,
            "offload_ratio": remote / total if total else None,
            "by_worker": {str(index): n for index, n in sorted(self._by_worker.items())},
            "config": asdict(self.config),
            "config_reloads": file.reloads if file else 0,
            "config_reload_errors": file.reload_errors if file else 0,
            "config_last_error": file.last_error if file else None,
        }


def _cost(worker: WorkerLoad, config: RouterConfig) -> float:
    return (
        config.queue_weight * worker.queued
        + config.queued_tokens_weight * worker.queued_tokens / 1000.0
        - config.cache_weight * worker.cached_tokens / 1000.0
    )
