"""Derived tables and stream outputs; semantics in docs/derived-tables.md.

- ``spec``: the ``tables:`` entries of a pipeline file, validated before any data is touched.
- ``state``: in-memory versioned / timestamped table state for the keys a batch touches,
  loaded from the Delta snapshots.
- ``operators``: filter, copy, toTable, stream-table join, table-table join, foreign-key join,
  aggregation: record at a time, exactly docs/semantics.md, rules 13-18 and 23-30.
- ``topology``: the merge of the inputs and the depth-first propagation.
- ``derive``: the derive phase: read the inputs' changelogs, run the topology, write and commit.
"""
