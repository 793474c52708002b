"""Reader choice by ``(medium, node)``: the executor's one dispatch.

Node 0 is this machine: its SSD reader is O_DIRECT ``preadv`` (``DirectReader``), or GDS
when CUDA + kvikio are usable on a direct-I/O root. Other nodes are read by remote
readers (``cio.remote_load.RemoteReader``): registered up front, or made on first use
by ``remote_source`` (the cluster service's readers, one per node and medium); the books
never see which.
"""

from __future__ import annotations

from collections.abc import Callable

from flatcake.cio.readers import DirectReader, GdsReader, Reader, kvikio_available
from flatcake.cio.remote_load import RemoteReader
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium

__all__ = ["LOCAL_NODE", "ReaderDispatch", "local_reader"]

LOCAL_NODE = 0


class ReaderDispatch:
    """Readers by ``(medium, node)``: node 0 is this machine's SSD reader; other nodes'
    remote readers (``cio.remote_load.RemoteReader``) come from ``register_remote`` or,
    for nodes met at load time, from the ``remote_source`` set by the cluster service."""

    def __init__(self) -> None:
        self._readers: dict[tuple[Medium, int], Reader] = {}
        self._remote: dict[tuple[Medium, int], RemoteReader] = {}
        self.remote_source: Callable[[Medium, int], RemoteReader | None] | None = None

    def register(self, medium: Medium, node: int, reader: Reader) -> None:
        if (medium, node) in self._readers:
            raise ValueError(f"a reader for ({medium.name}, node {node}) is registered")
        self._readers[(medium, node)] = reader

    def get(self, medium: Medium, node: int = LOCAL_NODE) -> Reader:
        try:
            return self._readers[(medium, node)]
        except KeyError:
            raise ValueError(f"no reader for ({medium.name}, node {node})") from None

    def register_remote(self, medium: Medium, node: int, reader: RemoteReader) -> None:
        if node == LOCAL_NODE or (medium, node) in self._remote:
            raise ValueError(f"cannot register a remote reader for ({medium.name}, node "
                             f"{node})")
        self._remote[(medium, node)] = reader

    def remote(self, medium: Medium, node: int) -> RemoteReader | None:
        """The reader of ``node``'s ``medium`` (None: that node cannot be read)."""
        reader = self._remote.get((medium, node))
        if reader is None and self.remote_source is not None:
            reader = self.remote_source(medium, node)
            if reader is not None:
                self._remote.setdefault((medium, node), reader)
        return reader

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        for remote in self._remote.values():
            remote.close()


def local_reader(config: FlatCakeConfig, io_mode: str) -> DirectReader | GdsReader:
    """GDS when CUDA + kvikio are usable on a direct-I/O root, else O_DIRECT preadv."""
    if io_mode == "direct" and kvikio_available():
        return GdsReader(config.store.read_threads)
    return DirectReader(config.store.read_threads)
