"""One prefill worker's jobs as the pool sees them: sent to it, or held back by priority.

A prefill worker prefills the jobs it has in arrival order, so a job sent
to it cannot be overtaken. With priority on, ``PrefillPool`` therefore sends
a worker only about two batches of prompt tokens at a time (its window: one
batch computing, one waiting to be batched next, so the worker never idles
between batches) and holds the rest in a ``JobQueue``, sending the next one
as each finishes: high before normal before low (``Sequence.rank``), arrival
order (request id) within a priority, and a job passed over by
``age_bound`` sends to its worker goes as if it were high.

Not thread-safe: the pool calls it with the worker's lock held.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeldJob", "JobQueue"]


@dataclass(slots=True)
class HeldJob:
    """A prefill job not sent yet: what its message needs, its rank and its age."""

    request_id: int
    tokens: list[int]
    start: int
    rank: int
    sends_at: int  # the queue's ``sends`` when it was held: its age counts from there

    def message(self) -> dict[str, object]:
        """The ``prefill`` control message for the worker."""
        return {"op": "prefill", "id": self.request_id, "tokens": self.tokens, "start": self.start}


class JobQueue:
    """The jobs sent to one worker (id -> prompt tokens to prefill) and those held back."""

    __slots__ = ("held", "sends", "sent")

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}
        self.held: list[tuple[HeldJob, int]] = []  # with each one's prompt tokens
        self.sends = 0

    @property
    def sent_tokens(self) -> int:
        return sum(self.sent.values())

    def mark_sent(self, request_id: int, tokens: int) -> None:
        """A job sent at once (priority off, or chosen by ``next_to_send``)."""
        self.sent[request_id] = tokens
        self.sends += 1

    def hold(self, request_id: int, prompt: list[int], start: int, rank: int) -> None:
        job = HeldJob(request_id, prompt, start, rank, self.sends)
        self.held.append((job, len(prompt) - 1 - start))

    def next_to_send(self, age_bound: int, window_tokens: int) -> HeldJob | None:
        """The held job to send now (recorded as sent), or ``None`` while the window is full.

        At least one job is always in flight, however long.
        """
        if not self.held:
            return None
        horizon = self.sends - age_bound
        entry = min(
            self.held,
            key=lambda e: (0 if e[0].sends_at <= horizon else e[0].rank, e[0].request_id),
        )
        job, tokens = entry
        if self.sent and self.sent_tokens + tokens > window_tokens:
            return None
        self.held.remove(entry)
        self.mark_sent(job.request_id, tokens)
        return job

    def remove(self, request_id: int) -> bool:
        """Forget a job, sent or held; whether it was held (never sent)."""
        self.sent.pop(request_id, None)
        for entry in self.held:
            if entry[0].request_id == request_id:
                self.held.remove(entry)
                return True
        return False

    def is_held(self, request_id: int) -> bool:
        return any(job.request_id == request_id for job, _ in self.held)

    def queued_for(self, rank: int, age_bound: int | None = None) -> tuple[int, int]:
        """Jobs and prompt tokens a new job of ``rank`` would wait behind: every one
        sent, and those held of the same or a higher priority (with ``age_bound``,
        a held job passed over that many sends counts as high, as ``next_to_send``
        sends it)."""
        return self.ahead(age_bound)[rank]

    def ahead(self, age_bound: int | None = None) -> tuple[tuple[int, int], ...]:
        """``queued_for`` of ranks 0, 1 and 2 in one pass.

        Lock-free for the engine thread, which reads it every step: it works
        on a copy of ``held`` and reads ``sent`` once, so a link thread that
        changes them meanwhile makes the figures at most one job stale.
        """
        held = list(self.held)
        sent = list(self.sent.values())
        horizon = self.sends - age_bound if age_bound is not None else None
        jobs = [len(sent), 0, 0]
        tokens = [sum(sent), 0, 0]
        for job, count in held:
            rank = 0 if horizon is not None and job.sends_at <= horizon else job.rank
            jobs[rank] += 1
            tokens[rank] += count
        return (
            (jobs[0], tokens[0]),
            (jobs[0] + jobs[1], tokens[0] + tokens[1]),
            (sum(jobs), sum(tokens)),
        )

    def clear(self) -> None:
        self.sent.clear()
        self.held.clear()
