"""What FlatCake's reads and writes cost on a simulated node's devices: a restore's read
plan on a worker's SSD channel and host->GPU link (with the memory copies it fills), and
a turn's segment write on its SSD channel. ``systems.flatcake`` and its cluster reads
(``systems.sharing``) charge through these."""

from __future__ import annotations

from flatcake.readplan import ReadPlan
from flatcake.replay.node.node import Node, Worker
from flatcake.replay.systems.keys import refill_wait_s


def charge_plan(node: Node, w: Worker, plan: ReadPlan, refill_bytes: int,
                num_layers: int) -> float:
    """Put ``plan``'s SSD reads on ``w``'s SSD channel and its memory copies on its
    host->GPU link; returns when both are done (and the ``refill_bytes`` of memory
    copies the restore fills are written, ``refill_wait_s``, over ``num_layers``)."""
    now = node.now
    spec = node.spec
    end = now
    if plan.bytes_read:
        # Each GPU of a tensor-parallel worker reads its share with the same plan.
        cmds = plan.num_commands * spec.gpus_per_worker
        t = (spec.ssd.read_time_s(cmds, plan.bytes_read) if not spec.store_command_s
             else plan.bytes_read / spec.ssd.read_bytes_per_s + cmds * spec.store_command_s)
        end = w.ssd.submit(now, t, plan.bytes_read, cmds)
        node.rec.ssd_read(cmds, plan.bytes_read, t)
        if refill_bytes:
            end += refill_wait_s(t, refill_bytes / spec.host_to_gpu_bytes_per_s, num_layers)
    if plan.memory_bytes:
        end = max(end, w.link.submit(now, plan.memory_bytes / spec.host_to_gpu_bytes_per_s,
                                     plan.memory_bytes))
    return end


def write_segment(node: Node, w: Worker, nbytes: int, max_command_bytes: int) -> float:
    """An SSD segment of ``nbytes`` written on ``w``'s SSD channel, in commands of at
    most ``max_command_bytes`` per GPU of the worker; returns when it is written."""
    cmds = -(-nbytes // max_command_bytes) * node.spec.gpus_per_worker
    t = node.spec.ssd.write_time_s(cmds, nbytes)
    end = w.ssd.submit(node.now, t, nbytes, cmds)
    node.rec.ssd_write(cmds, nbytes)
    return end
