"""Beyond one node: the cluster index on Redis (metadata only; bytes travel over NIXL).

``ClusterIndex`` publishes ``block key -> (node, epoch, segment, position)`` once a
segment's bytes are durable, removes entries when the node reclaims, and re-publishes
after restart recovery under a new node epoch; ``RedisServer`` starts a bounded
``redis-server`` on 127.0.0.1 for tests and the multi-node demo. The ``redis`` client is
imported lazily: without it, constructing an index raises a clear error and the tests
skip.
"""

from flatcake.cluster.index import ClusterIndex, RemoteHit, StaleNodeError
from flatcake.cluster.redis_server import RedisServer, redis_available

__all__ = ["ClusterIndex", "RedisServer", "RemoteHit", "StaleNodeError", "redis_available"]
