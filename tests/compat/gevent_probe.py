"""The Gate's sync driver under gevent's monkey-patching, as Locust runs it.

Run as a script in its own process (``python tests/compat/gevent_probe.py
USERS CALLS``): it patches the process first, as ``import locust`` does, then
greenlets call one Gate's ``call_sync`` against a simulated upstream of
``SLOTS`` slots that answers ``yield`` (with a hint) when full. It prints one
JSON line: what the greenlets did and what the Gate counted.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402 - after the patching, as in a locustfile
import sys  # noqa: E402
import threading  # noqa: E402

import gevent  # noqa: E402

import yieldgate  # noqa: E402

SLOTS = 4


def main(users: int, calls: int) -> dict[str, object]:
    gate = yieldgate.Gate(yieldgate.GatePolicy(), name="gevent-probe")
    state = {"inflight": 0, "peak": 0, "busy": 0}

    def upstream() -> str:
        if state["inflight"] >= SLOTS:
            state["busy"] += 1
            return "busy"
        state["inflight"] += 1
        state["peak"] = max(state["peak"], state["inflight"])
        try:
            gevent.sleep(0.005)  # the patched time.sleep would do the same
            return "ok"
        finally:
            state["inflight"] -= 1

    def classify(value: object, error: BaseException | None) -> yieldgate.Outcome:
        if error is not None:
            return yieldgate.default_classify(None, error)
        if value == "busy":
            return yieldgate.Outcome.yielded(0.01, "busy")
        return yieldgate.Outcome.ok(value)

    def user() -> int:
        done = 0
        for _ in range(calls):
            gate.call_sync(upstream, classify=classify)
            done += 1
        return done

    greenlets = [gevent.spawn(user) for _ in range(users)]
    gevent.joinall(greenlets, timeout=120)
    stats = gate.statistics()
    return {
        "patched": monkey.is_module_patched("threading") and monkey.is_module_patched("time"),
        "event_class": f"{threading.Event.__module__}.{threading.Event.__qualname__}",
        "finished": [g.successful() for g in greenlets].count(True),
        "completed": sum(g.value or 0 for g in greenlets),
        "errors": [repr(g.exception) for g in greenlets if g.exception is not None],
        "peak": state["peak"],
        "busy": state["busy"],
        "calls_ok": stats.calls_ok,
        "attempts": stats.attempts,
        "yields": stats.yields,
        "retries": stats.retries,
        "window_limit": stats.window.limit,
        "inflight_after": stats.window.inflight,
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
