"""What a stretch of WAL is made of, read back with pg_walinspect (a superuser's, PostgreSQL 15
and later): its full-page images, its bytes by kind of record and, on PostgreSQL 16 and later,
by relation.

The prototype reads each phase once it has run (``bench.hot_path_prototype``); a long run reads
as it goes (``WalReader``), because a window writes more than ``max_wal_size`` and a checkpoint
recycles WAL that was not read in time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

# Each kind of record ("Heap/UPDATE", "Btree/INSERT_LEAF", "Transaction/COMMIT", ...): its bytes,
# full-page images included, and the images' bytes alone.
BY_KIND = """
SELECT "resource_manager/record_type" AS kind, combined_size::bigint AS bytes,
       fpi_size::bigint AS fpi_bytes
FROM pg_get_wal_stats(%(start)s::pg_lsn, %(end)s::pg_lsn, true)
WHERE count > 0
"""
# Each record's length shared out over the blocks it names (a record naming several relations
# counts once in all), with its full-page images. Records that name no block (commits,
# checkpoints) are only in BY_KIND. With ``roots``, a partition (or an index of one) counts as
# the partitioned table (or index) it belongs to.
BY_RELATION = """
WITH blocks AS (
    SELECT b.reldatabase, b.relfilenode, b.record_length,
           count(*) OVER (PARTITION BY b.start_lsn) AS named
    FROM pg_get_wal_block_info(%(start)s::pg_lsn, %(end)s::pg_lsn, false) AS b
)
SELECT CASE
           WHEN b.reldatabase <> 0 AND b.reldatabase <> (SELECT oid FROM pg_database
                                                       WHERE datname = current_database())
           THEN '(other databases)'
           ELSE coalesce(CASE WHEN %(roots)s THEN r.relname END, c.relname,
                         'relfilenode ' || b.relfilenode)
       END AS name,
       sum(b.record_length::numeric / b.named)::bigint AS bytes
FROM blocks AS b
LEFT JOIN pg_class AS c ON c.relfilenode = b.relfilenode
LEFT JOIN pg_class AS r ON r.oid = pg_partition_root(c.oid)
GROUP BY 1
"""


def walinspect(conn: psycopg.Connection) -> bool:
    """Whether this session can read the WAL (pg_walinspect, created where it is missing)."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error:
        return False
    return True


def has_block_info(conn: psycopg.Connection) -> bool:
    """Whether this session can read the WAL block by block (``pg_get_wal_block_info``:
    PostgreSQL 16 and later)."""
    if not walinspect(conn):
        return False
    found = conn.execute("SELECT 1 FROM pg_proc WHERE proname = 'pg_get_wal_block_info'")
    return found.fetchone() is not None


def by_kind(conn: psycopg.Connection, start: str, end: str) -> tuple[dict[str, int], int]:
    """The stretch's bytes by kind of record, and how many of them were full-page images."""
    rows = conn.execute(BY_KIND, {"start": start, "end": end}).fetchall()
    return {r["kind"]: int(r["bytes"]) for r in rows}, sum(int(r["fpi_bytes"]) for r in rows)


def by_relation(
    conn: psycopg.Connection, start: str, end: str, roots: bool = False
) -> dict[str, int]:
    rows = conn.execute(BY_RELATION, {"start": start, "end": end, "roots": roots}).fetchall()
    return {r["name"]: int(r["bytes"]) for r in rows if r["bytes"]}


def per_delivery(bytes_by_name: dict[str, int], deliveries: int) -> dict[str, float]:
    """Bytes per delivery, largest first, leaving out what rounds to nothing."""
    found = {name: round(n / deliveries, 1) for name, n in bytes_by_name.items()}
    return dict(sorted(((k, v) for k, v in found.items() if v >= 0.1), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class WalRead:
    """What a WalReader has read since it began: the images' bytes, the bytes by kind of
    record and by relation, and how many stretches it could not read (two reads with the same
    count bound an exact figure)."""

    images: int = 0
    lost: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    relations: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: WalRead) -> WalRead | None:
        """What was read between ``earlier`` and this, or None where a stretch was lost."""
        if self.lost != earlier.lost:
            return None
        return WalRead(
            self.images - earlier.images,
            0,
            _minus(self.kinds, earlier.kinds),
            _minus(self.relations, earlier.relations),
        )


def _minus(now: dict[str, int], then: dict[str, int]) -> dict[str, int]:
    return {k: v - then.get(k, 0) for k, v in now.items() if v - then.get(k, 0)}


def _plus(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    return {k: total.get(k, 0) + more.get(k, 0) for k in total.keys() | more.keys()}


class WalReader:
    """Reads the WAL every few seconds as it is written, from where it began; ``mark(lsn)``
    reads up to ``lsn`` and returns all it has read (a WalRead). With ``roots``, by relation
    a partition counts as its partitioned table (BY_RELATION)."""

    EVERY_SECONDS = 10.0

    def __init__(self, conn: psycopg.Connection, roots: bool = False) -> None:
        self.conn = conn
        self.roots = roots
        self.block_info = has_block_info(conn)
        self.lsn = _flushed(conn)
        self.read = WalRead()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-reader", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, url: str, roots: bool = False) -> WalReader | None:
        """A reader, or None where this session cannot read the WAL."""
        try:
            conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        except psycopg.Error:
            return None
        if not walinspect(conn):
            conn.close()
            return None
        return cls(conn, roots)

    def mark(self, lsn: str) -> WalRead:
        with self._lock:
            if _lsn(lsn) > _lsn(self.lsn):
                self.read = self._read(self.lsn, lsn)
                self.lsn = lsn
            return self.read

    def _read(self, start: str, end: str) -> WalRead:
        try:
            kinds, images = by_kind(self.conn, start, end)
            relations = by_relation(self.conn, start, end, self.roots) if self.block_info else {}
        except psycopg.Error:
            return WalRead(
                self.read.images, self.read.lost + 1, self.read.kinds, self.read.relations
            )
        return WalRead(
            self.read.images + images,
            self.read.lost,
            _plus(self.read.kinds, kinds),
            _plus(self.read.relations, relations),
        )

    def _run(self) -> None:
        while not self._stopped.wait(self.EVERY_SECONDS):
            with self._lock:
                lsn = _flushed(self.conn)
            self.mark(lsn)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)
        self.conn.close()


def _flushed(conn: psycopg.Connection) -> str:
    # Where the WAL is flushed to: the furthest pg_walinspect reads on PostgreSQL 15.
    return conn.execute("SELECT pg_current_wal_flush_lsn()::text AS lsn").fetchone()["lsn"]


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return int(high, 16) << 32 | int(low, 16)


def breakdown(read: WalRead | None, deliveries: int) -> dict[str, Any]:
    """A stretch's bytes per delivery by kind of record and by relation (empty where the
    stretch could not all be read)."""
    if read is None or not deliveries:
        return {"wal_by_kind_per_delivery": {}, "wal_by_relation_per_delivery": {}}
    return {
        "wal_by_kind_per_delivery": per_delivery(read.kinds, deliveries),
        "wal_by_relation_per_delivery": per_delivery(read.relations, deliveries),
    }
