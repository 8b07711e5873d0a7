"""Issue 39: nothing held when nothing runs, as a stateful property of a fleet.

A hypothesis ``RuleBasedStateMachine`` builds two or three members (Gates of this
process, each its own member, ``shared=`` a real Redis: tests/fleet/conftest.py),
under a fresh Gate name per example, one of them maybe behind a slow link
(``DelayProxy``: its asks of the fleet take a while, so that cancellations land
in them). They serve two models (``Cost.scope``) of one OpenAI-style provider
(``Provider``) whose answers are drawn per attempt: a success reading both
buckets, the requests bucket alone or the tokens bucket alone (a proxy that
passes some headers), the provider's own 429 when its bucket is empty, a 429
with ``retry-after-ms`` for the call's model, a 503 or a connection error
without rate-limit headers, an answer that is slow or never comes. Rules:

- ``calls``: one to five calls at once, each on a member, cancelled or not
  (a cancel scope's deadline: in the first reading's ask, in the fleet's lease
  line, in flight), through ``call``, ``hold`` or ``call_and_hold``, whose lease
  is released, dropped (freed by reference counting), dropped in a reference
  cycle (as openai's streams are: freed only by a collection), kept for a later
  rule, or left to lapse (``lapse_after``, as a transport's unread body: at once,
  while the rule's other calls run, or once they are all over, so that no caller
  of its member looks when it lapses); or a
  sync ``call_and_hold_sync``/``hold_sync`` in a thread, interrupted by a
  ``KeyboardInterrupt`` at a drawn line of the Gate's code (tests/gate/interrupts.py),
  counted from the call's start or from the end of its attempts (its hand-over);
- ``settle``: release or drop a kept lease from outside any call;
- ``die``: a member shuts down (``close``: its link stops renewing) with leases
  its application never released; in-process, that is what a process that
  exits leaves: its fleet leases lapse in Redis after ``lease_ttl_s`` (the
  machine keeps those ``Lease`` objects alive, as a dead process runs no
  finalizer);
- ``join``: a new member joins the fleet (its own first reading: known by then,
  or not).

After every rule, with no call running (``check``): no hold of the whole
upstream (every 429 is a model's) and no model waits for another's buckets;
the fleet's first reading never settled as "no quota" (every success here
reads a bucket); Redis holds no in-flight lease but those of leases kept,
not yet lapsed, or of dead members (a lapsed one is given back by its member's
worker, with no later call: the check first waits until every lease left to
lapse has, so that it looks before the next rule's callers would); a call of a
member whose window a lease dropped in a cycle fills gets the slot at once (the
Gate collects while callers wait); then every member's ``audit()`` is empty,
its held slots are exactly those of its live kept leases, and ``Fleet.audit``
of Redis is empty (nothing leased, no probe held, nothing unseen). Real time:
the checks wait on conditions (operations handed to a worker thread, round
trips of cancelled calls, a lapse's time), never a fixed sleep.
"""

from __future__ import annotations

import gc
import math
import os
import random
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
import anyio.from_thread
import anyio.to_thread
import httpx
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.fleet.conftest import DelayProxy, RedisServer
from tests.gate.holdings import core_held
from tests.gate.interrupts import InterruptAt, own_lock
from yieldgate import (
    Cost,
    FleetPolicy,
    Gate,
    GatePolicy,
    RetryPolicy,
    TimeoutPolicy,
    WindowPolicy,
    YieldgateError,
)
from yieldgate.dialects import OPENAI
from yieldgate.gate import Lease, _dropped, _sync
from yieldgate.protocol import Priority

pytestmark = pytest.mark.counters_may_drift

EXAMPLES = int(os.environ.get("YIELDGATE_FLEET_MACHINE_EXAMPLES", "30"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=4,
    deadline=None,
    derandomize=True,
    database=None,
    # Shrinking replays failing runs of real time (seconds each): minutes. On request only.
    phases=list(Phase) if os.environ.get("YIELDGATE_FLEET_MACHINE_SHRINK") else [Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MODELS = ("a", "b")
LEASE_TTL_S = 4.0  # renewed every 1.3 s while held; a dead member's lapse after it
FIRST_S = 6.0  # first_reading_s: above SETTLE_S, so that a probe kept shows in Redis
SETTLE_S = 3.0  # what handed-over give-backs take at most (a worker, a cancelled ask)
LAPSE_S = 0.1  # a body left unread this long lapses
RULE_S = 30.0  # no rule's calls may run longer (each has a deadline)
AFTER = 200  # a sync call's ``line`` past this: the (line - AFTER)-th once its attempts are over


class Provider:
    """Each model's quota: a requests and a tokens bucket, full again ``WINDOW_S``
    after empty. A request that does not fit is refused (a 429 with the headers)."""

    WINDOW_S = 2.0
    LIMITS: ClassVar[dict[str, float]] = {"requests": 12.0, "tokens": 1500.0}

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.level = {(m, r): limit for m in MODELS for r, limit in self.LIMITS.items()}
        self.at = time.monotonic()

    def answer(self, model: str, tokens: int, act: str) -> httpx.Response:
        if act == "connect":
            raise httpx.ConnectError("refused")
        if act == "503":
            return httpx.Response(503, json={"error": "unavailable"})
        if act == "429":  # the model's quota refused, the hint alone
            return httpx.Response(429, json={}, headers={"retry-after-ms": "1500"})
        with self.lock:
            now = time.monotonic()
            for (m, r), level in self.level.items():
                limit = self.LIMITS[r]
                self.level[m, r] = min(limit, level + (now - self.at) * limit / self.WINDOW_S)
            self.at = now
            want = {"requests": 1.0, "tokens": float(tokens)}
            fits = all(want[r] <= self.level[model, r] for r in want)
            if fits:
                for r in want:
                    self.level[model, r] -= want[r]
                    if act == "drained":  # another application on the key spent the rest
                        self.level[model, r] = min(self.level[model, r], 1.0)
            headers = {}
            shown = {"requests": ("requests",), "tokens": ("tokens",)}.get(act, tuple(want))
            for r in shown if fits else tuple(want):
                limit = self.LIMITS[r]
                level = self.level[model, r]
                headers[f"x-ratelimit-limit-{r}"] = str(int(limit))
                headers[f"x-ratelimit-remaining-{r}"] = str(math.floor(level))
                headers[f"x-ratelimit-reset-{r}"] = (
                    f"{(limit - level) / limit * self.WINDOW_S:.3f}s"
                )
        if fits:
            return httpx.Response(200, json={"ok": True}, headers=headers)
        headers["retry-after-ms"] = "300"
        return httpx.Response(429, json={}, headers=headers)


@dataclass(frozen=True)
class Plan:
    """One call of a rule."""

    member: int
    api: str  # call hold call_and_hold sync_hold sync_call_and_hold
    model: str = "a"
    tokens: int = 10
    acts: tuple[str, ...] = ("full",)
    start_s: float = 0.0
    cancel_s: float | None = None
    fate: str = "release"  # release drop cycle keep lapse
    line: int = 1  # where a sync call is interrupted (past ``AFTER``: in its hand-over)


ACTS = st.sampled_from(
    ["full"] * 4 + ["requests", "tokens", "drained", "429", "503", "connect", "slow", "hang"]
)
WHEN = st.sampled_from([(0.0, None)] * 6 + [(s, c) for s in (0.0, 0.02) for c in (0.0, 0.005,
                        0.02, 0.05, 0.15, 0.4)])  # fmt: skip
FATES = st.sampled_from(["release", "release", "drop", "cycle", "keep", "keep", "lapse"])


def _plan(api: str, member: int, who: tuple[str, int], acts: list[str],
          when: tuple[float, float | None], fate: str, line: int) -> Plan:  # fmt: skip
    model, tokens = who
    start_s, cancel_s = when
    return Plan(member, api, model, tokens, tuple(acts), start_s, cancel_s, fate, line)


PLANS = st.builds(
    _plan,
    st.sampled_from(
        [
            "call",
            "call",
            "hold",
            "call_and_hold",
            "call_and_hold",
            "sync_hold",
            "sync_call_and_hold",
        ]
    ),
    st.integers(0, 3),
    st.sampled_from([(m, t) for m in MODELS for t in (1, 100, 400)]),
    st.lists(ACTS, min_size=1, max_size=3),
    WHEN,
    FATES,
    st.integers(1, 250),
)


class InterruptAfter(InterruptAt):
    """``InterruptAt``, counting only the lines run once the call's attempts are over
    (``_sync.run`` returned or raised): Ctrl-C in the steps that hand its held slot
    over to the caller's ``Lease``, which a count from the call's start (hundreds of
    lines, thousands with retries) seldom reaches."""

    def __init__(self, gate: Gate, n: int) -> None:
        super().__init__(gate, n)
        self.armed = False

    def local(self, frame: Any, event: str, arg: Any) -> Any:
        if not self.armed:
            if event == "return" and frame.f_code is _sync.run.__code__:
                self.armed = True
            return self.local
        return super().local(frame, event, arg)


def kept_by(obj: object) -> list[str]:
    """What refers to ``obj`` (a failure's message)."""
    return [f"{type(r).__name__}: {r!r:.200}" for r in gc.get_referrers(obj)]


def until(check: Callable[[], list[str]], timeout: float) -> list[str]:
    """Poll ``check`` (what is wrong) until it says nothing, at most ``timeout`` s."""
    end = time.monotonic() + timeout
    while (problems := check()) and time.monotonic() < end:
        time.sleep(0.01)
    return problems


class FleetMachine(RuleBasedStateMachine):
    """Members of one fleet, driven by rules (see the module docstring)."""

    redis: RedisServer
    slow_url: str

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.portal = self.stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.admin = self.redis.client()
        self.name = f"machine-{uuid.uuid4().hex[:10]}"
        self.provider = Provider()
        self.members: list[Gate] = []
        self.dead: list[Gate] = []
        self.kept: list[tuple[Gate, Lease, float]] = []  # its member, the lease, lapse time
        self.corpses: list[Lease] = []  # kept by members that died
        self.dropped: list[weakref.ref[Lease]] = []
        self.cycled: list[tuple[Gate, weakref.ref[Lease]]] = []
        self.late: list[Lease] = []  # kept, to lapse once the rule's calls are over
        self.unexpected: list[BaseException] = []

    @initialize(
        members=st.integers(2, 3),
        window=st.integers(1, 3),
        cap=st.integers(1, 3),
        slow=st.booleans(),
        seed=st.integers(0, 3),
    )
    def build(self, members: int, window: int, cap: int, slow: bool, seed: int) -> None:
        self.window, self.cap, self.seed = window, cap, seed
        for i in range(members):
            self.join_one(self.slow_url if slow and i == 0 else self.redis.url)

    def join_one(self, url: str) -> None:
        policy = GatePolicy(
            window=WindowPolicy.fixed(self.window),
            retry=RetryPolicy(max_attempts=3, max_yields=3, base_s=0.01, max_backoff_s=0.05),
            timeout=TimeoutPolicy(attempt_s=0.5, total_s=2.0),
            fleet=FleetPolicy(
                inflight_cap=self.cap,
                budget_s=1.0,
                lease_ttl_s=LEASE_TTL_S,
                first_reading_s=FIRST_S,
            ),
        )
        rng = random.Random(self.seed + len(self.members))
        gate = Gate(policy, name=self.name, shared=url, rng=rng)
        own_lock(gate)  # for ``InterruptAt``
        self.members.append(gate)

    def teardown(self) -> None:
        try:
            for _, lease, _ in self.kept:
                lease.release()
            for lease in self.corpses:
                lease.release()
            self.kept.clear()
            self.corpses.clear()
            for gate in self.members + self.dead:
                gate.close()
        finally:
            self.stack.close()
            self.admin.close()

    # -- rules ----------------------------------------------------------------------

    @rule(
        settle=st.one_of(st.none(), st.tuples(st.integers(0, 7), st.booleans())),
        members=st.sampled_from([None, None, None, "die", "join"]),
        plans=st.lists(PLANS, min_size=2, max_size=6),
    )
    def calls(
        self, settle: tuple[int, bool] | None, members: str | None, plans: list[Plan]
    ) -> None:
        """Release or drop a lease kept by an earlier rule (``settle``), maybe have a
        member die or join, then run ``plans`` at once until all are over. (One rule:
        each step runs calls; what is kept depends on real time, so no rule's
        availability may depend on it.)"""
        if settle is not None and self.kept:
            self.settle(*settle)
        if members == "die" and len(self.members) > 2:
            self.die(settle[0] if settle else 0)
        elif members == "join" and len(self.members) < 4:
            self.join_one(self.redis.url)
        self.portal.call(self._calls, plans)
        self.lapse_late()
        if self.unexpected:
            raise self.unexpected[0]

    def settle(self, index: int, drop: bool) -> None:
        """Release or drop a lease kept by an earlier rule."""
        _, lease, _ = self.kept.pop(index % len(self.kept))
        if drop:
            self.dropped.append(weakref.ref(lease))
            del lease
        else:
            lease.release()

    def die(self, index: int) -> None:
        """A member shuts down with the leases its application holds never released."""
        gate = self.members.pop(index % len(self.members))
        gate.close()
        self.dead.append(gate)
        self.corpses += [lease for member, lease, _ in self.kept if member is gate]
        self.kept = [entry for entry in self.kept if entry[0] is not gate]

    def lapse_late(self) -> None:
        """The leases kept to lapse once the rule's calls are over start their idle
        time now: when they lapse no caller of their member looks (its fleet lease is
        the fleet worker's to give back)."""
        late = {id(lease) for lease in self.late}
        self.late.clear()
        for i, (gate, lease, _) in enumerate(self.kept):
            if id(lease) in late:
                lease.lapse_after(LAPSE_S)
                self.kept[i] = (gate, lease, time.monotonic() + LAPSE_S)

    # -- running calls ----------------------------------------------------------------

    async def _calls(self, plans: list[Plan]) -> None:
        start = anyio.current_time()
        with anyio.fail_after(RULE_S):
            async with anyio.create_task_group() as tg:
                for plan in plans:
                    tg.start_soon(self._one, plan, start)

    async def _one(self, plan: Plan, start: float) -> None:
        gate = self.members[plan.member % len(self.members)]
        deadline = math.inf if plan.cancel_s is None else start + plan.cancel_s
        if plan.api.startswith("sync"):  # a thread is not cancelled
            await anyio.to_thread.run_sync(self._sync, gate, plan)
            return
        with anyio.CancelScope(deadline=deadline):
            await anyio.sleep(plan.start_s)
            try:
                await self._invoke(gate, plan)
            except YieldgateError:
                pass
            except Exception as exc:
                self.unexpected.append(exc)

    def _cost(self, plan: Plan) -> Cost:
        return Cost(1, plan.tokens, plan.tokens, 0, plan.model)

    async def _invoke(self, gate: Gate, plan: Plan) -> None:
        sent = iter(range(100))

        async def send() -> httpx.Response:
            act = plan.acts[min(next(sent), len(plan.acts) - 1)]
            if act == "hang":
                await anyio.sleep_forever()
            if act == "slow":
                await anyio.sleep(0.05)
            return self.provider.answer(plan.model, plan.tokens, act)

        kwargs: dict[str, Any] = {"cost": self._cost(plan), "classify": OPENAI}
        if plan.api == "call":
            await gate.call(send, **kwargs)
        elif plan.api == "hold":
            async with gate.hold(send, **kwargs):
                await anyio.sleep(0.01)
        else:
            _, lease = await gate.call_and_hold(send, **kwargs)
            # (``line`` is the sync calls' alone: here it says when a lease lapses.)
            self.hand(gate, [lease], plan.fate, late=plan.line % 2 == 0)

    def hand(self, gate: Gate, box: list[Lease], fate: str, *, late: bool = False) -> None:
        """What the caller does with the lease in ``box`` (the only reference to it);
        ``late``: a lease to lapse lapses once the rule's calls are over."""
        if fate == "release":
            box.pop().release()
        elif fate == "drop":
            self.dropped.append(weakref.ref(box[0]))
            box.clear()
        elif fate == "cycle":  # as openai's Stream: a cycle, in the oldest generation
            box[0].lapse_after(30.0)  # a transport's attempt time: far off
            self.cycled.append((gate, weakref.ref(box[0])))
            cycle: list[Any] = [box.pop()]
            cycle.append(cycle)
            gc.collect(1)  # what survives moves to the oldest generation
            del cycle
        elif fate == "lapse" and late:
            self.late.append(box[0])
            self.kept.append((gate, box.pop(), math.inf))
        elif fate == "lapse":
            box[0].lapse_after(LAPSE_S)
            self.kept.append((gate, box.pop(), time.monotonic() + LAPSE_S))
        else:
            self.kept.append((gate, box.pop(), math.inf))

    def _sync(self, gate: Gate, plan: Plan) -> None:
        """``call_and_hold_sync`` or ``hold_sync``, Ctrl-C at its ``plan.line``-th line."""
        tracer = (
            InterruptAt(gate, plan.line)
            if plan.line <= AFTER
            else InterruptAfter(gate, plan.line - AFTER)
        )
        box: list[Lease] = []
        sys.settrace(tracer)
        try:
            kwargs: dict[str, Any] = {"cost": self._cost(plan), "classify": OPENAI}
            acts = iter(plan.acts)

            def send() -> httpx.Response:
                act = next(acts, plan.acts[-1])
                act = "503" if act == "hang" else act
                return self.provider.answer(plan.model, plan.tokens, act)

            if plan.api == "sync_hold":
                with gate.hold_sync(send, **kwargs):
                    pass
            else:
                box.append(gate.call_and_hold_sync(send, **kwargs)[1])
                box[0].release()
        except (KeyboardInterrupt, YieldgateError):
            pass  # the interrupt: the call is over, its lease (if any) dropped
        except Exception as exc:
            self.unexpected.append(exc)
        finally:
            sys.settrace(None)
        if box:
            self.dropped.append(weakref.ref(box.pop()))

    # -- the invariant -------------------------------------------------------------------

    @invariant()
    def check(self) -> None:
        if not self.members:
            return
        fleet = self.members[0]._core.shared.fleet  # type: ignore[union-attr]
        upstream = self.members[0]._core.upstreams[0].name
        self.holds_stay_on_their_scope(fleet, upstream)
        first = self.admin.get(fleet.keys.first(upstream))
        assert first != b"{none}", "a probe that failed settled the first reading as no quota"
        # Leases in a cycle are given back when collected, below. So are those dropped
        # while a garbage cycle keeps their caller's frame alive: redis-py's connect
        # catches a ResponseError (``CLIENT SETINFO`` on Redis before 7.2) whose
        # traceback, in a cycle, holds every frame above it, the one that dropped a
        # lease included, until the next collection (Python 3.13's, later than
        # 3.11's, came after this check).
        cycled = self.fleet_leases(ref for _, ref in self.cycled)
        cycled |= self.fleet_leases(self.dropped)
        # The leases left to lapse have lapsed (else a poll before would find nothing
        # stray, and the next rule's callers reclaim them): only their member's
        # worker gives their fleet leases back now.
        lapse_at = max((at for _, _, at in self.kept if at < math.inf), default=0.0)
        time.sleep(max(0.0, lapse_at - time.monotonic()))
        problems = until(lambda: self.stray_leases(fleet, upstream, cycled), self.lapse_wait())
        assert problems == [], problems
        self.collect_while_waiting()
        if any(ref() is not None for ref in self.dropped):
            gc.collect()
        alive = [lease for ref in self.dropped if (lease := ref()) is not None]
        assert not alive, f"a dropped lease is still alive, kept by {kept_by(alive[0])}"
        del alive
        self.dropped.clear()
        problems = until(lambda: self.stray_leases(fleet, upstream, set()), SETTLE_S)
        assert problems == [], problems
        for gate in self.members:
            core = gate._core
            assert core_held(core) == [], (gate.name, core_held(core))
            live = {lease._held for member, lease, _ in self.kept
                    if member is gate and not lease.released}  # fmt: skip
            assert core.held == live, f"{len(core.held)} held slot(s), {len(live)} live lease(s)"

        def in_redis() -> list[str]:
            found = fleet.audit_sync(upstream)
            assert found is not None, "Redis did not answer the audit"
            return [p for p in found if "in-flight lease" not in p]  # counted by id above

        problems = until(in_redis, SETTLE_S)
        assert problems == [], problems

    def holds_stay_on_their_scope(self, fleet: Any, upstream: str) -> None:
        """Every 429 here is one model's: nothing holds the whole upstream, and no
        model's claim waits for another model's buckets (a fleet's refusal of one)."""
        assert fleet.holds_sync(upstream) == {}, "the fleet holds the whole upstream"
        for gate in self.members:
            up = gate._core.upstreams[0]
            with gate._core.lock:
                now = gate._core.clock()
                for priority in Priority:
                    assert up.window.held_until(priority, now) <= now, (
                        f"{gate.name}: a model's 429 holds the whole upstream"
                    )
                quota = up.quota
                if not quota.shared:
                    continue
                for model in MODELS:
                    cost = Cost(1, 1, 1, 0, model)
                    if quota._fits(cost, now) > 0:
                        binding = quota.binding(cost, now)
                        assert binding is not None, f"model {model!r} waits for nothing"
                        assert binding.scope == model, f"model {model!r} waits for {binding.key!r}"

    @staticmethod
    def fleet_leases(refs: Iterable[weakref.ref[Lease]]) -> set[str]:
        """The fleet leases of the leases ``refs`` refer to (never keeping one alive)."""
        found = set()
        for ref in refs:
            held = getattr(ref(), "_held", None)
            if held is not None and held.lease is not None:
                found.add(held.lease)
        return found

    def lapse_wait(self) -> float:
        lapses = [at for _, _, at in self.kept if at < math.inf]
        return SETTLE_S + max(0.0, max(lapses, default=0.0) - time.monotonic())

    def stray_leases(self, fleet: Any, upstream: str, allowed: set[str]) -> list[str]:
        """The fleet's in-flight leases in force that no live lease, one not lapsed
        yet, a dead member's or one of ``allowed`` accounts for."""
        now = time.monotonic()
        ok = set(allowed)
        for _, lease, lapse_at in self.kept:
            if lease._held is not None and lease._held.lease and (lapse_at > now):
                ok.add(lease._held.lease)
        for lease in self.corpses:
            if lease._held is not None and lease._held.lease:
                ok.add(lease._held.lease)
        secs, micros = self.admin.time()
        ids = self.admin.zrangebyscore(fleet.keys.leases(upstream), secs + micros / 1e6, "+inf")
        stray = {bytes(i).decode() for i in ids} - ok
        return (
            [f"{len(stray)} fleet lease(s) no lease accounts for: {sorted(stray)}"] if stray else []
        )

    def collect_while_waiting(self) -> None:
        """A member whose window is full with a lease dropped in a cycle among its slots:
        a call waiting for a slot collects, and gets one at once."""
        for gate in self.members:
            mine = [ref for member, ref in self.cycled if member is gate and ref() is not None]
            window = gate._core.upstreams[0].window
            if not mine or window.inflight < window.limit:
                continue
            kept = sum(1 for _, lease, _ in self.kept if not lease.released)
            if kept + len(self.corpses) >= self.cap:
                continue  # the fleet has no lease for it, dropped or not
            # What earlier rules' collections spent of the collector's share of the wall
            # time is not this call's to wait out: it must collect now.
            _dropped.COLLECTOR._next = dict.fromkeys(_dropped.COLLECTOR._next, 0.0)
            _dropped.COLLECTOR._spacing = 1
            start = time.monotonic()
            try:
                gate.call_sync(lambda: "ok", cost=Cost(1, 0), timeout=SETTLE_S)
            except YieldgateError as exc:
                raise AssertionError(
                    f"a call waited {time.monotonic() - start:.2f} s for a slot held by a "
                    f"lease dropped in a cycle: {exc!r}"
                ) from exc
        self.dropped += [ref for _, ref in self.cycled]  # then collected like the others
        self.cycled.clear()


@pytest.fixture(scope="module")
def slow_link(redis_server: RedisServer) -> Iterator[DelayProxy]:
    with DelayProxy(redis_server.port, 0.02) as proxy:
        yield proxy


def test_a_fleet_holds_nothing_when_nothing_runs(
    redis_server: RedisServer, slow_link: DelayProxy
) -> None:
    class Machine(FleetMachine):
        redis = redis_server
        slow_url = slow_link.url

    run_state_machine_as_test(Machine, settings=SETTINGS)
