"""``KVCache``: the keys and values of every layer, in blocks of slots, float or int8.

The paged storage the model's attention writes and reads (``model``); which
block belongs to which sequence is the block manager's. Stored as int8, each
block keeps one scale per layer and head for keys and one for values
(``_quantize_into``), and reads dequantise to the model's dtype (float32,
bfloat16 or float16: ``compute_dtype``). A float32 model may store its keys
and values in bfloat16 or float16, half the bytes, and attend in that dtype.
Apart from the model because it is storage and its quantisation: no layer,
no attention.
"""

from __future__ import annotations

import torch
from torch import Tensor

from yieldgate.harness._model_config import ModelConfig
from yieldgate.harness._resident import ResidentKV
from yieldgate.harness._sync import to_host

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of every layer, in ``num_blocks`` blocks of ``block_size`` slots.

    Slot ``s`` of layer ``l`` holds one token's key ``k[l, s]`` (``n_heads x
    head_dim``); block ``b`` owns slots ``b * block_size`` to ``(b + 1) *
    block_size - 1``. Which block belongs to which sequence is the block
    manager's business: the cache is only storage.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        # What the model computes in: float storage must be that dtype (keys are
        # copied in as they are); int8 dequantises into it.
        if compute_dtype is None:
            compute_dtype = torch.float32 if dtype == torch.int8 else dtype
        half = compute_dtype == torch.float32 and dtype in (torch.bfloat16, torch.float16)
        if dtype not in (torch.int8, compute_dtype) and not half:
            raise ValueError(
                f"a {dtype} KV cache for a {compute_dtype} model: store int8, the model's "
                "dtype, or half of a float32 model's"
            )
        self.compute_dtype = compute_dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (config.n_layers, num_blocks * block_size, config.n_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        # int8 storage (``dtype=torch.int8``): symmetric, one float32 scale per
        # layer, block and head for keys and one for values, dequantised on read.
        self.quantized = dtype == torch.int8
        heads = config.n_heads if self.quantized else 0  # no scales (no memory) for floats
        self.kv_scale = torch.zeros(
            (config.n_layers, num_blocks, 2, heads), device=device, dtype=torch.float32
        )
        # ``gather_blocks``' keys and values, kept between decode steps: a step
        # gathers each layer's whole context, and fresh tensors of that size cost
        # the allocator (pages mapped and zeroed) as much as the copy itself.
        self._gathered: tuple[Tensor, Tensor] | None = None
        # ``converted``'s keys or values in ``compute_dtype`` (int8 only), kept too.
        self._converted: Tensor | None = None
        # The stores seen a block at a time, (n_layers, num_blocks, block_size, H, D).
        blocked = (config.n_layers, num_blocks, block_size, config.n_heads, config.head_dim)
        self._k_blocks, self._v_blocks = self.k.view(blocked), self.v.view(blocked)
        # The decode batch's rows kept between steps (``use_resident``); None: gathered.
        self.resident: ResidentKV | None = None

    def use_resident(self, rows: int = 1) -> None:
        """Keep the decode batch's contexts resident between steps (float storage only),
        room for ``rows`` (the most a decode batch holds) made at once; never more rows
        x columns than this cache has slots (a step that needs more gathers)."""
        if self.quantized:
            raise ValueError("resident decode rows need a float KV cache")
        n_layers, _, heads, dim = self.k.shape
        self.resident = ResidentKV(
            n_layers=n_layers, n_heads=heads, head_dim=dim, block_size=self.block_size,
            dtype=self.k.dtype, device=self.k.device, rows=rows,
            limit=self.num_blocks * self.block_size,
        )  # fmt: skip

    @property
    def blocked(self) -> tuple[Tensor, Tensor]:
        """Keys and values a block at a time, ``(n_layers, num_blocks, block_size, H, D)`` views."""
        return self._k_blocks, self._v_blocks

    def written(self, slots: Tensor) -> None:
        """Something other than the model wrote ``slots``: resident rows built from them go."""
        if self.resident is not None:
            self.resident.drop_slots(slots)

    @property
    def k_scale(self) -> Tensor:
        """The keys' scales, ``(n_layers, num_blocks, n_heads)`` (a view of ``kv_scale``)."""
        return self.kv_scale[:, :, 0]

    @property
    def v_scale(self) -> Tensor:
        return self.kv_scale[:, :, 1]

    @property
    def bytes_per_block(self) -> int:
        per_slot = self.k[0, 0].numel() * self.k.element_size() * 2 * self.k.shape[0]
        scales = self.kv_scale[:, 0].numel() * self.kv_scale.element_size()
        return per_slot * self.block_size + scales

    def write(
        self, layer: int, slots: Tensor, k: Tensor, v: Tensor, *, one_per_block: bool = False
    ) -> None:
        """Store new keys and values ``(N, n_heads, head_dim)`` at ``slots`` of ``layer``.

        ``one_per_block``: no two of ``slots`` share a block (a decode step's
        tokens), which lets int8 skip grouping the tokens by block.
        """
        if not self.quantized:
            self.k[layer].index_copy_(0, slots, k)
            self.v[layer].index_copy_(0, slots, v)
            return
        _quantize_into(
            (self.k[layer], self.v[layer]),
            self.kv_scale[layer],
            slots,
            torch.stack((k, v), 1),
            self.block_size,
            one_per_block=one_per_block,
        )

    def gather_blocks(self, layer: int, blocks: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of ``layer`` in ``blocks`` ``(rows, width)``, as stored.

        Each is ``(rows, width * block_size, n_heads, head_dim)``: row ``r``
        holds every slot of its blocks, in order. Copied a whole block per index
        into buffers this cache keeps and reuses (grown, doubling, when a batch
        needs more), so the result is valid only until the next call: attend
        over it, or copy it, before gathering again.
        """
        rows, width = blocks.shape
        count = rows * width
        if self._gathered is None or self._gathered[0].shape[0] < count:
            grown = max(count, 2 * self._gathered[0].shape[0] if self._gathered else 0)
            shape = (grown, self.block_size, *self.k.shape[2:])
            device, dtype = self.k.device, self.k.dtype
            self._gathered = (
                torch.empty(shape, device=device, dtype=dtype),
                torch.empty(shape, device=device, dtype=dtype),
            )
        flat = blocks.reshape(-1)
        k_buffer, v_buffer = self._gathered
        k = torch.index_select(self._k_blocks[layer], 0, flat, out=k_buffer[:count])
        v = torch.index_select(self._v_blocks[layer], 0, flat, out=v_buffer[:count])
        shape = (rows, width * self.block_size, *self.k.shape[2:])
        return k.view(shape), v.view(shape)

    def converted(self, gathered: Tensor) -> Tensor:
        """``gather_blocks``' int8 keys or values, heads first, in ``compute_dtype``.

        ``(rows, n_heads, columns, head_dim)``, contiguous: the int8 values as
        they are (exact in float32, bfloat16 and float16), without their
        scales, for attention to apply per key to its scores or probabilities.
        Transposed and converted in one copy into one buffer this cache keeps,
        so the result is valid only until the next call: a decode layer
        converts its keys, computes the scores, then converts its values into
        the same memory: half the float bytes of keys and values together,
        more likely to stay in the core's cache.
        """
        size = gathered.numel()
        if self._converted is None or self._converted.numel() < size:
            grown = max(size, 2 * self._converted.numel() if self._converted is not None else 0)
            self._converted = torch.empty(grown, device=self.k.device, dtype=self.compute_dtype)
        rows, columns, heads, dim = gathered.shape
        out = self._converted[:size].view(rows, heads, columns, dim)
        return out.copy_(gathered.transpose(1, 2))

    def read(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values at ``slots`` of ``layer``, dequantised to ``compute_dtype`` if int8.

        The scale is applied in float32 and the product rounded once to the model's dtype.
        """
        if not self.quantized:
            return self.k[layer].index_select(0, slots), self.v[layer].index_select(0, slots)
        blocks = torch.div(slots, self.block_size, rounding_mode="floor")
        scales = self.kv_scale[layer].index_select(0, blocks).unsqueeze(-1)  # (N, 2, H, 1)
        k = self.k[layer].index_select(0, slots).float().mul_(scales[:, 0])
        v = self.v[layer].index_select(0, slots).float().mul_(scales[:, 1])
        return k.to(self.compute_dtype), v.to(self.compute_dtype)


_INT8_MAX = 127.0


def _quantize_into(
    stores: tuple[Tensor, Tensor],
    scale: Tensor,
    slots: Tensor,
    x: Tensor,
    block_size: int,
    *,
    one_per_block: bool,
) -> None:
    """Quantise keys and values ``x`` ``(N, 2, n_heads, head_dim)`` into ``stores`` at ``slots``.

    ``scale`` is ``(num_blocks, 2, n_heads)``: a block's scale is its largest
    magnitude so far over 127. A write at a block's first slot starts the
    block anew (its previous owner's values and scale are forgotten), so a
    block's contents and scale depend only on the tokens written into it, in
    order. When a new token is larger than an earlier token's scale allows,
    the block's earlier values are requantised to the grown scale. Only the
    touched blocks are read or written, so a page-in filling other blocks at
    the same time is safe.
    """
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    per_token = x.abs().amax(-1).float() / _INT8_MAX  # (N, 2, n_heads)
    fresh = slots % block_size == 0
    if one_per_block:
        restart, amax = fresh, per_token
    else:
        # Group by block: whether this write restarts it, and its largest new magnitude.
        num_blocks = scale.shape[0]
        restart = (
            torch.zeros(num_blocks, device=scale.device)
            .scatter_reduce_(0, blocks, fresh.float(), reduce="amax")
            .index_select(0, blocks)
            .bool()
        )
        index = blocks.view(-1, 1, 1).expand_as(per_token)
        amax = torch.zeros_like(scale).scatter_reduce_(0, index, per_token, reduce="amax")
        amax = amax.index_select(0, blocks)
    old = scale.index_select(0, blocks).masked_fill_(restart.view(-1, 1, 1), 0.0)
    new = torch.maximum(old, amax)  # (N, 2, n_heads), each token's block's
    grown = (new > old) & (old > 0)  # (N, 2, n_heads): quantised too finely so far
    if one_per_block:
        # Decode: every touched block is requantised, by 1 where its scale did not
        # grow (exact: int8 values times 1, rounded, are themselves). A block per
        # token costs less than the attention that reads the whole context, and
        # no host read of ``grown`` (a device sync each layer) decides it.
        ratio = torch.where(grown, old / new, 1.0)[:, :, None, :, None]
        _requantise(stores, scale.shape[0], block_size, blocks, ratio)
    elif to_host(grown.any())[0]:  # a prefill's write: most have nothing to requantise
        rows = blocks[grown.flatten(1).any(1)]
        ratio = torch.where(grown, old / new, 1.0)[grown.flatten(1).any(1)]
        _requantise(stores, scale.shape[0], block_size, rows, ratio[:, :, None, :, None])
    scale.index_copy_(0, blocks, new)
    safe = torch.where(new > 0, new, 1.0).unsqueeze(-1)
    q = torch.div(x, safe).round_().clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    for i, store in enumerate(stores):
        store.index_copy_(0, slots, q[:, i])


def _requantise(
    stores: tuple[Tensor, Tensor], num_blocks: int, block_size: int, rows: Tensor, ratio: Tensor
) -> None:
    """Scale blocks ``rows`` of ``stores`` by ``ratio`` ``(rows, 2, 1, n_heads, 1)``, rounded."""
    for i, store in enumerate(stores):
        blocked = store.view(num_blocks, block_size, *store.shape[1:])
        requantised = torch.mul(blocked.index_select(0, rows), ratio[:, i]).round_()
        blocked.index_copy_(0, rows, requantised.to(torch.int8))
