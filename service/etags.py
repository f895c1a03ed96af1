"""Conditional GETs of ``/v1`` reads: every 200 carries an ``ETag`` and a
request whose ``If-None-Match`` names it is answered 304 Not Modified, without a body.

The tag is a hash of the answer's bytes. An answer is a function of the store (or stream), its
snapshot and the query, and each answer names its snapshot, so equal bytes mean the same
snapshot and the same question: a client polling a key sees 304 until a commit changes its
answer, even when other commits moved the store on. (Hashing the bytes, rather than composing a
tag from the snapshot and the query, keeps the tag right for every route without a second
description of what each answer depends on.)
"""

from __future__ import annotations

import hashlib


def etag_of(body: bytes) -> str:
    """The strong entity tag of an answer: a quoted 128-bit BLAKE2b of its bytes."""
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` (RFC 9110, 13.1.2: weak comparison, a list, or ``*``) matches."""
    if not if_none_match:
        return False
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return any(tag == "*" or tag.removeprefix("W/") == etag for tag in tags)
