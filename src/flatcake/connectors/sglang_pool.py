"""SGLang's MHA and MLA host pools as FlatCake blocks, the hybrid pools it refuses
(``extra_pool_refusal``), and the backend's extra config.

No SGLang import here: ``HostPoolView`` reads only the host pool's public attributes
(``layout``, ``page_size``, ``layer_num``, ``head_num``, ``head_dim`` or
``kv_cache_dim``, ``dtype``, ``kv_buffer``), and ``parse_sglang_config`` only validates a
dict.

A FlatCake block is one SGLang page; its bytes for layer ``l`` are the page's K tokens
then its V tokens, each ``(page_size, head_num, head_dim)`` (MLA: the page's latent rows,
``(page_size, 1, kv_cache_dim)``), whatever the pool's memory layout. Per layer,
``layer_kv(l)`` gives those parts as ``(num_pages, page_size, heads, dim)`` views of the
pool (no copy). MHA ``kv_buffer`` (MLA: the same without the leading 2, ``heads`` 1, no
``page_head``):

- ``layer_first``        ``(2, layers, tokens, heads, dim)``
- ``page_first``         ``(2, tokens, layers, heads, dim)``
- ``page_first_direct``  ``(2, pages, layers, page_size, heads, dim)``
- ``page_head``          ``(2, pages, heads, page_size, layers, dim)``

Reads and writes go straight between the store and the pool (``direct_caches``: per
layer, a strided ``(2, pages, page_size, heads, dim)`` view, ``cio.paged``'s strided
``kv_blocks``) when a page's K and V halves of one layer are each contiguous
(``layer_first``, ``page_first_direct``) and the pool's base and those halves are
4 KiB-aligned: with O_DIRECT the store then reads into and writes from the pool's pages
themselves (``preadv`` / ``pwritev``), no staging copy; for MLA, ``layer_first`` only
(a contiguous ``(pages, page_size, 1, dim)`` per layer). Otherwise (``page_first`` and
``page_head`` interleave layers inside a page; an unaligned page) pages go through an
aligned bounce buffer (``BounceBuffers``), one copy each way; ``direct_refusal`` says
why.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.config import FlatCakeConfig, load_extra_config
from flatcake.geometry import DTYPE_BYTES, KVGeometry
from flatcake.layout import ALIGN

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
# Keys SGLang itself reads from the same extra config (dynamic loading).
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "allocator")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
DIRECT_LAYOUTS = ("layer_first", "page_first_direct")


class HostPoolView:
    """Per-layer page views of an SGLang ``MHATokenToKVPoolHost`` (K and V) or
    ``MLATokenToKVPoolHost`` (one latent row per token: a single part, ``heads`` 1)."""

    def __init__(self, pool: Any) -> None:
        self.mla = hasattr(pool, "kv_lora_rank")
        layouts = MLA_LAYOUTS if self.mla else LAYOUTS
        layout = str(getattr(pool, "layout", None))
        if layout not in layouts:
            raise ValueError(f"FlatCake supports SGLang {'MLA' if self.mla else 'MHA'} host "
                             f"pool layouts {layouts}, got {layout!r}")
        kv = getattr(pool, "kv_buffer", None)
        if not isinstance(kv, torch.Tensor):
            raise ValueError(f"FlatCake needs a host pool with one kv_buffer tensor, got "
                             f"{type(pool).__name__} (a hybrid model's state, window or "
                             "indexer pools are not served: extra_pool_refusal)")
        if not self.mla and getattr(pool, "v_head_dim", pool.head_dim) != pool.head_dim:
            raise ValueError(f"FlatCake needs head_dim == v_head_dim, got {pool.head_dim} "
                             f"and {pool.v_head_dim}")
        dtype = str(pool.dtype).removeprefix("torch.")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"host pool dtype {pool.dtype} is not supported; choose one "
                             f"of {sorted(DTYPE_BYTES)}")
        self.layout = layout
        self.page_size = int(pool.page_size)
        self.num_layers = int(pool.layer_num)
        self.head_num = 1 if self.mla else int(pool.head_num)
        self.head_dim = int(pool.kv_cache_dim) if self.mla else int(pool.head_dim)
        self.dtype = pool.dtype
        self.dtype_name = dtype
        self.kv = kv
        # K and V planes (MHA), or the one latent plane (MLA): the same shapes per layout.
        self.planes = [kv] if self.mla else [kv[0], kv[1]]
        lead = self.planes[0].shape
        tokens = {"layer_first": lead[1], "page_first": lead[0]}.get(
            layout, lead[0] * self.page_size)
        self.num_pages = int(tokens) // self.page_size

    def geometry(self, name: str) -> KVGeometry:
        if self.mla:
            return KVGeometry(num_layers=self.num_layers, tokens_per_block=self.page_size,
                              dtype=self.dtype_name, mla_latent_dim=self.head_dim, name=name)
        return KVGeometry(num_layers=self.num_layers, tokens_per_block=self.page_size,
                          num_kv_heads=self.head_num, head_dim=self.head_dim,
                          dtype=self.dtype_name, name=name)

    def layer_kv(self, layer: int) -> list[torch.Tensor]:
        """The parts of ``layer`` (K and V, or the latent) as ``(num_pages, page_size,
        heads, dim)`` pool views."""
        ps, h, d = self.page_size, self.head_num, self.head_dim
        tokens = self.num_pages * ps
        out = []
        for t in self.planes:
            if self.layout == "layer_first":
                v = t[layer, :tokens].view(-1, ps, h, d)
            elif self.layout == "page_first":
                v = t[:tokens, layer].view(-1, ps, h, d)
            elif self.layout == "page_first_direct":
                v = t[:, layer]
            else:
                v = t[:, :, :, layer].permute(0, 2, 1, 3)
            out.append(v)
        return out

    def pages(self, host_indices: Any, num_keys: int) -> torch.Tensor:
        """Page numbers of ``host_indices`` (token slots, ``num_keys x page_size``,
        page-aligned)."""
        idx = torch.as_tensor(host_indices).reshape(-1).to(torch.int64).cpu()
        if idx.numel() != num_keys * self.page_size:
            raise ValueError(f"host_indices has {idx.numel()} slots for {num_keys} keys of "
                             f"page_size {self.page_size}")
        if num_keys == 0:
            return idx
        starts = idx[::self.page_size]
        if bool((starts % self.page_size).any()):
            raise ValueError("host_indices must be page-aligned")
        pages = starts // self.page_size
        if int(pages.min()) < 0 or int(pages.max()) >= self.num_pages:
            raise ValueError(f"host_indices outside the pool's {self.num_pages} pages")
        return pages

    @property
    def block_bytes(self) -> int:
        """One page of one layer, K then V (or the latent): ``block_bytes_per_layer``."""
        return (len(self.planes) * self.page_size * self.head_num * self.head_dim
                * self.kv.element_size())

    def direct_caches(self) -> list[torch.Tensor] | None:
        """Per layer, every page as a view of the pool the store can address: MHA, a
        strided ``(2, pages, page_size, heads, dim)`` (K and V halves); MLA
        ``layer_first``, a contiguous ``(pages, page_size, 1, dim)``. ``None`` for
        layouts that interleave layers inside a page (and MLA ``page_first_direct``,
        whose pages of one layer are strided whole blocks)."""
        if self.layout not in DIRECT_LAYOUTS or (self.mla and self.layout != "layer_first"):
            return None
        if self.mla:
            return [self.layer_kv(layer)[0] for layer in range(self.num_layers)]
        tokens = self.num_pages * self.page_size
        if self.layout == "layer_first":
            return [self.kv[:, layer, :tokens].unflatten(1, (self.num_pages, self.page_size))
                    for layer in range(self.num_layers)]
        return [self.kv[:, :, layer] for layer in range(self.num_layers)]

    def direct_refusal(self) -> str:
        """Why reads and writes cannot go straight to the pool ("" when they can)."""
        caches = self.direct_caches()
        if caches is None:
            return f"the {self.layout} layout does not keep a page's layer parts whole"
        part = self.block_bytes // len(self.planes)
        if part % ALIGN:
            return f"one part of a page's layer is {part} bytes, not a multiple of {ALIGN}"
        if any(c.data_ptr() % ALIGN for c in caches):
            return f"the host pool's base is not {ALIGN}-aligned"
        return ""

    def _typed(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        return buf.view(self.dtype).view(n, len(self.planes), self.page_size, self.head_num,
                                         self.head_dim)

    def gather(self, pages: torch.Tensor, staging: list[torch.Tensor]) -> None:
        """Pool pages -> staging blocks, layer by layer."""
        n = int(pages.numel())
        for layer, buf in enumerate(staging):
            typed = self._typed(buf, n)
            for i, part in enumerate(self.layer_kv(layer)):
                typed[:, i] = part[pages]

    def zero(self, pages: torch.Tensor) -> None:
        """Fill ``pages`` with zeros in every layer (scrubs bytes a direct read left in
        pages reported missing)."""
        if pages.numel() == 0:
            return
        for layer in range(self.num_layers):
            for part in self.layer_kv(layer):
                part[pages] = 0

    def scatter(self, staging: list[torch.Tensor], pages: torch.Tensor) -> None:
        """The first ``len(pages)`` staging blocks -> pool pages, layer by layer."""
        m = int(pages.numel())
        if m == 0:
            return
        for layer, buf in enumerate(staging):
            typed = self._typed(buf, buf.shape[0])[:m]
            for i, part in enumerate(self.layer_kv(layer)):
                part[pages] = typed[:, i]


class BounceBuffers:
    """4 KiB-aligned host buffers of ``n`` pages per layer (``(n, block_bytes)`` each),
    reused across calls; SGLang's backup and prefetch threads each hold one at a time.
    A batch's buffer holds all its pages (SGLang sends up to 128); at most ``KEEP``
    buffers of at most ``KEEP_BYTES`` each stay allocated between calls."""

    KEEP = 2
    KEEP_BYTES = 256 << 20

    def __init__(self, view: HostPoolView) -> None:
        self._layers, self._bb = view.num_layers, view.block_bytes
        self._lock = threading.Lock()
        self._free: list[torch.Tensor] = []

    def take(self, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A buffer for ``n`` pages and its per-layer ``(n, block_bytes)`` views."""
        need = self._layers * n * self._bb
        with self._lock:
            fit = [b for b in self._free if b.numel() >= need]
            if fit:
                self._free.remove(fit[0])
        buf = fit[0] if fit else aligned_buffer(need, pin=False)
        return buf, list(buf[:need].view(self._layers, n, self._bb).unbind(0))

    def give(self, buf: torch.Tensor) -> None:
        if buf.numel() > self.KEEP_BYTES:
            return
        with self._lock:
            self._free.append(buf)
            self._free.sort(key=lambda b: -b.numel())
            del self._free[self.KEEP:]


KV_POOL = "kv"  # SGLang's ``PoolName.KV``: the pool ``register_mem_pool_host`` hands over


def extra_pool_refusal(pool: Any, name: Any) -> str:
    """Why the backend cannot take a host pool SGLang's hybrid cache controller
    registers beside the KV pool (``register_mem_host_pool_v2``: each entry of a hybrid
    model's ``HostPoolGroup``, the KV pool among them); "" for the KV pool. A Mamba or
    Gated DeltaNet state, sliding-window or indexer pool is moved by SGLang's v2 storage
    calls (``batch_exists_v2`` with the pool's hit policy, ``batch_get_v2`` and
    ``batch_set_v2`` per pool), which this backend does not implement: storing the KV
    pages without them would serve a prefix whose state or window is missing."""
    label = str(getattr(name, "value", name))
    if label == KV_POOL:
        return ""
    layers = getattr(pool, "layer_num", None)
    what = type(pool).__name__ + (f", {layers} layers" if isinstance(layers, int) else "")
    return (f"FlatCake's SGLang backend cannot serve the hybrid host pool {label!r} "
            f"({what}): it stores the KV pool through HiCache's v1 calls only "
            "(batch_exists, batch_get_v1, batch_set_v1); a model with a Mamba or Gated "
            "DeltaNet state, sliding-window or indexer pool needs the v2 calls per pool "
            "(batch_exists_v2 with the pool's hit policy, batch_get_v2, batch_set_v2), "
            "which it does not implement. Serve this model with FlatCake's vLLM "
            "connector (it stores recurrent states and sliding windows), or without "
            "--hicache-storage-backend")


def parse_sglang_config(extra: Mapping[str, Any] | None,
                        env: Mapping[str, str] | None = None) -> FlatCakeConfig:
    """Validate ``--hicache-storage-backend-extra-config`` with the one parser every
    engine host uses (``config.load_extra_config``: sections nested or dotted, the
    ``[engine]`` keys bare, ``config_file``); SGLang's own loading keys are skipped.
    Raises ``ValueError`` naming a bad key or value."""
    return load_extra_config("hicache-storage-backend-extra-config", extra, env,
                             ignore=SGLANG_KEYS)
