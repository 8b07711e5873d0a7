"""The tiny decoder-only transformer the harness serves.

Byte-level (a vocabulary of 256, so there is no tokenizer to download),
pre-norm blocks with learned absolute positions, weights drawn from a seeded
generator on the CPU (so CPU and CUDA start from the same numbers) or loaded
from a small checkpoint. Two ways to run it:

- ``forward_paged``: the engine's path. New tokens of several sequences are
  flattened into one batch; each layer writes their keys and values into the
  paged KV cache and attends over the cache through the block tables
  (``AttentionBatch``, built by the model runner).
- ``forward_full``: a plain causal forward pass over a whole sequence, with no
  cache. It is the reference the cached path is tested against.

Its shape, ``ModelConfig``, is ``_model_config``; the paged cache, ``KVCache``
(float or int8), is ``_kv_cache``. Both are re-exported here.
"""

from __future__ import annotations

import math
import pickle  # only for its error type: torch.load(weights_only=True) refuses code
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from yieldgate.harness._attention_batch import AttentionBatch
from yieldgate.harness._kv_cache import KVCache
from yieldgate.harness._model_config import ModelConfig
from yieldgate.harness._resident import ResidentStep

__all__ = [
    "AttentionBatch",
    "KVCache",
    "ModelConfig",
    "TinyTransformer",
    "load_checkpoint",
    "save_checkpoint",
]


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, config.d_ff)
        self.down = nn.Linear(config.d_ff, d)

    def _mlp(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(F.gelu(self.up(self.ln2(x))))
        return out

    def forward_full(self, x: Tensor) -> Tensor:
        # x: (T, d) for one sequence
        t = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(t, 3, self.n_heads, self.head_dim).unbind(1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )
        x = x + self.proj(out.transpose(0, 1).reshape(t, -1))
        return x + self._mlp(x)

    def forward_paged(self, x: Tensor, layer: int, cache: KVCache, batch: AttentionBatch) -> Tensor:
        # x: (N, d), the new tokens of every sequence in the batch, flattened
        if batch.resident is not None:
            return self._forward_resident(x, layer, cache, batch.resident, batch.slot_mapping)
        n = x.shape[0]
        qkv = self.qkv(self.ln1(x)).view(n, 3, self.n_heads, self.head_dim)
        if cache.quantized:
            q, k, v = qkv.unbind(1)
            return self._forward_paged_quantized(x, q, k, v, layer, cache, batch)
        # Half KV for a float32 model: attention in the half dtype (else as it is).
        q, k, v = qkv.to(cache.k.dtype).unbind(1)
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        k_cache.index_copy_(0, batch.slot_mapping, k)
        v_cache.index_copy_(0, batch.slot_mapping, v)
        if batch.is_prefill:
            out = self._attend_prefill(q, k, v, k_cache, v_cache, batch)
        elif batch.query_index is not None:
            out = self._attend_multi(q, k_cache, v_cache, batch)
        else:
            out = self._attend_decode(q, layer, cache, batch)
        x = x + self.proj(out.to(x.dtype))
        return x + self._mlp(x)

    def _forward_resident(
        self, x: Tensor, layer: int, cache: KVCache, step: ResidentStep, slots: Tensor
    ) -> Tensor:
        # A decode step over resident rows (``_resident``), a CPU's hot path: the
        # arithmetic of ``forward_paged``'s by block, with the modules' functions
        # called directly (no module dispatch) and the mask made float once a step.
        n = x.shape[0]
        ln1, ln2, qkv_, proj, up, down = self.ln1, self.ln2, self.qkv, self.proj, self.up, self.down
        h = F.layer_norm(x, ln1.normalized_shape, ln1.weight, ln1.bias, ln1.eps)
        qkv = F.linear(h, qkv_.weight, qkv_.bias).view(n, 3, self.n_heads, self.head_dim)
        qkv = qkv.to(cache.k.dtype)  # half KV for a float32 model: attention in it (else as is)
        cache.k[layer].index_copy_(0, slots, qkv[:, 1])
        cache.v[layer].index_copy_(0, slots, qkv[:, 2])
        step.write(layer, qkv[:, 1:])
        k, v = step.keys_values(layer)
        out = F.scaled_dot_product_attention(qkv[:, 0].unsqueeze(2), k, v, attn_mask=step.mask)
        x = x + F.linear(out.reshape(n, -1).to(x.dtype), proj.weight, proj.bias)
        h = F.layer_norm(x, ln2.normalized_shape, ln2.weight, ln2.bias, ln2.eps)
        return x + F.linear(F.gelu(F.linear(h, up.weight, up.bias)), down.weight, down.bias)

    def _forward_paged_quantized(
        self,
        x: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        cache: KVCache,
        batch: AttentionBatch,
    ) -> Tensor:
        # int8 cache: every query attends over the dequantised cache, never over
        # the fresh float keys, so that a prefill sees what decode would see
        # (``_attend_prefill_int8``).
        if batch.is_prefill:
            out = self._attend_prefill_int8(q, k, v, layer, cache, batch)
        else:
            cache.write(layer, batch.slot_mapping, k, v, one_per_block=True)
            out = self._attend_decode_int8(q, layer, cache, batch)
        x = x + self.proj(out)
        return x + self._mlp(x)

    def _attend_prefill_int8(
        self, q: Tensor, k: Tensor, v: Tensor, layer: int, cache: KVCache, batch: AttentionBatch
    ) -> Tensor:
        # A cold prefill, a prefix-cache hit and a recompute must compute the same
        # KV for the same tokens, so every query reads the dequantised cache. A
        # recompute's output tokens (``num_stepwise``) were written by decode one
        # at a time, each growing its block's scale (and requantising the block)
        # before it was attended over: they are written and attended here in that
        # order too, so the recomputed int8 KV is the KV decode wrote. That costs
        # a write and a read per recomputed token and layer; a plain prompt has none.
        starts, cached, contexts = batch.query_starts, batch.num_cached, batch.context_slots
        assert starts is not None
        assert cached is not None
        assert isinstance(contexts, list)
        stepwise = batch.num_stepwise or [0] * len(contexts)
        if any(stepwise):
            head = [torch.arange(starts[j], starts[j + 1] - n) for j, n in enumerate(stepwise)]
            rows = torch.cat(head).to(q.device)
            cache.write(layer, batch.slot_mapping[rows], k[rows], v[rows])
        else:
            cache.write(layer, batch.slot_mapping, k, v)
        outs = []
        for j, slots in enumerate(contexts):
            lo, mid, hi = starts[j], starts[j + 1] - stepwise[j], starts[j + 1]
            if mid > lo:  # the prompt (or what a plain prefill computes): one write, causal
                kj, vj = cache.read(layer, slots[: cached[j] + mid - lo])
                rows_at = torch.arange(mid - lo, device=q.device).unsqueeze(1) + cached[j]
                cols = torch.arange(kj.shape[0], device=q.device).unsqueeze(0)
                oj = F.scaled_dot_product_attention(
                    q[lo:mid].transpose(0, 1),
                    kj.transpose(0, 1),
                    vj.transpose(0, 1),
                    attn_mask=cols <= rows_at,
                )
                outs.append(oj.transpose(0, 1).reshape(mid - lo, -1))
            for i in range(mid, hi):  # decode's tokens, one at a time, in order
                at = cached[j] + i - lo
                cache.write(
                    layer, slots[at : at + 1], k[i : i + 1], v[i : i + 1], one_per_block=True
                )
                one = _one_decode(slots, at, cache.block_size)
                outs.append(self._attend_decode_int8(q[i : i + 1], layer, cache, one))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _attend_decode_int8(
        self, q: Tensor, layer: int, cache: KVCache, batch: AttentionBatch
    ) -> Tensor:
        # The scales are per key, so they are applied to the scores and the
        # probabilities ((B, H, 1, L) each) rather than to the keys and values
        # (D times larger): the cache's int8 values are only converted, to the
        # model's dtype (exact: every int8 value is a bfloat16 and a float16).
        # By block (a decode step), the int8 blocks are gathered, transposed and
        # converted in one copy into a buffer the cache keeps
        # (``_attend_blocks_int8``); by slot, or with ``INT8_BEFORE_ISSUE_42``
        # (the path before issue 42), transposed and converted by two fresh copies.
        assert batch.context_mask is not None
        b, size = q.shape[0], cache.block_size
        dtype = q.dtype
        if batch.context_blocks is not None and not INT8_BEFORE_ISSUE_42:
            return self._attend_blocks_int8(
                q, layer, cache, batch.context_blocks, batch.context_mask
            )
        gathered = _gather_context(cache, layer, batch)
        k, v = (t.transpose(1, 2).contiguous().to(dtype) for t in gathered)
        length = k.shape[2]
        if batch.context_blocks is not None:
            blocks = batch.context_blocks.reshape(-1)
            scales = cache.kv_scale[layer].index_select(0, blocks).to(dtype)
            # A block's scale for each of its slots: (B, blocks, 1, 2, H) to (B, L, 2, H).
            scales = scales.view(b, -1, 1, 2, self.n_heads).expand(-1, -1, size, -1, -1)
        else:
            assert isinstance(batch.context_slots, Tensor)
            blocks = torch.div(batch.context_slots.reshape(-1), size, rounding_mode="floor")
            scales = cache.kv_scale[layer].index_select(0, blocks).to(dtype)
        scales = scales.reshape(b, length, 2, self.n_heads)
        k_scale = scales[:, :, 0].transpose(1, 2).unsqueeze(2)  # (B, H, 1, L)
        v_scale = scales[:, :, 1].transpose(1, 2).unsqueeze(2)
        scores = torch.matmul(q.unsqueeze(2), k.transpose(2, 3))  # (B, H, 1, L)
        scores = (scores * (k_scale / math.sqrt(self.head_dim))).masked_fill_(
            ~batch.context_mask, float("-inf")
        )
        probs = torch.softmax(scores, dim=-1) * v_scale
        out = torch.matmul(probs, v)  # (B, H, 1, D)
        return out.reshape(b, -1)

    def _attend_blocks_int8(
        self, q: Tensor, layer: int, cache: KVCache, blocks: Tensor, mask: Tensor
    ) -> Tensor:
        # The same arithmetic as by slot, so the same bits: the int8 values are
        # converted once, heads first, into one buffer the cache keeps
        # (``KVCache.converted``: keys, then values), and each block's scales are applied to
        # its run of scores and probabilities as they are, (B, H, blocks, 1)
        # against (B, H, blocks, block_size), never expanded to every slot.
        b, width = blocks.shape
        k8, v8 = cache.gather_blocks(layer, blocks)
        scales = cache.kv_scale[layer].index_select(0, blocks.reshape(-1)).to(q.dtype)
        scales = scales.view(b, width, 2, self.n_heads).permute(2, 0, 3, 1).unsqueeze(-1)
        k_scale = scales[0] / math.sqrt(self.head_dim)  # (B, H, blocks, 1)
        k = cache.converted(k8)
        scores = torch.matmul(q.unsqueeze(2), k.transpose(2, 3))  # (B, H, 1, L)
        scores = (scores.view(b, self.n_heads, width, -1) * k_scale).view(scores.shape)
        probs = torch.softmax(scores.masked_fill_(~mask, float("-inf")), dim=-1)
        probs = (probs.view(b, self.n_heads, width, -1) * scales[1]).view(probs.shape)
        v = cache.converted(v8)  # the same buffer as the keys: they are done with
        out = torch.matmul(probs, v)  # (B, H, 1, D)
        return out.reshape(b, -1)

    def _attend_prefill(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        batch: AttentionBatch,
    ) -> Tensor:
        assert batch.query_starts is not None
        assert batch.num_cached is not None
        assert batch.context_slots is not None
        outs = []
        starts = batch.query_starts
        for j, slots in enumerate(batch.context_slots):
            lo, hi = starts[j], starts[j + 1]
            qj = q[lo:hi].transpose(0, 1)
            cached = batch.num_cached[j]
            if cached == 0:
                # Nothing cached before this step: the fresh keys are the whole context.
                kj, vj = k[lo:hi].transpose(0, 1), v[lo:hi].transpose(0, 1)
                oj = F.scaled_dot_product_attention(qj, kj, vj, is_causal=True)
            else:
                kj = k_cache.index_select(0, slots).transpose(0, 1)
                vj = v_cache.index_select(0, slots).transpose(0, 1)
                # Query i sits at position cached + i and sees keys up to there.
                rows = torch.arange(hi - lo, device=q.device).unsqueeze(1) + cached
                cols = torch.arange(slots.shape[0], device=q.device).unsqueeze(0)
                oj = F.scaled_dot_product_attention(qj, kj, vj, attn_mask=cols <= rows)
            outs.append(oj.transpose(0, 1).reshape(hi - lo, -1))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _attend_decode(
        self, q: Tensor, layer: int, cache: KVCache, batch: AttentionBatch
    ) -> Tensor:
        assert batch.context_mask is not None
        b = q.shape[0]
        k, v = _gather_context(cache, layer, batch)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # (B, H, 1, D)
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=batch.context_mask,
        )
        return out.reshape(b, -1)

    def _attend_multi(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch
    ) -> Tensor:
        slots, mask, index = batch.context_slots, batch.context_mask, batch.query_index
        assert isinstance(slots, Tensor)
        assert mask is not None
        assert index is not None
        b, length = slots.shape
        queries = mask.shape[2]
        flat = slots.reshape(-1)
        k = k_cache.index_select(0, flat).view(b, length, self.n_heads, self.head_dim)
        v = v_cache.index_select(0, flat).view(b, length, self.n_heads, self.head_dim)
        grid = q.new_zeros(b * queries, self.n_heads, self.head_dim).index_copy_(0, index, q)
        out = F.scaled_dot_product_attention(
            grid.view(b, queries, self.n_heads, self.head_dim).transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
        )
        return out.transpose(1, 2).reshape(b * queries, -1).index_select(0, index)


# The int8 decode path before issue 42: the gathered int8 keys and values
# transposed, then converted, each by a fresh copy. Kept for measurement
# (``bench/harness_decode.py --compare``); when False a decode step by block
# takes ``_attend_blocks_int8`` (one copy into a kept buffer) instead.
INT8_BEFORE_ISSUE_42 = False


def _one_decode(slots: Tensor, at: int, block_size: int) -> AttentionBatch:
    """A decode batch of one row: the token at position ``at`` of a sequence whose
    context is ``slots`` (block-aligned, as a block table makes them), by block, as
    a decode step would attend over it."""
    width = at // block_size + 1
    blocks = torch.div(slots[: width * block_size : block_size], block_size, rounding_mode="floor")
    mask = torch.arange(width * block_size, device=slots.device) <= at
    return AttentionBatch(
        is_prefill=False,
        slot_mapping=slots[at : at + 1],
        context_slots=slots[: at + 1].unsqueeze(0),
        context_blocks=blocks.unsqueeze(0),
        context_mask=mask.view(1, 1, 1, -1),
    )


def _gather_context(cache: KVCache, layer: int, batch: AttentionBatch) -> tuple[Tensor, Tensor]:
    """A decode batch's context, each row's keys and values of ``layer`` as ``cache`` stores
    them: ``(rows, columns, H, D)`` each. By block (``KVCache.gather_blocks``: valid
    until the next gather) when the batch has ``context_blocks``, else by slot."""
    if batch.context_blocks is not None:
        return cache.gather_blocks(layer, batch.context_blocks)
    slots = batch.context_slots
    assert isinstance(slots, Tensor)
    rows, length = slots.shape
    k, v = (t.index_select(0, slots.reshape(-1)) for t in (cache.k[layer], cache.v[layer]))
    return k.view(rows, length, *k.shape[1:]), v.view(rows, length, *v.shape[1:])


_PRINTABLE = torch.tensor([10, *range(32, 127)])


class TinyTransformer(nn.Module):
    """A GPT-style byte model. Build it with ``ModelConfig``; weights come from ``config.seed``."""

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or ModelConfig()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_seq_len, config.d_model)
        layers = [_Block(config) for _ in range(config.n_layers)]
        self.blocks = nn.ModuleList(layers)
        self._layers = layers  # the same modules, typed
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)
        self.reset_parameters()
        self.requires_grad_(False)
        self.eval()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw every weight from ``config.seed`` on the CPU, whatever the device."""
        gen = torch.Generator(device="cpu").manual_seed(self.config.seed)
        # The residual projections are scaled down with depth, as GPT-2 does, so
        # that the stream stays well-conditioned; the head is drawn wide so that
        # greedy choices have clear margins (float noise never flips them).
        depth_scale = 1.0 / math.sqrt(2 * self.config.n_layers)
        for name, param in sorted(self.named_parameters()):
            if name == "head.bias":
                # Favour printable ASCII and newlines, so that what the random
                # weights write is legible text rather than arbitrary bytes.
                values = torch.zeros(param.shape)
                values[_PRINTABLE[param.shape[0] > _PRINTABLE]] = 6.0
            elif name.endswith("bias"):
                values = torch.zeros(param.shape)
            elif ".ln" in name or name.startswith("ln_"):
                values = torch.ones(param.shape)
            elif name.startswith("head"):
                values = torch.randn(param.shape, generator=gen) * 0.25
            elif name.endswith(("proj.weight", "down.weight")):
                values = torch.randn(param.shape, generator=gen) * 0.05 * depth_scale
            else:
                values = torch.randn(param.shape, generator=gen) * 0.05
            param.copy_(values.to(param.device, param.dtype))

    @torch.no_grad()
    def forward_full(self, tokens: Tensor) -> Tensor:
        """Logits at every position of one sequence ``tokens`` (shape ``(T,)``), no cache."""
        t = tokens.shape[0]
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than max_seq_len")
        positions = torch.arange(t, device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        for block in self._layers:
            x = block.forward_full(x)
        logits: Tensor = self.head(self.ln_f(x))
        return logits

    @torch.no_grad()
    def forward_paged(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache,
        batch: AttentionBatch,
        last_index: Tensor,
    ) -> Tensor:
        """Logits of the tokens at ``last_index`` (one per sequence) after writing the new KV."""
        if batch.resident is None and cache.resident is not None:
            cache.resident.drop_slots(batch.slot_mapping)  # rows built from what this writes
        x = self.embed(tokens) + self.pos(positions)
        for layer, block in enumerate(self._layers):
            x = block.forward_paged(x, layer, cache, batch)
        logits: Tensor = self.head(self.ln_f(x.index_select(0, last_index)))
        return logits

    @torch.no_grad()
    def greedy_reference(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation by a full forward pass per token: slow, and the ground truth."""
        device = self.head.weight.device
        tokens = list(prompt)
        out: list[int] = []
        for _ in range(max_tokens):
            logits = self.forward_full(torch.tensor(tokens, device=device))
            nxt = int(logits[-1].argmax())
            tokens.append(nxt)
            out.append(nxt)
        return out


def save_checkpoint(model: TinyTransformer, path: str | Path) -> None:
    """Write the config and weights to ``path`` (tensors and plain numbers only)."""
    cfg = model.config
    config = {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}
    torch.save({"config": config, "state_dict": model.state_dict()}, Path(path))


def load_checkpoint(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> TinyTransformer:
    """Load what ``save_checkpoint`` wrote, in ``dtype``. No pickle: ``weights_only`` only."""
    try:
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        why = "not a file that torch.load(weights_only=True) reads"
        raise ValueError(f"cannot load checkpoint {path}: {why}") from exc
    except (OSError, RuntimeError, EOFError, KeyError) as exc:
        # A file that is no checkpoint at all fails in any of these (KeyError: a stray opcode).
        first = str(exc).partition("\n")[0]
        raise ValueError(f"cannot load checkpoint {path}: {type(exc).__name__}: {first}") from exc
    if not isinstance(data, dict) or "config" not in data or "state_dict" not in data:
        raise ValueError(f"{path} is not a yieldgate harness checkpoint")
    try:
        config = ModelConfig(**data["config"])
    except TypeError as exc:
        raise ValueError(f"{path}: bad model config: {exc}") from exc
    model = TinyTransformer(config)
    try:
        model.load_state_dict(data["state_dict"])
    except RuntimeError as exc:
        raise ValueError(f"{path}: weights do not fit the config: {exc}") from exc
    return model.to(device=device, dtype=dtype)
