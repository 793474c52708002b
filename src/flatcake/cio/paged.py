"""Adapter over an engine's paged KV cache: blocks as opaque bytes, per layer.

The engine owns one tensor per layer whose block dimension holds ``num_blocks`` slots.
Two layouts are understood:

- ``"blocks"``:    ``(num_blocks, ...)``     one block = ``t[b]``, contiguous
  (e.g. FlashInfer ``(num_blocks, 2, block_size, heads, dim)``, MLA latents);
- ``"kv_blocks"``: ``(2, num_blocks, ...)``  one block = ``t[0, b]`` then ``t[1, b]``
  (K and V split along a leading dim, e.g. FlashAttention's
  ``(2, num_blocks, block_size, heads, dim)``). Contiguous, or *strided*: each half
  ``t[i, b]`` contiguous while the planes and the blocks in them lie further apart (one
  layer of a host pool that interleaves layers, e.g. SGLang's ``layer_first`` and
  ``page_first_direct``); ``block_stride`` and ``plane_stride`` give the distances.

Layers may differ in size (``KVGeometry.layer_block_bytes``): layers of one size share
one shape, and every layer has the same number of slots (the engine's block table is
one for all layers). Each layer then has its own block part and strides
(``layer_parts``); such layers must be contiguous.

FlatCake never interprets the bytes; it only gathers blocks into a contiguous segment
buffer (block-major within a layer) and scatters them back into the slots a block
table names, with ``index_select`` / ``index_copy_`` on ``uint8`` views.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

KV_LAYOUTS = ("auto", "blocks", "kv_blocks")

BlockIds = Sequence[int] | torch.Tensor
"""Paged KV slot ids, one per block: a ``range``, a list of ints or a 1-D integer tensor."""


def _per_block_bytes(t: torch.Tensor, layout: str) -> int:
    total = t.numel() * t.element_size()
    if layout == "blocks":
        return total // t.shape[0] if t.dim() >= 1 and t.shape[0] else -1
    if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1]:
        return total // t.shape[1]
    return -1


def _wide(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as int64 elements when its layout allows (last dim a multiple
    of 8 bytes, contiguous, 8-byte aligned), else ``t``. torch's index kernels
    (``index_select``, ``index_copy_``) move one element at a time, so moving 8-byte
    elements instead of bytes is several times faster. Same memory, no copy."""
    if t.dtype != torch.uint8 or t.dim() == 0 or t.shape[-1] % 8 or t.data_ptr() % 8:
        return t
    try:
        return t.view(torch.int64)
    except RuntimeError:
        return t


def _strided_kv(t: torch.Tensor) -> bool:
    """``t`` is ``(2, num_blocks, ...)`` with every block half ``t[i, b]`` contiguous and
    no two halves overlapping (V's plane after K's)."""
    if t.dim() < 3 or t.shape[0] != 2 or not t.shape[1] or not t[0, 0].is_contiguous():
        return False
    return t.stride(1) >= t[0, 0].numel() and t.stride(0) >= t.shape[1] * t.stride(1)


class PagedKV:
    """Byte-level view of ``kv_caches`` (one tensor per layer, same dtype and device; the
    same shape for layers of the same size).

    Not thread-safe by itself: the store scatters one layer from one thread at a time.
    """

    def __init__(self, kv_caches: Sequence[torch.Tensor],
                 layer_block_bytes: int | tuple[int, ...], kv_layout: str = "auto") -> None:
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        if isinstance(kv_caches, torch.Tensor) or len(kv_caches) == 0:
            raise ValueError("kv_caches must be a non-empty list of per-layer tensors, got "
                             f"{type(kv_caches).__name__}")
        sizes = (layer_block_bytes if isinstance(layer_block_bytes, tuple)
                 else (layer_block_bytes,) * len(kv_caches))
        if len(sizes) != len(kv_caches):
            raise ValueError(f"kv_caches has {len(kv_caches)} layers, the geometry "
                             f"{len(sizes)}")
        first = kv_caches[0]
        firsts = {b: kv_caches[sizes.index(b)] for b in sizes}
        for i, t in enumerate(kv_caches):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"kv_caches[{i}] must be a torch.Tensor, got {type(t).__name__}")
            first = firsts[sizes[i]]
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise ValueError(
                    f"kv_caches[{i}] has shape={tuple(t.shape)} dtype={t.dtype} "
                    f"device={t.device}; kv_caches[0] has shape={tuple(first.shape)} "
                    f"dtype={first.dtype} device={first.device}"
                )
            if not t.is_contiguous() and not (kv_layout != "blocks" and _strided_kv(t)):
                raise ValueError(f"kv_caches[{i}] must be contiguous (stride={t.stride()}), "
                                 f"or (2, num_blocks, ...) with contiguous block halves")
            if t.stride() != first.stride():
                raise ValueError(f"kv_caches[{i}] has stride={t.stride()}; kv_caches[0] "
                                 f"has stride={first.stride()}")
        first = kv_caches[0]
        if kv_layout == "auto" and not first.is_contiguous():
            kv_layout = "kv_blocks"
        if kv_layout == "auto":
            matches = [lay for lay in ("blocks", "kv_blocks")
                       if all(_per_block_bytes(t, lay) == b for b, t in firsts.items())]
            if len(matches) > 1:
                raise ValueError(
                    f"kv_layout='auto' is ambiguous for kv_caches shape {tuple(first.shape)}; "
                    "pass kv_layout='blocks' or 'kv_blocks'"
                )
            kv_layout = matches[0] if matches else "blocks"
        for b, t in firsts.items():
            per_block = _per_block_bytes(t, kv_layout)
            if per_block != b:
                raise ValueError(
                    f"kv_caches shape {tuple(t.shape)} dtype {t.dtype} (kv_layout="
                    f"{kv_layout!r}) holds {per_block} bytes per block, geometry "
                    f"block_bytes_per_layer={b}"
                )
            if t.dtype != first.dtype or t.device != first.device or \
                    t.shape[0 if kv_layout == "blocks" else 1] != \
                    first.shape[0 if kv_layout == "blocks" else 1]:
                raise ValueError(f"kv_caches of {b} B blocks ({tuple(t.shape)} {t.dtype} "
                                 f"{t.device}) differ from kv_caches[0] ({tuple(first.shape)}"
                                 f" {first.dtype} {first.device}) in slots, dtype or device")
        if len(firsts) > 1 and not all(t.is_contiguous() for t in kv_caches):
            raise ValueError("kv_caches whose layers differ in size must be contiguous")
        self.kv_layout = kv_layout
        self.num_layers = len(kv_caches)
        self.num_blocks = int(first.shape[0 if kv_layout == "blocks" else 1])
        self.layer_block_bytes = sizes
        self.uniform = len(firsts) == 1
        self.device = first.device
        if kv_layout == "blocks":
            # (num_blocks, block_bytes)
            self._views = [t.view(-1).view(torch.uint8).view(self.num_blocks, -1)
                           for t in kv_caches]
        else:
            # (2, num_blocks, block_bytes // 2), strided when the tensors are
            self._views = [t.view(2, self.num_blocks, -1).view(torch.uint8)
                           for t in kv_caches]
        self.contiguous = first.is_contiguous()
        # Per layer: bytes of one block half (K or V; the whole block for "blocks"), from
        # one block to the next, and from a K half to its V half (0 for "blocks").
        self.layer_parts = [
            (b // (1 if kv_layout == "blocks" else 2), int(v.stride(-2)),
             int(v.stride(0)) if kv_layout == "kv_blocks" else 0)
            for b, v in zip(sizes, self._views, strict=True)]
        # Layer 0's, the only ones when the layers are alike.
        self.part_bytes, self.block_stride, self.plane_stride = self.layer_parts[0]

    def layer_bytes(self) -> list[torch.Tensor]:
        """Each layer's memory as one flat ``uint8`` tensor (the same storage), from its
        first byte to its last. Strided planes: the span also covers other memory between
        the layer's block halves; address blocks only through ``block_stride`` and
        ``plane_stride``."""
        if self.contiguous:
            return [v.view(-1) for v in self._views]
        span = self.plane_stride + (self.num_blocks - 1) * self.block_stride + self.part_bytes
        return [torch.as_strided(v, (span,), (1,)) for v in self._views]

    def direct_io_refusal(self, align: int = 4096) -> str:
        """Why O_DIRECT commands cannot use this paged KV's slots as their buffers ("" when
        they can): every block part, stride and layer start must be ``align``-aligned.
        The rule zero-copy restores (``cio.zerocopy``) and writes (``cio.writer``) share."""
        for part, stride, plane in set(self.layer_parts):
            if part % align:
                return f"a block part of {part} bytes is not a multiple of {align}"
            if stride % align or plane % align:
                return f"the paged KV's block strides are not multiples of {align}"
        misaligned = [i for i, v in enumerate(self.layer_bytes()) if v.data_ptr() % align]
        if misaligned:
            return f"paged KV layer {misaligned[0]} is not {align}-aligned"
        return ""

    def block_table(self, block_ids: BlockIds, *, unique: bool,
                    name: str = "block_ids") -> torch.Tensor:
        """Validate slot ids: 1-D ints in ``[0, num_blocks)``; ``unique`` for scatter
        targets (two blocks into one slot is a caller bug). Returns int64 on ``device``."""
        ids = torch.as_tensor(block_ids)
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
        if ids.numel() and (ids.dtype.is_floating_point or ids.dtype == torch.bool):
            raise ValueError(f"{name} must hold integers, got dtype {ids.dtype}")
        ids = ids.to(dtype=torch.int64)
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.num_blocks:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{name} contains {bad}, outside [0, {self.num_blocks})")
            if unique and torch.unique(ids).numel() != ids.numel():
                raise ValueError(f"{name} repeats a slot id: {ids.tolist()}")
        return ids.to(self.device)

    def _head(self, layer: int, head: int) -> int:
        """``head`` checked: 0, or at most a block of ``layer`` in the ``blocks`` layout."""
        if head and (self.kv_layout != "blocks" or not
                     0 < head <= self.layer_block_bytes[layer]):
            raise ValueError(f"the first {head} bytes of a {self.layer_block_bytes[layer]} B "
                             f"block ({self.kv_layout!r} layout) cannot be moved alone")
        return head

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")

    def _check_buffer(self, buf: torch.Tensor, layer: int, n: int, name: str,
                      head: int = 0) -> None:
        want = n * (head or self.layer_block_bytes[layer])
        if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() != want:
            raise ValueError(f"{name} must be a 1-D uint8 tensor of {want} bytes, got "
                             f"dtype={buf.dtype} shape={tuple(buf.shape)}")

    def gather(self, layer: int, ids: torch.Tensor, out: torch.Tensor,
               head: int = 0) -> None:
        """Copy blocks ``ids`` of ``layer`` into ``out`` (``len(ids) *
        layer_block_bytes[layer]`` bytes, block-major), on any device; ``head``: only
        each block's first ``head`` bytes (a padded page's content; 0: all)."""
        self._check_layer(layer)
        n = int(ids.numel())
        self._check_buffer(out, layer, n, "gather output", self._head(layer, head))
        if n == 0:
            return
        src = self._views[layer]
        if head:
            out.view(n, head).copy_(src[:, :head].index_select(0, ids))
        elif self.kv_layout == "blocks":
            wide_src, wide_out = _wide(src), _wide(out.view(n, -1))
            if wide_src.dtype == wide_out.dtype:
                torch.index_select(wide_src, 0, ids, out=wide_out)  # (n, block_bytes)
            else:
                out.view(n, -1).copy_(src.index_select(0, ids))
        else:
            picked = src.index_select(1, ids)                       # (2, n, half)
            out.view(n, 2, -1).copy_(picked.permute(1, 0, 2))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def scatter(self, layer: int, ids: torch.Tensor, src: torch.Tensor,
                head: int = 0) -> None:
        """Copy ``src`` (block-major bytes of ``len(ids)`` blocks) into slots ``ids`` of
        ``layer``; ``head``: into each block's first ``head`` bytes only (the rest kept).
        Returns after the bytes are in place (CUDA streams synchronised), so the caller
        may reuse ``src``."""
        self._check_layer(layer)
        n = int(ids.numel())
        self._check_buffer(src, layer, n, "scatter source", self._head(layer, head))
        if n == 0:
            return
        data = src.to(self.device, non_blocking=True)
        dst = self._views[layer]
        if head:
            dst[:, :head].index_copy_(0, ids, data.view(n, head))
        elif self.kv_layout == "blocks":
            wide_dst, wide_data = _wide(dst), _wide(data.view(n, -1))
            if wide_dst.dtype == wide_data.dtype:
                wide_dst.index_copy_(0, ids, wide_data)
            else:
                dst.index_copy_(0, ids, data.view(n, -1))
        else:
            wide_dst, wide_data = _wide(dst), _wide(data.view(n, 2, -1))
            if wide_dst.dtype == wide_data.dtype:
                wide_dst.index_copy_(1, ids, wide_data.permute(1, 0, 2))
            else:
                dst.index_copy_(1, ids, data.view(n, 2, -1).permute(1, 0, 2))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
