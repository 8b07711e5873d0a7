"""``HarnessConfig``: the engine, and what the harness backend adds around it.

Validated whole at construction: the KV cache must hold the warm-up
(``WARMUP_TOKENS`` generated after a one-token prompt), degradation needs a
TTFT objective for a degraded priority (``degrade_objective``, the tightest
of them, which the backend also holds pressure to), and the planner's range
must include the starting prefill workers. Apart from ``backend`` (which
re-exports it): the backend's code runs the engine; this only describes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from yieldgate.harness.degrade import DegradeConfig
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.planner import PlannerConfig
from yieldgate.harness.prefill_worker import WorkerSpec, prefill_worker_blocks
from yieldgate.harness.qos import SloConfig
from yieldgate.harness.router import RouterConfig

__all__ = ["WARMUP_TOKENS", "HarnessConfig", "degrade_objective"]

# Tokens the warm-up generates (``HarnessBackend`` warms the engine before serving).
WARMUP_TOKENS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessConfig:
    """The engine plus what the backend adds around it.

    ``expected_load_s`` is the cold-start estimate clients are told while the
    model loads and warms up (the default model takes about 0.25 s on one CPU
    thread); ``torch_threads`` is set for the whole process. ``degrade``
    turns on graceful degradation (it needs a TTFT objective in ``slo`` for a
    degraded priority); ``planner`` turns on the planner (it may start prefill
    workers even from ``prefill_workers=0``).
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    default_max_tokens: int = 16
    torch_threads: int = 1
    expected_load_s: float = 0.5
    prefill_workers: int = 0
    router: RouterConfig | Path = field(default_factory=RouterConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    qos: bool = False
    degrade: DegradeConfig | None = None
    planner: PlannerConfig | None = None
    worker_timeout_s: float = 60.0
    # Testing only: the prefill workers corrupt this many of their first KV transfers.
    corrupt_transfers: int = 0

    def __post_init__(self) -> None:
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if self.torch_threads < 1:
            raise ValueError("torch_threads must be >= 1")
        if not (self.expected_load_s >= 0 and math.isfinite(self.expected_load_s)):
            raise ValueError("expected_load_s must be a finite number >= 0")
        if self.prefill_workers < 0:
            raise ValueError("prefill_workers must be >= 0")
        engine = self.engine
        if engine.num_blocks * engine.block_size <= WARMUP_TOKENS:
            raise ValueError(
                f"a KV cache of {engine.num_blocks} blocks of {engine.block_size} tokens cannot "
                f"hold a one-token prompt and the {WARMUP_TOKENS} tokens the warm-up generates: "
                "raise --kv-blocks or --block-size"
            )
        if not (self.worker_timeout_s > 0 and math.isfinite(self.worker_timeout_s)):
            raise ValueError("worker_timeout_s must be a positive number")
        if self.degrade is not None and degrade_objective(self.degrade, self.slo) is None:
            raise ValueError("degrade needs a TTFT objective in slo for a degraded priority")
        if self.planner is not None and not (
            self.planner.min_prefill_workers
            <= self.prefill_workers
            <= self.planner.max_prefill_workers
        ):
            raise ValueError("prefill_workers must be within the planner's min and max")

    def worker_spec(self, max_prompt_tokens: int) -> WorkerSpec:
        """The prefill workers' spec; the engine's ``max_prompt_tokens`` sizes their KV pool."""
        engine = self.engine
        model = {name: getattr(engine.model, name) for name in engine.model.__dataclass_fields__}
        return WorkerSpec(
            model=model,
            checkpoint=str(engine.checkpoint) if engine.checkpoint else None,
            device=engine.device,
            num_blocks=prefill_worker_blocks(
                max_prompt_tokens, engine.block_size, engine.num_blocks
            ),
            block_size=engine.block_size,
            max_batch_tokens=engine.scheduler.max_num_batched_tokens,
            torch_threads=self.torch_threads,
            timeout_s=self.worker_timeout_s,
            corrupt_first=self.corrupt_transfers,
            dtype=engine.dtype,
            host_prefix_blocks=engine.host_prefix_blocks,
        )


def degrade_objective(config: DegradeConfig, slo: SloConfig) -> float | None:
    """The tightest TTFT objective among the degraded priorities: pressure is held to it."""
    objectives = [slo.ttft_for(p) for p in config.priorities]
    present = [o for o in objectives if o is not None]
    return min(present) if present else None
