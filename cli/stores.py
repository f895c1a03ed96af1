"""The commands that change a warehouse's tables besides ingest: ``maintain``, ``erase``,
``drop`` and ``rebuild`` (CLI only: none is exposed over HTTP)."""

from __future__ import annotations

from typing import Any

from versiq.cli.options import add_logging, add_warehouse, runs


def add_maintain(sub: Any) -> None:
    mnt = sub.add_parser(
        "maintain",
        help="compact and vacuum a store",
        description="Compact each bucket of a store to one row per version and drop history that "
        "ended at or before the retention horizon (no query can return it: expired versions are "
        "deleted from the current snapshot for good), and vacuum files no snapshot still needs "
        "(keeping every snapshot younger "
        "than the page-token lifetime, 1 hour) and files no commit ever referenced once older "
        "than that hour (left by a killed ingest or maintain, or a failed write), in the store and "
        "its _rejected, _changelog and _emitted tables (VERSIQ_VACUUM_RETENTION_HOURS sets the "
        "hour). A file a writer may still commit is never removed: every writer holds the store's "
        "writer lock from its first file to its last commit and maintain holds it too, and files "
        "younger than the retention are kept whatever wrote them. Writes go through Delta's Spark "
        "connector, which also writes a checkpoint every 50 commits; a store with nothing to "
        "compact or vacuum starts no Spark.",
    )
    add_warehouse(mnt)
    mnt.add_argument("--store", required=True, help="store name")
    mnt.add_argument("--lock-timeout", default="60s", help="wait this long for another writer")
    add_logging(mnt)
    mnt.set_defaults(run=runs("versiq.ingest.commands", "maintain_command"))


def add_erase(sub: Any) -> None:
    era = sub.add_parser(
        "erase",
        help="erase keys from a store and its derived tables, for good",
        description="Remove every row of the given keys from a store, its _changelog and _rejected "
        "(rejected records whose raw text contains a key too) and the derived tables keyed by its key "
        "(filters, copies, primary-key joins, stream outputs), one Delta commit per table, then delete the "
        "files that held them at once, whatever the vacuum retention: older snapshots that read those files "
        "answer 410 gone. Records the erase (time, user, number of keys, a keyed hash of each) in the store's "
        "_erasures table. Tables that aggregate or join through another key are named, to recompute with "
        "versiq rebuild. Running it again completes an erase that was interrupted. No key or value is "
        "printed or logged.",
    )
    add_warehouse(era)
    era.add_argument("--store", required=True, help="store name")
    era.add_argument("--key", action="append", default=[], help="a key to erase (repeat for several)")
    era.add_argument("--keys-file", metavar="FILE", help="a file of keys to erase, one per line (UTF-8)")
    era.add_argument("--lock-timeout", default="60s", help="wait this long for another writer")
    add_logging(era)
    era.set_defaults(run=runs("versiq.ingest.commands", "erase_command"))


def add_drop(sub: Any) -> None:
    drop = sub.add_parser(
        "drop",
        help="drop a store, stream or derived table from the warehouse (CLI only)",
        description="Remove a store (--store) or a derived table or stream (--table) from the warehouse: its Delta "
        "log first, so the service never reads it half deleted, then all its files, under its writer lock. "
        "Refused while derived tables read it (their inputs, recorded by every derived commit, say so), unless "
        "--cascade drops them too, each before the tables it reads. A drop that was interrupted is completed by "
        "running it again. The service lists the table as gone at its next refresh and frees its serving index. "
        "Exit 2 for an unknown name or a table that others read, 1 when a writer lock was not obtained.",
    )
    add_warehouse(drop)
    which = drop.add_mutually_exclusive_group(required=True)
    which.add_argument("--store", help="the store to drop (a source store, or a derived table kept as a store)")
    which.add_argument("--table", help="the derived table or stream to drop")
    drop.add_argument("--cascade", action="store_true", help="also drop every derived table that reads it")
    drop.add_argument("--lock-timeout", default="60s", help="wait this long for each table's writer")
    add_logging(drop)
    drop.set_defaults(run=runs("versiq.ingest.commands", "drop_command"))


def add_rebuild(sub: Any) -> None:
    reb = sub.add_parser(
        "rebuild",
        help="recompute a derived table from its inputs' current history (CLI only)",
        description="Drop a derived table of the pipeline file (its data, side tables and state) and compute it "
        "again from what its inputs hold now, as a table new to the warehouse starts (docs/derived-tables.md, "
        "'Tables added over an existing store'). Nothing is ingested; a derived table it reads that is behind "
        "its sources is brought up to date in the same run. Refused while other derived tables read it, "
        "unless --cascade rebuilds them too. Exit 2 for a usage error, 1 when the table failed (see the log).",
    )
    add_warehouse(reb)
    reb.add_argument("--config", required=True, help="the YAML pipeline file that defines the table")
    reb.add_argument("--table", required=True, help="the derived table to rebuild")
    reb.add_argument("--cascade", action="store_true", help="also rebuild every derived table that reads it")
    reb.add_argument("--master", default=None, help="Spark master URL (default env SPARK_MASTER, else local[*])")
    reb.add_argument("--lock-timeout", default="60s", help="wait this long for each table's writer")
    add_logging(reb)
    reb.set_defaults(run=runs("versiq.ingest.commands", "rebuild_command"))
