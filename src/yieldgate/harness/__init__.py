"""The GPU-worker harness: a tiny torch transformer served with continuous batching.

Needs the ``harness`` extra (torch). Nothing under ``yieldgate`` imports this
package unless asked: ``yieldgate serve --backend harness`` does, lazily.

- ``model``: the byte-level transformer and its paged attention.
- ``block_manager``: KV blocks, block tables, reference counts, prefix cache.
- ``scheduler``: continuous batching with preemption by recompute.
- ``runner``: batch to tensors, forward pass, sampling.
- ``engine``: the three stepped together (synchronous).
- ``speculative``: a draft of the target's first layers, verify and roll back.
- ``backend``: the engine on its own thread as a server backend.
- ``degrade``: graceful degradation by priority (sans-IO policy).
- ``planner``: moving capacity between prefill and decode (sans-IO policy);
  ``planner_driver`` applies its decisions to a running backend.
"""

from yieldgate.harness import _extra  # noqa: F401 - first: without torch, a clear error
from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.degrade import DegradeConfig, DegradeLevel
from yieldgate.harness.engine import Engine, EngineConfig, StepResult, pick_device
from yieldgate.harness.model import ModelConfig, TinyTransformer, load_checkpoint, save_checkpoint
from yieldgate.harness.planner import PlannerConfig
from yieldgate.harness.scheduler import Scheduler, SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence
from yieldgate.harness.speculative import SpeculativeConfig

__all__ = [
    "BlockManager",
    "DegradeConfig",
    "DegradeLevel",
    "Engine",
    "EngineConfig",
    "HarnessBackend",
    "HarnessConfig",
    "ModelConfig",
    "PlannerConfig",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "Sequence",
    "SpeculativeConfig",
    "StepResult",
    "TinyTransformer",
    "load_checkpoint",
    "pick_device",
    "save_checkpoint",
]
