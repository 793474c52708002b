"""SGLang's MHA host pool as FlatCake blocks, and the backend's extra config.

No SGLang import here: ``HostPoolView`` reads only the host pool's public attributes
(``layout``, ``page_size``, ``layer_num``, ``head_num``, ``head_dim``, ``dtype``,
``kv_buffer``), and ``parse_sglang_config`` only validates a dict.

A FlatCake block is one SGLang page; its bytes for layer ``l`` are the page's K tokens
then its V tokens, each ``(page_size, head_num, head_dim)`` in that order, whatever the
pool's memory layout. Per layer, ``layer_kv(l)`` gives K and V as
``(num_pages, page_size, head_num, head_dim)`` views of the pool (no copy):

- ``layer_first``        ``(2, layers, tokens, heads, dim)``
- ``page_first``         ``(2, tokens, layers, heads, dim)``
- ``page_first_direct``  ``(2, pages, layers, page_size, heads, dim)``
- ``page_head``          ``(2, pages, heads, page_size, layers, dim)``

Reads and writes go straight between the store and the pool (``direct_caches``: per
layer, a strided ``(2, pages, page_size, heads, dim)`` view, ``cio.paged``'s strided
``kv_blocks``) when a page's K and V halves of one layer are each contiguous
(``layer_first``, ``page_first_direct``) and the pool's base and those halves are
4 KiB-aligned: with O_DIRECT the store then reads into and writes from the pool's pages
themselves (``preadv`` / ``pwritev``), no staging copy. Otherwise (``page_first`` and
``page_head`` interleave layers inside a page; an unaligned page) pages go through an
aligned bounce buffer (``BounceBuffers``), one copy each way; ``direct_refusal`` says
why.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.config import FlatCakeConfig, load_config
from flatcake.geometry import DTYPE_BYTES, KVGeometry
from flatcake.plan.layout import ALIGN

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
SECTIONS = ("placement", "reclaim", "planner", "scheduler", "store")
# Keys SGLang itself reads from the same extra config (dynamic loading).
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "allocator")
DIRECT_LAYOUTS = ("layer_first", "page_first_direct")
BACKEND_KEYS = ("config_file", "tenant_salt", "model_name")


class HostPoolView:
    """Per-layer K/V page views of an SGLang ``MHATokenToKVPoolHost``."""

    def __init__(self, pool: Any) -> None:
        layout = getattr(pool, "layout", None)
        if layout not in LAYOUTS:
            raise ValueError(f"FlatCake supports SGLang host pool layouts {LAYOUTS}, got "
                             f"{layout!r}")
        kv = getattr(pool, "kv_buffer", None)
        if not isinstance(kv, torch.Tensor):
            raise ValueError(f"FlatCake needs an MHA host pool with one kv_buffer tensor, "
                             f"got {type(pool).__name__} (MLA and hybrid pools are not "
                             f"supported)")
        if getattr(pool, "v_head_dim", pool.head_dim) != pool.head_dim:
            raise ValueError(f"FlatCake needs head_dim == v_head_dim, got {pool.head_dim} "
                             f"and {pool.v_head_dim}")
        dtype = str(pool.dtype).removeprefix("torch.")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"host pool dtype {pool.dtype} is not supported; choose one "
                             f"of {sorted(DTYPE_BYTES)}")
        self.layout: str = layout
        self.page_size = int(pool.page_size)
        self.num_layers = int(pool.layer_num)
        self.head_num = int(pool.head_num)
        self.head_dim = int(pool.head_dim)
        self.dtype = pool.dtype
        self.dtype_name = dtype
        self.kv = kv
        if layout == "layer_first":
            tokens = kv.shape[2]
        elif layout == "page_first":
            tokens = kv.shape[1]
        else:
            tokens = kv.shape[1] * self.page_size
        self.num_pages = int(tokens) // self.page_size

    def geometry(self, name: str) -> KVGeometry:
        return KVGeometry(num_layers=self.num_layers, tokens_per_block=self.page_size,
                          num_kv_heads=self.head_num, head_dim=self.head_dim,
                          dtype=self.dtype_name, name=name)

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` as ``(num_pages, page_size, heads, dim)`` pool views."""
        ps, h, d = self.page_size, self.head_num, self.head_dim
        out = []
        for i in (0, 1):
            t = self.kv[i]
            if self.layout == "layer_first":
                v = t[layer].view(-1, ps, h, d)
            elif self.layout == "page_first":
                v = t[:, layer].view(-1, ps, h, d)
            elif self.layout == "page_first_direct":
                v = t[:, layer]
            else:
                v = t[:, :, :, layer].permute(0, 2, 1, 3)
            out.append(v)
        return out[0], out[1]

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
        """One page of one layer, K then V: FlatCake's ``block_bytes_per_layer``."""
        return 2 * self.page_size * self.head_num * self.head_dim * self.kv.element_size()

    def direct_caches(self) -> list[torch.Tensor] | None:
        """Per layer, every page's K and V halves as a strided ``(2, pages, page_size,
        heads, dim)`` view of the pool; ``None`` for layouts that interleave layers
        inside a page."""
        if self.layout not in DIRECT_LAYOUTS:
            return None
        tokens = self.num_pages * self.page_size
        if self.layout == "layer_first":
            return [self.kv[:, layer, :tokens].unflatten(1, (self.num_pages, self.page_size))
                    for layer in range(self.num_layers)]
        return [self.kv[:, :, layer] for layer in range(self.num_layers)]

    def direct_refusal(self) -> str:
        """Why reads and writes cannot go straight to the pool ("" when they can)."""
        caches = self.direct_caches()
        if caches is None:
            return f"the {self.layout} layout interleaves layers inside a page"
        half = self.block_bytes // 2
        if half % ALIGN:
            return f"a page's K or V of one layer is {half} bytes, not a multiple of {ALIGN}"
        if any(c.data_ptr() % ALIGN for c in caches):
            return f"the host pool's base is not {ALIGN}-aligned"
        return ""

    def _typed(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        return buf.view(self.dtype).view(n, 2, self.page_size, self.head_num, self.head_dim)

    def gather(self, pages: torch.Tensor, staging: list[torch.Tensor]) -> None:
        """Pool pages -> staging blocks, layer by layer."""
        n = int(pages.numel())
        for layer, buf in enumerate(staging):
            k, v = self.layer_kv(layer)
            typed = self._typed(buf, n)
            typed[:, 0] = k[pages]
            typed[:, 1] = v[pages]

    def zero(self, pages: torch.Tensor) -> None:
        """Fill ``pages`` with zeros in every layer (scrubs bytes a direct read left in
        pages reported missing)."""
        if pages.numel() == 0:
            return
        for layer in range(self.num_layers):
            for half in self.layer_kv(layer):
                half[pages] = 0

    def scatter(self, staging: list[torch.Tensor], pages: torch.Tensor) -> None:
        """The first ``len(pages)`` staging blocks -> pool pages, layer by layer."""
        m = int(pages.numel())
        if m == 0:
            return
        for layer, buf in enumerate(staging):
            k, v = self.layer_kv(layer)
            typed = self._typed(buf, buf.shape[0])[:m]
            k[pages] = typed[:, 0]
            v[pages] = typed[:, 1]


class BounceBuffers:
    """4 KiB-aligned host buffers of ``n`` pages per layer (``(n, block_bytes)`` each),
    reused across calls; SGLang's backup and prefetch threads each hold one at a time."""

    KEEP = 2

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
        with self._lock:
            self._free.append(buf)
            self._free.sort(key=lambda b: -b.numel())
            del self._free[self.KEEP:]


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """The backend's configuration: the store's own plus the key space's tenant."""

    config: FlatCakeConfig
    tenant_salt: str = ""
    model_name: str | None = None


def _override(section: str, name: str, value: Any) -> str:
    if isinstance(value, Mapping | list | tuple):
        raise ValueError(f"hicache-storage-backend-extra-config {section}.{name} must be a "
                         f"scalar, got {value!r}")
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"{section}.{name}={value}"


def parse_sglang_config(extra: Mapping[str, Any] | None,
                        env: Mapping[str, str] | None = None) -> BackendSettings:
    """Validate ``--hicache-storage-backend-extra-config`` (the store's section names,
    nested or dotted, plus ``config_file``, ``tenant_salt``, ``model_name``; SGLang's own
    loading keys are ignored). Raises ``ValueError`` naming a bad key or value."""
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise ValueError(f"hicache-storage-backend-extra-config must be a JSON object, got "
                         f"{type(extra).__name__}")
    overrides: list[str] = []
    config_file = None
    tenant_salt = ""
    model_name = None
    for key, value in extra.items():
        if not isinstance(key, str):
            raise ValueError(f"extra config keys must be strings, got {key!r}")
        if key in SGLANG_KEYS:
            continue
        if key == "config_file":
            if not isinstance(value, str) or not value:
                raise ValueError(f"extra config config_file must be a path, got {value!r}")
            config_file = value
        elif key in ("tenant_salt", "model_name"):
            if not isinstance(value, str) or (key == "model_name" and not value):
                raise ValueError(f"extra config {key} must be a string, got {value!r}")
            if key == "tenant_salt":
                tenant_salt = value
            else:
                model_name = value
        elif key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ValueError(f"extra config {key} must be an object of {key} fields, "
                                 f"got {value!r}")
            overrides.extend(_override(key, str(name), v) for name, v in value.items())
        elif "." in key and key.split(".", 1)[0] in SECTIONS:
            section, name = key.split(".", 1)
            overrides.append(_override(section, name, value))
        else:
            known = sorted((*BACKEND_KEYS, *SECTIONS, *SGLANG_KEYS))
            raise ValueError(f"unknown hicache-storage-backend-extra-config key {key!r}; "
                             f"known keys: {known} (or 'section.field')")
    return BackendSettings(load_config(config_file, env, overrides), tenant_salt, model_name)
