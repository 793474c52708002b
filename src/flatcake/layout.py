"""Byte layout of one turn segment (FC-CIO). Pure arithmetic, shared by the control
plane (address allocation), the plans (read planning) and the data plane (file format,
I/O); a leaf beside ``geometry``: it imports nothing of FlatCake, so every floor above
stands on it.

A segment holds one turn's new blocks of one session, layer-major, so layer ``l`` of
the turn is one contiguous range::

    segment_offset
    +-----------------------------+  <- 4 KiB aligned
    | segment header              |  header_bytes (multiple of 4 KiB): fixed fields,
    |  (see cio.format)           |  one key per block, one checksum per layer
    |                             |  and (version 4) one per block of each layer
    +-----------------------------+  <- data_offset (4 KiB aligned)
    | layer 0: block 0 .. n-1     |  n * layer_block_bytes[0]
    | layer 1: block 0 .. n-1     |  n * layer_block_bytes[1]
    | ...                         |
    | layer L-1: block 0 .. n-1   |
    +-----------------------------+
    | zero padding to 4 KiB       |
    +-----------------------------+  <- segment_offset + total_bytes

Layers may differ in size (``KVGeometry.layer_block_bytes``); a layer's range starts
where the previous one ends, at no alignment. Host-memory segments use the same data
layout with ``header_bytes == 0``.

A sliding-window layer (``KVGeometry.layer_window_blocks``: ``w > 0``) keeps only the
segment's last ``min(n, w)`` blocks (its *rows*): a next turn's window ends at the end
of a segment, and each earlier segment holds its own last ``w`` blocks, so every block
of any window ending at a segment end is stored. Its range holds those rows only.

A segment may keep more rows (``ends``: runs ``(lo, hi)`` of its blocks where a hit
may end as well, ``control.stores``: where the prompt branched off a stored prefix,
every ``store.window_row_stride_tokens`` tokens, every block): a windowed layer of ``w`` then
holds the blocks ``[e - w, e)`` of every such end ``e`` and of the segment's end, in
block order (its rows)::

    blocks      0 .... e1-w .. e1 ........ e2-w .. e2 ........ n-w .. n
    full layer  [==================================================== all ]
    window w          [ rows ]              [ rows ]            [ rows ]

A restore reads such a layer through a view (``read_end``): the held rows of the
window before the run's end, one contiguous range of the layer.

Once a later turn of the session is durable, an older segment's window rows may be
*released* (``released``: the file range is punched, ``control.windows``): the layer
then holds none of its blocks, while every offset stays where it was written.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field

ALIGN = 4096
KEY_BYTES = 32
"""Keys are stored as fixed 32-byte digests (see ``control.keys``)."""

SEGMENT_FIXED_HEADER_BYTES = 128
"""Fixed part of a segment header, before the per-block keys and per-layer checksums."""


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def segment_header_bytes(num_blocks: int, layer_block_bytes: tuple[int, ...],
                         windowed: bool = False, crc_rows: int = 0, num_ends: int = 0
                         ) -> int:
    """On-disk header size: fixed fields + one key per block + one crc32 per layer, one
    4-byte size per layer when the layers differ in size, one 4-byte window per layer
    when some layer has a window (``windowed``), ``crc_rows`` block crcs (format
    version 4: one per block each layer holds; its windows are always listed) and
    ``num_ends`` runs of hit ends, 8 bytes each (version 6)."""
    num_layers = len(layer_block_bytes)
    alike = layer_block_bytes.count(layer_block_bytes[0]) == num_layers
    sizes = (0 if alike else num_layers * 4) + \
        (num_layers * 4 if windowed or crc_rows else 0)
    table = crc_rows * 4 + num_ends * 8
    raw = SEGMENT_FIXED_HEADER_BYTES + num_blocks * KEY_BYTES + num_layers * 4 + sizes
    return align_up(raw + table)


def held_runs(num_blocks: int, window: int, ends: tuple[tuple[int, int], ...] = ()
              ) -> tuple[tuple[int, int], ...]:
    """The blocks ``[a, b)`` a layer of ``window`` blocks (0: none, every block) holds in
    a segment of ``num_blocks`` whose hits may also end at ``ends`` (runs ``(lo, hi)``,
    ``lo <= e <= hi``): ``[e - window, e)`` for each such ``e`` and for the segment's
    end, merged, in block order (``SegmentLayout``)."""
    n = num_blocks
    if not window:
        return ((0, n),)
    out: list[list[int]] = []
    for lo, hi in (*ends, (n, n)):
        a, b = max(0, lo - window), hi
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def check_ends(ends: tuple[tuple[int, int], ...], num_blocks: int) -> None:
    """Raise ``ValueError`` unless ``ends`` are sorted, disjoint runs ``(lo, hi)``
    inside ``1..num_blocks``."""
    at = 0
    for run in ends:
        if len(run) != 2 or not at < run[0] <= run[1] <= num_blocks:
            raise ValueError(f"SegmentLayout.ends must be sorted disjoint runs (lo, hi) "
                             f"in 1..{num_blocks}, got {ends!r}")
        at = run[1]


def merge_ends(*parts: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``ends`` runs of every part, sorted and merged (touching runs join)."""
    out: list[list[int]] = []
    for lo, hi in sorted(r for p in parts for r in p):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def describe_layers(layer_block_bytes: tuple[int, ...],
                    layer_window_blocks: tuple[int, ...] = ()) -> str:
    """``layer_block_bytes`` for a message: "32 layers x 4096 B", or each run of alike
    layers ("2 x 74752 B + 21 x 22912 B"); a windowed layer's run says its window
    ("2 x 584 B (window 3 blocks)")."""
    kinds = zip(layer_block_bytes, layer_window_blocks or (0,) * len(layer_block_bytes),
                strict=True)
    runs = [(b, w, len(list(grp))) for (b, w), grp in itertools.groupby(kinds)]

    def window(w: int) -> str:
        return f" (window {w} blocks)" if w else ""

    if len(runs) == 1:
        return f"{runs[0][2]} layers x {runs[0][0]} B{window(runs[0][1])}"
    return " + ".join(f"{n} x {b} B{window(w)}" for b, w, n in runs)


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """Where every byte of one segment lives, relative to the segment's start.

    Attributes:
        num_blocks: blocks in the segment (one turn's new blocks).
        layer_block_bytes: bytes of one block of each layer, in layer order.
        header_bytes: 0 for host memory, ``segment_header_bytes(...)`` on SSD.
        layer_window_blocks: each layer's window in blocks (0: every block), or empty
            when no layer has one; a windowed layer holds the segment's last
            ``min(num_blocks, window)`` blocks only (``layer_first``).
        block_crcs: the header holds a crc32 per block of each layer (format version
            4), so a run of the segment's blocks can be read and checked alone;
            otherwise only a whole layer can be checked.
        released: windowed layers whose rows were given back to the filesystem (a
            later turn superseded their window): they hold no block any more
            (``layer_first`` is ``num_blocks``); offsets do not change.
        ends: runs ``(lo, hi)`` of blocks besides the segment's end where a hit may
            end (``held_runs``): a windowed layer holds the window before each (the
            file header records them); empty: the segment's end only.
        read_end: a restore's view only (``control.windows.restore_view``), never
            stored: the hit ends at this block of the segment, so a windowed layer of
            ``w`` is read from ``read_end - w`` on, its held rows there
            (``layer_first``); 0 none. Offsets do not change.
    """

    num_blocks: int
    layer_block_bytes: tuple[int, ...]
    header_bytes: int
    layer_window_blocks: tuple[int, ...] = ()
    block_crcs: bool = False
    released: tuple[int, ...] = ()
    ends: tuple[tuple[int, int], ...] = ()
    read_end: int = 0
    _uniform: int = field(init=False, repr=False, compare=False)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _runs: tuple[tuple[tuple[int, int], ...], ...] = field(init=False, repr=False,
                                                            compare=False)

    def __post_init__(self) -> None:
        if self.num_blocks <= 0:
            raise ValueError(f"SegmentLayout.num_blocks must be > 0, got {self.num_blocks}")
        if not isinstance(self.layer_block_bytes, tuple) or not self.layer_block_bytes:
            raise ValueError(f"SegmentLayout.layer_block_bytes must be a non-empty tuple, "
                             f"got {self.layer_block_bytes!r}")
        if min(self.layer_block_bytes) <= 0:
            raise ValueError(f"SegmentLayout.layer_block_bytes must be > 0, got "
                             f"{self.layer_block_bytes}")
        if self.header_bytes < 0 or self.header_bytes % ALIGN:
            raise ValueError(
                f"SegmentLayout.header_bytes must be a multiple of {ALIGN}, got "
                f"{self.header_bytes}"
            )
        # Layer l's data starts at num_blocks * sum(layer_block_bytes[:l]): l times one
        # layer's bytes when the layers are alike (the common case, kept cheap: the
        # replay makes a layout per turn), else from the table of starts.
        sizes, windows, n = self.layer_block_bytes, self.layer_window_blocks, self.num_blocks
        if windows and (len(windows) != len(sizes) or min(windows) < 0):
            raise ValueError(f"SegmentLayout.layer_window_blocks must hold one window >= 0 "
                             f"per layer, got {windows!r}")
        if not 0 <= self.read_end <= n:
            raise ValueError(f"SegmentLayout.read_end must be in 0..{n}, got "
                             f"{self.read_end}")
        if self.ends:
            check_ends(self.ends, n)
        runs = tuple(_held(n, w, self.ends) for w in windows)
        if all(r == ((0, n),) for r in runs):  # every layer holds every block
            runs = ()
        if self.released and not all(0 <= k < len(windows) and windows[k]
                                      for k in self.released):
            raise ValueError(f"SegmentLayout.released must name windowed layers, got "
                             f"{self.released!r}")
        uniform = sizes[0] if not runs and sizes.count(sizes[0]) == len(sizes) else 0
        object.__setattr__(self, "_runs", runs)
        object.__setattr__(self, "_uniform", uniform)
        rows = tuple(sum(b - a for a, b in r) for r in runs) or (n,) * len(sizes)
        object.__setattr__(self, "_starts", () if uniform else (0, *itertools.accumulate(
            r * b for b, r in zip(sizes, rows, strict=True))))

    @classmethod
    def for_ssd(cls, num_blocks: int, layer_block_bytes: tuple[int, ...],
                layer_window_blocks: tuple[int, ...] = (),
                block_crcs: bool = True, ends: tuple[tuple[int, int], ...] = (),
                ends_listed: bool = True) -> SegmentLayout:
        """A segment on SSD; ``ends_listed``: its header lists ``ends`` (version 6;
        a version 5 segment records one run in its fixed fields)."""
        windows = layer_window_blocks if any(layer_window_blocks) else ()
        ends = ends if windows else ()
        rows = 0
        if block_crcs:
            rows = sum(sum(b - a for a, b in _held(num_blocks, w, ends))
                       for w in windows) if windows else num_blocks * len(layer_block_bytes)
        return cls(num_blocks, layer_block_bytes,
                   segment_header_bytes(num_blocks, layer_block_bytes, bool(windows), rows,
                                        len(ends) if ends_listed else 0),
                   windows, block_crcs, ends=ends)

    @classmethod
    def for_memory(cls, num_blocks: int, layer_block_bytes: tuple[int, ...],
                   layer_window_blocks: tuple[int, ...] = (),
                   ends: tuple[tuple[int, int], ...] = ()) -> SegmentLayout:
        windows = layer_window_blocks if any(layer_window_blocks) else ()
        return cls(num_blocks, layer_block_bytes, 0, windows, ends=ends if windows else ())

    @property
    def num_layers(self) -> int:
        return len(self.layer_block_bytes)

    @property
    def is_uniform(self) -> bool:
        """Every layer's block has the same size (the layer stride is constant)."""
        return self._uniform > 0

    @property
    def data_offset(self) -> int:
        return self.header_bytes

    @property
    def is_windowed(self) -> bool:
        """Some layer holds (or a restore reads) fewer blocks than the segment (a
        sliding window, rows released, a view's ``read_end``)."""
        return bool(self._runs or self.released or self.read_end)

    def layer_runs(self, layer: int) -> tuple[tuple[int, int], ...]:
        """The blocks ``[a, b)`` ``layer`` was written with, in row order (released
        rows included: they keep their place)."""
        return self._runs[layer] if self._runs else ((0, self.num_blocks),)

    def layer_first(self, layer: int) -> int:
        """The first block ``layer`` holds (0, or where its window's rows start;
        ``num_blocks`` once its rows are released), as a restore reads it: in a view
        with ``read_end``, a windowed layer from its window before ``read_end``, its
        held rows there (``num_blocks`` if none); from there to the run's end, every
        block is held."""
        if self.released and layer in self.released:
            return self.num_blocks
        runs = self._runs[layer] if self._runs else ((0, self.num_blocks),)
        if self.read_end and self.layer_window_blocks and self.layer_window_blocks[layer]:
            for a, b in runs:
                if a < self.read_end <= b:
                    return max(a, self.read_end - self.layer_window_blocks[layer])
            return self.num_blocks
        return runs[0][0]

    def holds(self, layer: int, start: int, stop: int) -> bool:
        """Whether ``layer`` holds every block of ``[start, stop)`` (the books' rows:
        releases count, a view's ``read_end`` does not)."""
        if self.released and layer in self.released:
            return stop <= start
        if not self._runs or stop <= start:
            return True
        return any(a <= start and stop <= b for a, b in self._runs[layer])

    def row_index(self, layer: int, block: int) -> int:
        """The row of ``layer`` holding ``block`` (its place among the rows)."""
        if not self._runs:
            return block
        at = 0
        for a, b in self._runs[layer]:
            if a <= block < b:
                return at + block - a
            at += b - a
        raise ValueError(f"block {block} of layer {layer} is not held (rows at blocks "
                         f"{self._runs[layer]})")

    def row_first(self, layer: int) -> int:
        """The block of ``layer``'s first row as written."""
        return self._runs[layer][0][0] if self._runs else 0

    def row_shift(self, layer: int) -> int:
        """Block minus row for the blocks a restore reads of ``layer`` (from
        ``layer_first`` to the run's end: one run of rows); ``row_first`` when it reads
        none."""
        first = self.layer_first(layer)
        if not self._runs or first >= self.num_blocks:
            return self.row_first(layer)
        return first - self.row_index(layer, first)

    def release(self, layers: tuple[int, ...]) -> SegmentLayout:
        """This layout with the rows of windowed ``layers`` released too."""
        return dataclasses.replace(self, released=tuple(sorted({*self.released, *layers})))

    def layer_rows(self, layer: int) -> int:
        """Blocks ``layer`` was written with (its rows; released rows included: they
        keep their place)."""
        if not self._runs:
            return self.num_blocks
        return sum(b - a for a, b in self._runs[layer])

    def held_bytes(self, start: int, count: int) -> int:
        """Bytes the layers hold of blocks ``[start, start + count)``, all layers, as a
        restore reads them (``layer_first``)."""
        if not self.is_windowed:
            return count * sum(self.layer_block_bytes)
        return sum(size * max(0, start + count - max(start, self.layer_first(layer)))
                   for layer, size in enumerate(self.layer_block_bytes))

    def layer_bytes(self, layer: int) -> int:
        """Bytes of ``layer`` of the whole segment, as written (``layer_rows``)."""
        return self.layer_rows(layer) * self.layer_block_bytes[layer]

    @property
    def data_bytes(self) -> int:
        if self._uniform:
            return self.num_blocks * self._uniform * len(self.layer_block_bytes)
        return self._starts[-1]

    @property
    def total_bytes(self) -> int:
        return align_up(self.header_bytes + self.data_bytes)

    def layer_offset(self, layer: int) -> int:
        """Start of ``layer`` relative to the segment start."""
        if self._uniform:
            return self.header_bytes + layer * self.num_blocks * self._uniform
        return self.header_bytes + self._starts[layer]

    def block_offset(self, layer: int, block: int) -> int:
        """Start of block ``block`` (0-based within the segment) of ``layer``; a block
        ``layer`` does not hold is refused."""
        if not self._runs:
            return self.layer_offset(layer) + block * self.layer_block_bytes[layer]
        runs = self._runs[layer]
        if len(runs) == 1:
            first = runs[0][0]
            if block < first:
                raise ValueError(f"block {block} of layer {layer} is not held, outside its window "
                                 f"(blocks {first}..{self.num_blocks - 1} are held)")
            return self.layer_offset(layer) + (block - first) * self.layer_block_bytes[layer]
        return self.layer_offset(layer) + \
            self.row_index(layer, block) * self.layer_block_bytes[layer]


@functools.lru_cache(maxsize=8192)
def _held(num_blocks: int, window: int, ends: tuple[tuple[int, int], ...]
          ) -> tuple[tuple[int, int], ...]:
    return held_runs(num_blocks, window, ends)
