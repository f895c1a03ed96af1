"""``versiq keys``: the key listing of ``GET /v1/stores/{store}/keys`` without a server.

The same engine answers (``Engine.keys``, one snapshot for the whole listing) and every line is
the JSON of one record of the HTTP answer (``service.render``), so a script can switch between
the CLI and the API. The engine loads the warehouse once, without a refresh thread.
"""

from __future__ import annotations

import argparse
import sys

from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.query.api import InvalidQuery, KeysQuery, QueryError, StoreNotFound, UnsupportedQuery
from versiq.query.engine import Engine
from versiq.service.render import entry_json
from versiq.timestamps import TimestampError, parse_timestamp


def keys_command(args: argparse.Namespace) -> int:
    try:
        as_of = None if args.as_of is None else parse_timestamp(args.as_of)
    except TimestampError as exc:
        print(f"versiq keys: --as-of: {exc}", file=sys.stderr)
        return EXIT_USAGE
    query = KeysQuery(args.prefix, args.start, args.end, as_of, args.include_deleted)
    engine = Engine(args.warehouse, refresh_interval_s=3600)
    try:
        engine.refresh()
        snapshot = args.snapshot
        resume: str | None = None
        out = sys.stdout.buffer
        while True:
            page = engine.keys(args.store, query, snapshot=snapshot, resume_after=resume, limit=1000)
            snapshot = page.snapshot  # every page from the first page's snapshot
            for entry in page.entries:
                out.write(entry_json(entry) + b"\n")
            if page.resume_after is None:
                break
            resume = page.resume_after
        out.flush()
    except StoreNotFound:
        print(f"versiq keys: no store named {args.store!r} in {args.warehouse!r}", file=sys.stderr)
        return EXIT_USAGE
    except (InvalidQuery, UnsupportedQuery) as exc:  # --start after --end, --as-of on a timestamped store
        print(f"versiq keys: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except QueryError as exc:
        print(f"versiq keys: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        engine.close()
    return EXIT_OK
