"""The engine: scheduler, block manager and model runner stepped together.

``Engine`` is synchronous and single-threaded: ``add`` sequences, call
``step`` until ``has_work`` is false. The server's backend runs it on a thread
of its own (``yieldgate.harness.backend``); tests and benchmarks drive it
directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yieldgate.harness._resident import resident_counters
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.kv_tiers import HostKVTier, TieredScheduler, tier_counters
from yieldgate.harness.model import KVCache, ModelConfig, TinyTransformer, load_checkpoint
from yieldgate.harness.prefix_tier import HostPrefixTier, PrefixPager, prefix_counters
from yieldgate.harness.qos import decode_steps_between_pieces, prefill_step_counts
from yieldgate.harness.runner import ModelRunner
from yieldgate.harness.scheduler import Batch, Scheduler, SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence, TokenLogprob
from yieldgate.harness.speculative import SpeculativeConfig, Speculator
from yieldgate.protocol import Priority

__all__ = ["DTYPES", "Engine", "EngineConfig", "StepResult", "pick_device"]

# Weight of the newest measurement in the step-time averages.
_EWMA_ALPHA = 0.2

# What the model's weights and activations may be (``EngineConfig.dtype``).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

# How the KV cache may store keys and values (``EngineConfig.kv_dtype``): ``auto``
# is the model's dtype; a float dtype must be the model's, or half of a float32
# model's (attention then runs in the half dtype, over half the bytes).
KV_DTYPES = ("auto", *DTYPES, "int8")


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else CPU. ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device")
    return device


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Everything the engine needs. ``num_blocks * block_size`` tokens of KV in all."""

    model: ModelConfig = field(default_factory=ModelConfig)
    checkpoint: Path | None = None
    device: str = "auto"
    num_blocks: int = 1024
    block_size: int = 16
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Speculative decoding of greedy sequences (``yieldgate.harness.speculative``); off when None.
    speculative: SpeculativeConfig | None = None
    # KV memory hierarchy (``kv_tiers``): host blocks that running sequences'
    # KV is paged out to when the device pool is full; 0 preempts by recompute.
    host_kv_blocks: int = 0
    # The model's weights and activations, and so attention: float32, bfloat16 or float16.
    dtype: str = "float32"
    # ``auto``: KV stored in ``dtype``. ``int8``: stored as int8 with a float32
    # scale per block and head (about 4x smaller than float32), dequantised
    # into ``dtype`` for attention.
    kv_dtype: str = "auto"
    # Prefix tier (``prefix_tier``): host blocks that cached prefix blocks evicted
    # from the device pool are kept in (LRU) and paged back from on a prefix hit;
    # 0 drops them.
    host_prefix_blocks: int = 0
    # Decode attends over each running sequence's context kept in place between
    # steps instead of gathered from the paged cache every step (``_resident``): a
    # second copy of the running KV for a step without the gather. None: on a
    # CPU with a float cache (there the gather costs more than attention).
    resident_kv: bool | None = None

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if self.host_kv_blocks < 0:
            raise ValueError("host_kv_blocks must be >= 0")
        if type(self.host_prefix_blocks) is not int or self.host_prefix_blocks < 0:
            raise ValueError(
                f"host_prefix_blocks must be an integer >= 0, got {self.host_prefix_blocks!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}"
            )
        half = self.dtype == "float32" and self.kv_dtype in ("bfloat16", "float16")
        if self.kv_dtype not in ("auto", "int8", self.dtype) and not half:
            raise ValueError(
                f"kv_dtype {self.kv_dtype} with dtype {self.dtype}: a float KV cache is "
                "in the model's dtype (auto), bfloat16 or float16 for a float32 model, or int8"
            )
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.resident_kv is not None and not isinstance(self.resident_kv, bool):
            raise ValueError(f"resident_kv must be None, True or False, got {self.resident_kv!r}")
        if self.resident_kv and self.kv_dtype == "int8":
            raise ValueError("resident_kv needs a float kv_dtype (int8 KV is converted as read)")
        if self.speculative is not None and self.kv_dtype == "int8":
            # A rejected draft's keys can raise a block's scale and requantise the
            # tokens already there: greedy output would no longer match plain decoding.
            raise ValueError("speculative decoding needs a float kv_dtype (int8 KV is lossy)")
        if self.speculative is not None and half:
            # Attention in half precision rounds its output: verifying several tokens
            # at once would not give plain decoding's greedy choices to the bit.
            raise ValueError("speculative decoding needs kv_dtype auto, not half precision")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")

    @property
    def kv_storage(self) -> str:
        """The KV cache's storage dtype by name: ``int8``, a half dtype or the model's ``dtype``."""
        return self.dtype if self.kv_dtype == "auto" else self.kv_dtype


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step: which sequences got a token (a piece of a chunked prefill gets none),
    which of them finished, how long it took.

    ``logprobs`` has one entry per token: its log-probability where its
    sequence asked for them (also appended to ``Sequence.logprobs``), else ``None``.
    """

    is_prefill: bool
    seqs: list[Sequence]
    tokens: list[int]
    finished: list[Sequence]
    duration_ms: float
    num_new_tokens: int
    logprobs: list[TokenLogprob | None] = field(default_factory=list)


class Engine:
    """A continuously batched, paged-KV engine over the tiny transformer."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.device = pick_device(config.device)
        dtype = DTYPES[config.dtype]
        if config.checkpoint is not None:
            model = load_checkpoint(config.checkpoint, self.device, dtype)
        else:
            # Drawn in float32 (``reset_parameters``), then rounded: every dtype starts alike.
            model = TinyTransformer(config.model).to(device=self.device, dtype=dtype)
        self.model = model
        self.cache = KVCache(
            model.config,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            device=self.device,
            dtype=torch.int8 if config.kv_storage == "int8" else DTYPES[config.kv_storage],
            compute_dtype=dtype,
        )
        resident = config.resident_kv
        if resident is None:
            resident = self.device.type == "cpu" and not self.cache.quantized
        if resident:
            self.cache.use_resident(config.scheduler.max_num_seqs)
        self.blocks = BlockManager(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(config.scheduler, self.blocks)
        self.kv_tier: HostKVTier | None = None
        if config.host_kv_blocks:
            self.kv_tier = HostKVTier(self.cache, config.host_kv_blocks)
            self.scheduler = TieredScheduler(config.scheduler, self.blocks, self.kv_tier)
        self.prefix_pager: PrefixPager | None = None
        if config.host_prefix_blocks:
            prefix_tier = HostPrefixTier(self.cache, config.host_prefix_blocks)
            self.prefix_pager = PrefixPager(prefix_tier, self.blocks, self.scheduler)
        self.runner = ModelRunner(model, self.cache)
        self._next_id = 0
        self.speculator: Speculator | None = None
        if config.speculative is not None:
            self.speculator = Speculator(
                config.speculative,
                model=model,
                cache=self.cache,
                blocks=self.blocks,
                scheduler=self.scheduler,
                runner=self.runner,
            )
        self.prefill_ms_per_token: float | None = None
        self.decode_step_ms: float | None = None
        self.reset_counters()

    def reset_counters(self) -> None:
        """Zero the counters (after a warm-up); the measured step times are kept."""
        self.num_steps = 0
        self.num_prefill_steps = 0
        self.num_decode_steps = 0
        self.prompt_tokens_computed = 0
        self.prefix_hit_tokens = 0
        self.tokens_generated = 0
        self.scheduler.num_preemptions = 0
        self.blocks.evictions = 0
        if self.speculator is not None:
            self.speculator.reset_counters()
        if isinstance(self.scheduler, TieredScheduler):
            self.scheduler.reset_counters()
        if self.prefix_pager is not None:
            self.prefix_pager.reset_counters()

    # -- requests -------------------------------------------------------------

    def check(self, num_prompt: int, params: SamplingParams) -> None:
        """Raise ``ValueError`` when a request of this shape could never run here."""
        if num_prompt < 1:
            raise ValueError("the prompt is empty")
        total = num_prompt + params.max_tokens
        # The last token is sampled and never fed back: it needs no position and no KV slot.
        needed = total - 1
        limit = self.model.config.max_seq_len
        if needed > limit:
            raise ValueError(
                f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"needs {needed} positions, more than the model's {limit}"
            )
        budget = self.config.scheduler.max_num_batched_tokens
        if num_prompt > budget:
            raise ValueError(
                f"prompt of {num_prompt} tokens is longer than max_num_batched_tokens ({budget})"
            )
        if self.blocks.blocks_for(needed) > self.blocks.num_blocks:
            raise ValueError(f"{needed} tokens of KV need more KV blocks than the cache has")

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt ``check`` accepts (with ``max_tokens`` 1)."""
        cfg = self.config
        return min(
            self.model.config.max_seq_len,
            cfg.scheduler.max_num_batched_tokens,
            cfg.num_blocks * cfg.block_size,
        )

    def add(
        self, prompt: list[int], params: SamplingParams, priority: Priority = Priority.NORMAL
    ) -> Sequence:
        """Queue a request; it joins the running batch at the next step that has room."""
        seq = self.create(prompt, params, priority)
        self.scheduler.add(seq)
        return seq

    def create(
        self, prompt: list[int], params: SamplingParams, priority: Priority = Priority.NORMAL
    ) -> Sequence:
        """A checked sequence, not scheduled yet: ``scheduler.add`` or ``reserve_remote`` it."""
        self.check(len(prompt), params)
        seq = Sequence(self._next_id, prompt, params, priority)
        self._next_id += 1
        return seq

    # -- disaggregated prefill ------------------------------------------------

    def reserve_remote(self, seq: Sequence) -> bool:
        """Allocate ``seq``'s blocks for a prefill worker to fill; ``False`` when none are free."""
        return self.scheduler.reserve_remote(seq)

    def write_kv(self, seq: Sequence, start: int, kv: torch.Tensor) -> None:
        """Put a prefill worker's KV for positions ``start..`` into ``seq``'s blocks.

        ``kv`` is ``(2, n_layers, tokens, n_heads, head_dim)``: keys then values.
        The sequence then prefills its remaining tokens here (usually the last
        one, whose logits give the first new token).
        """
        count = kv.shape[2]
        if start != seq.num_cached or start + count > len(seq.tokens) - 1:
            raise ValueError(f"KV for {start}..{start + count} does not fit {seq!r}")
        slots = self.runner.slots(seq, start + count)[start:]
        # A worker runs the same dtype; a cast here only guards a mismatched peer.
        kv = kv.to(
            self.device, self.cache.compute_dtype if self.cache.quantized else self.cache.k.dtype
        )
        if self.cache.quantized:
            for layer in range(self.model.config.n_layers):
                self.cache.write(layer, slots, kv[0, layer], kv[1, layer])
            self.scheduler.kv_arrived(seq, start + count)
            return
        self.cache.written(slots)
        for layer in range(self.model.config.n_layers):
            self.cache.k[layer].index_copy_(0, slots, kv[0, layer])
            self.cache.v[layer].index_copy_(0, slots, kv[1, layer])
        self.scheduler.kv_arrived(seq, start + count)

    def read_kv(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
        """A contiguous CPU copy of ``seq``'s KV for positions ``start..end - 1``."""
        slots = self.runner.slots(seq, end)[start:]
        if self.cache.quantized:
            layers = [self.cache.read(layer, slots) for layer in range(self.model.config.n_layers)]
            k, v = torch.stack([kv[0] for kv in layers]), torch.stack([kv[1] for kv in layers])
            return torch.stack((k, v)).cpu().contiguous()
        k = self.cache.k.index_select(1, slots)
        v = self.cache.v.index_select(1, slots)
        return torch.stack((k, v)).cpu().contiguous()

    def remote_failed(self, seq: Sequence) -> None:
        """The prefill worker could not deliver: prefill ``seq`` here instead."""
        self.scheduler.remote_failed(seq)

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq`` now, wherever it is, and free its KV blocks."""
        pager = self.prefix_pager
        if not seq.is_finished and (pager is None or not pager.abort(seq)):
            self.scheduler.abort(seq)
        self.runner.forget(seq)

    @property
    def has_work(self) -> bool:
        pager = self.prefix_pager
        return self.scheduler.has_work or (pager is not None and pager.has_work)

    # -- stepping -------------------------------------------------------------

    def step(self) -> StepResult | None:
        """Run one prefill or decode step; ``None`` when nothing is runnable."""
        pager = self.prefix_pager
        batch = pager.schedule() if pager is not None else self.scheduler.schedule()
        if batch is None:
            return None
        if self.speculator is not None and not batch.is_prefill:
            return self._step_speculative(self.speculator, batch)
        new_tokens = batch.num_new_tokens
        cached = sum(seq.num_cached for seq in batch.seqs) if batch.is_prefill else 0
        started = time.perf_counter()
        self.runner.logprobs = []
        tokens = self.runner.run(batch)
        duration_ms = (time.perf_counter() - started) * 1000.0
        logprobs = self.runner.logprobs or [None] * len(tokens)
        sampled = batch.sampled  # without the pieces of chunked prefills
        for seq, logprob in zip(sampled, logprobs, strict=True):
            if logprob is not None:
                seq.logprobs.append(logprob)
        finished = self.scheduler.finish_step(batch, tokens)
        for seq in finished:
            self.runner.forget(seq)
        self._account(batch, new_tokens, cached, duration_ms)
        return StepResult(
            is_prefill=batch.is_prefill,
            seqs=sampled,
            tokens=tokens,
            finished=finished,
            duration_ms=duration_ms,
            num_new_tokens=new_tokens,
            logprobs=logprobs,
        )

    def _step_speculative(self, speculator: Speculator, batch: Batch) -> StepResult:
        """A decode step through the speculator: each sequence may gain several tokens.

        The result lists a sequence once per token it gained, in order.
        ``decode_step_ms`` is kept per token gained (the step's time over the
        mean tokens per sequence), so the hints stay honest.
        """
        started = time.perf_counter()
        out = speculator.step(batch)
        duration_ms = (time.perf_counter() - started) * 1000.0
        seqs: list[Sequence] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob | None] = []
        for seq, kept, kept_logprobs in zip(batch.seqs, out.tokens, out.logprobs, strict=True):
            seqs += [seq] * len(kept)
            tokens += kept
            logprobs += kept_logprobs
            seq.logprobs += [entry for entry in kept_logprobs if entry is not None]
        for seq in out.finished:
            self.runner.forget(seq)
        self.num_steps += 1
        self.num_decode_steps += 1
        self.tokens_generated += len(tokens)
        self.decode_step_ms = _ewma(
            self.decode_step_ms, duration_ms * len(batch.seqs) / len(tokens)
        )
        return StepResult(
            is_prefill=False,
            seqs=seqs,
            tokens=tokens,
            finished=out.finished,
            duration_ms=duration_ms,
            num_new_tokens=len(tokens),
            logprobs=logprobs,
        )

    def _account(self, batch: Batch, new_tokens: int, cached: int, duration_ms: float) -> None:
        self.num_steps += 1
        self.tokens_generated += len(batch.sampled)
        if batch.is_prefill:
            self.num_prefill_steps += 1
            self.prompt_tokens_computed += new_tokens
            self.prefix_hit_tokens += cached
            # A few tokens (a prompt's last, its KV from a worker) are mostly a step's
            # fixed cost: once the average is set they do not move it (``qos``'s rule).
            average = self.prefill_ms_per_token
            chunk = self.scheduler.config.prefill_chunk
            if prefill_step_counts(new_tokens, chunk=chunk, averaged=average is not None):
                self.prefill_ms_per_token = _ewma(average, duration_ms / new_tokens)
        else:
            self.num_decode_steps += 1
            self.decode_step_ms = _ewma(self.decode_step_ms, duration_ms)

    def estimate_ms(
        self,
        num_prompt: int,
        max_tokens: int,
        *,
        steps_ahead: int | None = None,
        decoding: bool | None = None,
        on_engine: bool = True,
    ) -> float | None:
        """Expected time to serve a request of this shape at the current load.

        Its prefill, its decode steps, and the decode steps it waits before it
        can be admitted at all (``steps_ahead``, by default
        ``Scheduler.decode_steps_to_admit``: sequences swapped out to the host
        tier come back first). With ``prefill_chunk``, a prompt prefilled here
        (``on_engine``; not at a prefill worker) while others decode
        (``decoding``, by default whether any sequence runs) waits a decode
        step between two of its pieces. Another thread passes the figures the
        engine's thread published instead of reading the scheduler under it.
        """
        if self.prefill_ms_per_token is None or self.decode_step_ms is None:
            return None
        if steps_ahead is None:
            steps_ahead = self.scheduler.decode_steps_to_admit()
        if decoding is None:
            decoding = bool(self.scheduler.running)
        steps = max_tokens - 1 + steps_ahead
        if on_engine and decoding:
            steps += decode_steps_between_pieces(num_prompt, self.scheduler.config.prefill_chunk)
        return num_prompt * self.prefill_ms_per_token + steps * self.decode_step_ms

    def run_until_done(self, seqs: list[Sequence]) -> None:
        """Step until every one of ``seqs`` has finished (tests and benchmarks)."""
        while not all(seq.is_finished for seq in seqs):
            if self.step() is None:
                raise RuntimeError("the engine has unfinished sequences but nothing it can run")

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Run ``prompts`` side by side and return each one's output tokens."""
        seqs = [self.add(prompt, params) for prompt in prompts]
        self.run_until_done(seqs)
        return [seq.output for seq in seqs]

    def stats(self) -> dict[str, Any]:
        blocks = self.blocks.stats()
        return {
            "device": str(self.device),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "steps": self.num_steps,
            "prefill_steps": self.num_prefill_steps,
            "prefill_chunk": self.scheduler.config.prefill_chunk,
            "decode_steps": self.num_decode_steps,
            "prompt_tokens_computed": self.prompt_tokens_computed,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "tokens_generated": self.tokens_generated,
            "preemptions": self.scheduler.num_preemptions,
            "kv_blocks_total": blocks.num_blocks,
            "kv_blocks_used": blocks.num_used,
            "kv_blocks_cached": blocks.num_hashed,
            "kv_evictions": blocks.evictions,
            "prefill_ms_per_token": self.prefill_ms_per_token,
            "decode_step_ms": self.decode_step_ms,
            **self._kv_stats(),
        } | (self.speculator.stats() if self.speculator is not None else {})

    def _kv_stats(self) -> dict[str, Any]:
        """The KV storage and the host tier's counters (zeros when there is no tier)."""
        return {
            "dtype": self.config.dtype,
            "kv_dtype": self.config.kv_storage,
            "kv_bytes_per_block": self.cache.bytes_per_block,
            **resident_counters(self.cache.resident),
            **tier_counters(self.scheduler),
            **prefix_counters(self.prefix_pager),
        }


def _ewma(previous: float | None, value: float) -> float:
    return value if previous is None else previous + _EWMA_ALPHA * (value - previous)
