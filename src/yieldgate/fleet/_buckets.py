"""A fleet's quota buckets: ``take``, ``refund``, ``observe``, ``finished``, ``settle``,
``shapes``, and the first reading (``first``, ``probed``, ``abandon_first``).

The provider's request and token buckets, shared so that the fleet paces as
one, with the core's accounting of readings against sends not yet answered
(``unseen``). One of the groups of operations ``Fleet`` is made of.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from yieldgate.fleet._driver import Drivers, Op, check_count, check_number, read_flag, read_text
from yieldgate.fleet._records import BucketShape, FirstReading, Take

__all__ = ["BucketOps"]


class BucketOps(Drivers):
    """The quota buckets of a ``Fleet``."""

    def _take(self, upstream: str, wants: Sequence[tuple[str, float, float, float]]) -> Op[Take]:
        keys = [self.keys.seq(upstream)]
        args: list[float] = []
        for bucket, amount, limit, rate in wants:
            keys.append(self.keys.bucket(upstream, bucket))
            args += (
                check_number("amount", amount),
                check_number("limit", limit, positive=True),
                check_number("rate", rate),
            )

        def decode(raw: Any) -> Take:
            # Refused: each bucket that had no room, by its place in ``wants``.
            waits = tuple(
                (wants[int(raw[i]) - 1][0], float(raw[i + 1])) for i in range(3, len(raw) - 1, 2)
            )
            return Take(read_flag(raw[0]), int(raw[1]), float(raw[2]), waits)

        amounts = [(bucket, amount) for bucket, amount, _, _ in wants]

        def undo(take: Take) -> Op[bool] | None:
            return self._amounts("refund", upstream, amounts) if take.ok and amounts else None

        return Op("take", tuple(keys), tuple(args), decode, undo=undo)

    async def take(
        self, upstream: str, wants: Sequence[tuple[str, float, float, float]]
    ) -> Take | None:
        """Take ``amount`` from each bucket of ``wants`` (``(bucket, amount, limit, rate)``),
        all or nothing.

        Each bucket is refilled to now (Redis's time) at its rate, up to its
        limit; a missing one is created full, with the ``limit`` and ``rate``
        given (those of an existing bucket are its own, from the last
        ``observe``). If every amount fits, all are deducted and counted as
        unseen (in flight, not answered yet), and the take gets the
        upstream's next send number: ``Take(True, seq, 0.0)``. Otherwise
        nothing changes: ``Take(False, 0, wait_s, waits)``, the longest refill
        needed and, for each bucket that had no room, its own. Each amount
        stays unseen until ``observe`` applies a reading of its bucket for this
        take, or ``finished`` (answered without one) or ``refund`` (never
        sent) settles it. With no ``wants`` it only hands out a send number.
        """
        return await self._arun(self._take(upstream, wants))

    def take_sync(
        self, upstream: str, wants: Sequence[tuple[str, float, float, float]]
    ) -> Take | None:
        """``take``, blocking (within the budget)."""
        return self._run(self._take(upstream, wants))

    def _amounts(self, name: str, upstream: str, amounts: Sequence[tuple[str, float]]) -> Op[bool]:
        keys = tuple(self.keys.bucket(upstream, bucket) for bucket, _ in amounts)
        args = tuple(check_number("amount", amount) for _, amount in amounts)
        return Op(name, keys, args, read_flag)

    async def refund(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """Give back a take that was never sent: each bucket's level grows by its
        amount (up to its limit) and its unseen count shrinks by it."""
        return await self._arun(self._amounts("refund", upstream, amounts))

    def refund_sync(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """``refund``, blocking (within the budget)."""
        return self._run(self._amounts("refund", upstream, amounts))

    def _observe(
        self,
        upstream: str,
        bucket: str,
        limit: float,
        rate: float,
        remaining: float,
        amount: float,
        seq: int,
        resource: str | None,
        age_s: float | Callable[[], float] | None,
    ) -> Op[bool]:
        keys = (
            self.keys.seq(upstream),
            self.keys.bucket(upstream, bucket),
            self.keys.shapes(upstream),
        )
        if resource is not None and (not isinstance(resource, str) or not resource.isidentifier()):
            raise ValueError(f"a resource must be a name like 'tokens', got {resource!r}")
        args = (
            check_number("limit", limit, positive=True),
            check_number("rate", rate),
            check_number("remaining", remaining),
            check_number("amount", amount),
            check_count("seq", seq, least=0),
            bucket,
            resource or "",
            "" if age_s is None else check_number("age_s", age_s() if callable(age_s) else age_s),
        )
        return Op("observe", keys, args, read_flag)

    async def observe(
        self,
        upstream: str,
        bucket: str,
        *,
        limit: float,
        rate: float,
        remaining: float,
        amount: float,
        seq: int,
        resource: str | None = None,
        age_s: float | Callable[[], float] | None = None,
    ) -> bool | None:
        """Apply a response's reading of ``bucket``, for the take numbered ``seq``
        that took ``amount`` of it.

        The take is answered: unseen shrinks by ``amount`` (not below 0). The
        bucket's limit and rate become the reading's. The reading less what
        is still unseen (``remaining - unseen``) is the level if the reading is
        the newest send's; an older send's reading (answered late) may only
        lower the level. Which send is newest: with ``age_s`` (the seconds since
        the request was sent, as its member measures them; a callable is asked
        when the operation goes, however long it waited), the one sent last,
        on Redis's clock; without it, the highest ``seq``. The send's time is
        what matters: a take's number is given before the member waits for a
        window slot, and a send taken early and sent late, answered before a
        later reading is applied, must not make that reading look newer than it
        is (the level would be too high by its cost). A reading with ``seq`` 0
        (a send the fleet never numbered) is older than any. A missing bucket
        is created from the reading. With ``resource`` (what the bucket counts: ``"requests"``,
        ``"tokens"``...), the bucket's shape is recorded for ``shapes``.
        """
        op = self._observe(upstream, bucket, limit, rate, remaining, amount, seq, resource, age_s)
        return await self._arun(op)

    def observe_sync(
        self,
        upstream: str,
        bucket: str,
        *,
        limit: float,
        rate: float,
        remaining: float,
        amount: float,
        seq: int,
        resource: str | None = None,
        age_s: float | Callable[[], float] | None = None,
    ) -> bool | None:
        """``observe``, blocking (within the budget)."""
        op = self._observe(upstream, bucket, limit, rate, remaining, amount, seq, resource, age_s)
        return self._run(op)

    def _settle(self, upstream: str, corrections: Sequence[tuple[str, float]]) -> Op[bool]:
        keys = tuple(self.keys.bucket(upstream, bucket) for bucket, _ in corrections)
        args = []
        for _, delta in corrections:
            finite = isinstance(delta, int | float) and math.isfinite(delta)
            if isinstance(delta, bool) or not finite:
                raise ValueError(f"a correction must be a finite number, got {delta!r}")
            args.append(delta)
        return Op("settle", keys, tuple(args), read_flag)

    async def settle(self, upstream: str, corrections: Sequence[tuple[str, float]]) -> bool | None:
        """Correct buckets by what answered requests really used (``(bucket, delta)``:
        a positive delta gives back what was estimated and not used, up to the
        limit; a negative one takes what was used beyond it, the level possibly
        going below zero, so later takes wait for the refill). For the caller's own
        budgets, which no provider's reading corrects. A missing bucket is left alone."""
        return await self._arun(self._settle(upstream, corrections))

    def settle_sync(self, upstream: str, corrections: Sequence[tuple[str, float]]) -> bool | None:
        """``settle``, blocking (within the budget)."""
        return self._run(self._settle(upstream, corrections))

    def _shapes(self, upstream: str) -> Op[dict[str, BucketShape]]:
        return Op("shapes", (self.keys.shapes(upstream),), (), _read_shapes)

    def _first(self, upstream: str, ttl_s: float) -> Op[FirstReading]:
        def decode(raw: Any) -> FirstReading:
            return FirstReading(read_text(raw[0]), _read_shapes(raw[1:]))

        def undo(got: FirstReading) -> Op[bool] | None:
            return self._abandon_first(upstream) if got.state == "mine" else None

        keys = (self.keys.shapes(upstream), self.keys.first(upstream))
        ttl_ms = max(1, math.ceil(check_number("ttl_s", ttl_s, positive=True) * 1000))
        return Op("first", keys, (self.member, ttl_ms), decode, undo=undo)

    async def first(self, upstream: str, ttl_s: float) -> FirstReading | None:
        """For a member that has had no answer yet: the fleet's shapes if it knows them;
        else the one probe of the quota, taken for ``ttl_s`` by the first member to
        ask (``"mine"``: send one request, and tell its answer with ``probed``) while
        the others wait for its reading (``"other"``), or ``"none"`` once the probe's
        answer told no quota."""
        return await self._arun(self._first(upstream, ttl_s))

    def first_sync(self, upstream: str, ttl_s: float) -> FirstReading | None:
        """``first``, blocking (within the budget)."""
        return self._run(self._first(upstream, ttl_s))

    def _abandon_first(self, upstream: str) -> Op[bool]:
        return Op("abandon_first", (self.keys.first(upstream),), (self.member,), read_flag)

    async def abandon_first(self, upstream: str) -> bool | None:
        """This member's probe of the first reading ended without an answer (never
        sent, failed, cancelled): it goes back, and the next member to ask ``first``
        takes it (``True``), instead of every member waiting out its ``ttl_s``.
        Another member's probe, or a reading settled, is left as it is (``False``)."""
        return await self._arun(self._abandon_first(upstream))

    def abandon_first_sync(self, upstream: str) -> bool | None:
        """``abandon_first``, blocking (within the budget)."""
        return self._run(self._abandon_first(upstream))

    def _probed(
        self, upstream: str, shapes: Mapping[str, tuple[str, float, float]], ttl_s: float
    ) -> Op[bool]:
        ttl_ms = max(1, math.ceil(check_number("ttl_s", ttl_s, positive=True) * 1000))
        args: list[Any] = [self.member, ttl_ms]
        for bucket, (resource, limit, rate) in shapes.items():
            limit = check_number("limit", limit, positive=True)
            rate = check_number("rate", rate)
            args += (self.keys.check_bucket(bucket), f"{resource} {limit!r} {rate!r}")
        keys = (self.keys.shapes(upstream), self.keys.first(upstream))
        return Op("probed", keys, tuple(args), read_flag)

    async def probed(
        self, upstream: str, shapes: Mapping[str, tuple[str, float, float]], ttl_s: float
    ) -> bool | None:
        """This member's probe was answered: the buckets it taught (``shapes``: bucket
        -> its resource, limit and rate, as a ``BucketShape`` is), all
        written at once, for the members waiting in ``first``; none: the answer
        carried no quota, and for ``ttl_s`` members stop waiting for one."""
        return await self._arun(self._probed(upstream, shapes, ttl_s))

    def probed_sync(
        self, upstream: str, shapes: Mapping[str, tuple[str, float, float]], ttl_s: float
    ) -> bool | None:
        """``probed``, blocking (within the budget)."""
        return self._run(self._probed(upstream, shapes, ttl_s))

    async def shapes(self, upstream: str) -> dict[str, BucketShape] | None:
        """The buckets the fleet knows for ``upstream`` (bucket -> its resource, limit
        and rate, as last observed with a resource): what a member that has had no
        answer yet paces by, instead of sending blind."""
        return await self._arun(self._shapes(upstream))

    def shapes_sync(self, upstream: str) -> dict[str, BucketShape] | None:
        """``shapes``, blocking (within the budget)."""
        return self._run(self._shapes(upstream))

    async def finished(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """A take's request is over, and these amounts of it were settled by no
        reading (no answer, or an answer without a reading of those buckets): they
        are no longer unseen."""
        return await self._arun(self._amounts("finished", upstream, amounts))

    def finished_sync(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """``finished``, blocking (within the budget)."""
        return self._run(self._amounts("finished", upstream, amounts))


def _read_shapes(raw: Any) -> dict[str, BucketShape]:
    """An HGETALL of shapes: bucket -> "resource limit rate"."""
    shapes = {}
    for i in range(0, len(raw) - 1, 2):
        resource, limit, rate = read_text(raw[i + 1]).rsplit(" ", 2)
        shapes[read_text(raw[i])] = BucketShape(resource, float(limit), float(rate))
    return shapes
