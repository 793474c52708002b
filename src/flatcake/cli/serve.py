"""``flatcake serve --root DIR [--config F] [--socket PATH] [--set KEY=VALUE] [--status]``:
the node service, one per machine (``flatcake.service``), in the foreground.

Logs to stderr; SIGTERM or SIGINT stop it cleanly (engines attached keep serving without
FlatCake and re-attach once a service is back). ``--status`` asks a running service
what it serves and exits. Exit status 0 on a clean stop, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from pathlib import Path

DESCRIPTION = ("Run the node service: one FlatCake per machine, shared by every engine on "
               "it (vLLM data-parallel ranks, one vLLM per GPU, SGLang ranks). It owns the "
               "books and the shared host arena of the store root; engines attach with "
               "store.node = \"unix:SOCKET\" in their configuration and read and write the "
               "session files themselves. Foreground, logs to stderr, stops cleanly on "
               "SIGTERM.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", help="store root directory (default: store.root of the "
                   "configuration)")
    p.add_argument("--config", help="TOML configuration (the store's own sections)")
    p.add_argument("--socket", help="socket to listen on (default: store.node of the "
                   "configuration, else ROOT/node.sock)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting (store.memory_capacity_bytes=...); repeatable")
    p.add_argument("--status", action="store_true",
                   help="ask the running service what it serves, print JSON, exit")


def run(args: argparse.Namespace) -> int:
    from flatcake.config import load_config
    from flatcake.service.server import socket_path

    try:
        cfg = load_config(args.config, overrides=args.set)
    except (OSError, ValueError) as exc:
        print(f"flatcake serve: {exc}")
        return 2
    root = Path(args.root or cfg.store.root).absolute()
    sock = Path(args.socket) if args.socket else (
        socket_path(cfg.store.node) if cfg.store.node else root / "node.sock")
    if args.status:
        return _status(sock, cfg.store.node_timeout_s, cfg.store.node_socket_group)
    from flatcake.service.endpoint import raise_open_files
    from flatcake.service.server import NodeService

    # The service's own log (where it serves, the arena's pages, attaches, leases) is
    # its output: shown at the default verbosity, from the start (-v adds the rest).
    log = logging.getLogger("flatcake.service")
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    raise_open_files()  # a flood of idle connections must not exhaust them
    try:
        service = NodeService(root, cfg, sock)
    except (OSError, ValueError) as exc:
        print(f"flatcake serve: {exc}")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("serving %s on unix:%s (memory %d B, SSD %d B, lease %g s)", root, sock,
             cfg.store.memory_capacity_bytes, cfg.store.ssd_capacity_bytes,
             cfg.store.node_lease_s)
    print(f"ready: unix:{sock}", flush=True)
    try:
        service.serve(stop)
    finally:
        service.close()
        log.info("stopped")
    return 0


def _status(sock: Path, timeout_s: float, group: str) -> int:
    from flatcake.service.endpoint import ask_status

    try:
        print(json.dumps(ask_status(sock, timeout_s, group), indent=2))
    except (ConnectionError, ValueError) as exc:
        print(f"flatcake serve --status: {exc}")
        return 1
    return 0
