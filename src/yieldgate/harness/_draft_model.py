"""``DraftModel``: the target's first layers and an exit head, distilled on the target.

Because its layers *are* the target's, the draft reads and writes the
target's paged KV cache and has no cache, prefill or weights of its own
beyond its head (a layer norm and a linear layer), which starts as a copy of
the target's and is fitted to the target's own greedy output (``distill``,
on continuations of random printable prompts run by ``_greedy_batch``).

Apart from ``speculative`` because it is a model, trained once at start-up;
the ``Speculator`` there only runs it, step after step.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from yieldgate.harness._speculative_config import SpeculativeConfig
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.model import AttentionBatch, KVCache, TinyTransformer
from yieldgate.harness.runner import ModelRunner
from yieldgate.harness.scheduler import Scheduler, SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence

__all__ = ["DraftModel"]

# Printable ASCII and newline: what the distillation prompts are drawn from.
_PRINTABLE = [10, *range(32, 127)]


class DraftModel(nn.Module):
    """The target's first ``num_layers`` layers plus an exit head of its own."""

    def __init__(self, target: TinyTransformer, num_layers: int) -> None:
        super().__init__()
        if not 0 <= num_layers < target.config.n_layers:
            raise ValueError(
                f"draft_layers must be in [0, {target.config.n_layers - 1}] "
                f"for a target of {target.config.n_layers} layers"
            )
        self.target = [target]  # a list: not registered as a submodule
        self.num_layers = num_layers
        d, vocab = target.config.d_model, target.config.vocab_size
        device, dtype = target.head.weight.device, target.head.weight.dtype
        self.ln = nn.LayerNorm(d, device=device, dtype=dtype)
        self.head = nn.Linear(d, vocab, device=device, dtype=dtype)
        with torch.no_grad():
            self.ln.load_state_dict(target.ln_f.state_dict())
            self.head.load_state_dict(target.head.state_dict())
        self.requires_grad_(False)
        self.eval()

    def _layers(self) -> list[Any]:
        return list(self.target[0].blocks)[: self.num_layers]

    @torch.no_grad()
    def forward_paged(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, batch: AttentionBatch
    ) -> Tensor:
        """Logits of every token of ``tokens`` (writes the first layers' KV into ``cache``)."""
        target = self.target[0]
        x = target.embed(tokens) + target.pos(positions)
        for layer, block in enumerate(self._layers()):
            x = block.forward_paged(x, layer, cache, batch)
        logits: Tensor = self.head(self.ln(x))
        return logits

    @torch.no_grad()
    def hidden_full(self, tokens: Tensor) -> Tensor:
        """The residual stream after the draft's layers, for one whole sequence (no cache)."""
        target = self.target[0]
        x = target.embed(tokens) + target.pos(torch.arange(tokens.shape[0], device=tokens.device))
        for block in self._layers():
            x = block.forward_full(x)
        out: Tensor = x
        return out

    def distill(self, config: SpeculativeConfig) -> dict[str, float]:
        """Fit the exit head to the target on its own greedy continuations of random prompts.

        Returns what it cost and gained: seconds, and the draft's top-1
        agreement with the target on those positions before and after.
        """
        started = time.perf_counter()
        target = self.target[0]
        device = target.head.weight.device
        gen = torch.Generator().manual_seed(config.distill_seed)
        printable = torch.tensor(_PRINTABLE)
        prompts = [
            printable[torch.randint(len(_PRINTABLE), (16,), generator=gen)].tolist()
            for _ in range(config.distill_sequences)
        ]
        outputs = _greedy_batch(target, prompts, config.distill_tokens)
        hidden, teacher = [], []
        for prompt, output in zip(prompts, outputs, strict=True):
            seq = torch.tensor(prompt + output, device=device)
            lo = len(prompt) - 1  # the positions whose next token the draft will propose
            hidden.append(self.hidden_full(seq)[lo:-1])
            teacher.append(target.forward_full(seq)[lo:-1])
        # Fitted in float32 whatever the model's dtype (Adam's small steps vanish in
        # bfloat16's 8-bit mantissa), then rounded back to it.
        dtype = self.head.weight.dtype
        self.float()
        x, y = torch.cat(hidden).float(), torch.cat(teacher).float()
        wanted = y.argmax(-1)
        before = self._agreement(x, wanted)
        soft = y.softmax(-1)
        params = [*self.ln.parameters(), *self.head.parameters()]
        with torch.enable_grad():
            for param in params:
                param.requires_grad_(True)
            optimiser = torch.optim.Adam(params, lr=3e-3)
            for _ in range(config.distill_steps):
                loss = F.cross_entropy(self.head(self.ln(x)), soft)
                optimiser.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimiser.step()
            for param in params:
                param.requires_grad_(False)
        after = self._agreement(x, wanted)
        self.to(dtype)
        return {
            "seconds": time.perf_counter() - started,
            "agreement_before": before,
            "agreement_after": after,
            "positions": float(x.shape[0]),
        }

    @torch.no_grad()
    def _agreement(self, hidden: Tensor, wanted: Tensor) -> float:
        return float((self.head(self.ln(hidden)).argmax(-1) == wanted).float().mean())


def _greedy_batch(
    model: TinyTransformer, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    """Greedy continuations of ``prompts`` side by side, on a paged cache of their own."""
    block_size = 16
    params = SamplingParams(max_tokens=max_tokens)
    per_seq = -(-(max(len(p) for p in prompts) + max_tokens) // block_size)
    cache = KVCache(
        model.config,
        num_blocks=per_seq * len(prompts),
        block_size=block_size,
        device=model.head.weight.device,
        dtype=model.head.weight.dtype,
    )
    blocks = BlockManager(cache.num_blocks, block_size)
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=len(prompts), max_num_batched_tokens=1 << 20, watermark=0.0),
        blocks,
    )
    runner = ModelRunner(model, cache)
    seqs = [Sequence(i, prompt, params) for i, prompt in enumerate(prompts)]
    for seq in seqs:
        scheduler.add(seq)
    while scheduler.has_work:
        batch = scheduler.schedule()
        if batch is None:
            raise RuntimeError("distillation: nothing schedulable")
        scheduler.finish_step(batch, runner.run(batch))
    return [seq.output for seq in seqs]
