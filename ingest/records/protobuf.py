"""Protobuf writer schemas from a schema registry, and their messages as JSON (``value_format`` and
``key_format`` ``protobuf``; ``records.registry`` fetches the schemas and reads the wire format).

**Building the message classes.** The registry stores a Protobuf schema as ``.proto`` text, or
as the standard base64 of a serialized ``FileDescriptorProto`` (the form some producers register;
``serialized_file`` tells them apart), with a reference (name, subject, version) for each import
other than Google's well-known types. The texts of the schema and its references are written to a
temporary folder (the descriptors to a ``FileDescriptorSet``, each named by its import path) and
compiled by ``protoc`` itself, the copy that ``grpcio-tools`` ships (``python -m
grpc_tools.protoc --descriptor_set_out --include_imports``, with ``--descriptor_set_in`` for the
descriptors, in a subprocess, with the well-known types' ``.proto`` files that ``grpcio-tools``
bundles on the include path): a descriptor is checked and linked to its dependencies as a
compiled text is, and either form may import the other. The ``FileDescriptorSet`` protoc writes
is loaded into a ``DescriptorPool`` of the schema's own, and ``message_factory`` makes the
classes.
Why protoc and not a Python ``.proto`` parser (proto-schema-parser gives an abstract syntax tree,
not descriptors): name resolution, imports, options, proto2/proto3/editions, maps, groups and
every check of the language are the reference compiler's, the same that generated the producer's
classes, so a schema means here exactly what it meant to the producer; grpcio-tools is the gRPC
project's, released with each protobuf release. A subprocess keeps protoc's messages (they
become the detail of the rejection when the text does not compile) and its memory out of the
Spark worker; it runs once per schema id and process (``records.registry`` caches the result).

**Which message.** The wire format's message indexes (``read_indexes``) pick one message of the
schema's file: the first index among its top-level messages in declaration order, each next one
among the nested messages of the previous.

**The JSON** (``ProtoSchema.to_json``): ``json_format.MessageToDict`` (the ProtoJSON rules) with
these choices, made to match the Avro mapping (docs/contract.md, Kafka sources):

- field names as written in the ``.proto`` (``preserving_proto_field_name``), not lowerCamelCase:
  Avro fields keep their names too, and ``timestamp_field`` names a field as its schema spells it;
- every field without presence is present, with its default when unset (``0``, ``""``, ``false``,
  the enum's first name, ``[]``, ``{}``: ``always_print_fields_with_no_presence``), so a record
  has the same members whatever values it holds, like an Avro record; fields with presence
  (message fields, ``optional`` ones, oneof members, proto2 fields) appear only when set, and a
  oneof therefore shows the one member that is set;
- members in the order the ``.proto`` declares the fields (MessageToDict puts the fields it
  prints because they are unset last);
- 64-bit integers (``int64``, ``uint64``, ``sint64``, ``fixed64``, ``sfixed64`` and the
  ``Int64Value``/``UInt64Value`` wrappers) JSON numbers with all their digits, not ProtoJSON's
  strings: Avro's ``long`` is a number, and versiq keeps every digit of a JSON integer;
- a map an object with its entries sorted by key (numerically for integer keys): a Protobuf map
  has no order, and the order of its entries on the wire must not change the stored value;
- the rest is ProtoJSON: enums their value's name (a number the enum does not name, as a
  number), ``bytes`` standard base64, ``float``/``double`` numbers (a ``float``, and a
  ``FloatValue``, as the shortest text that reads back as the same float: ``0.1f`` is ``0.1``,
  ``records.floats``' rule, which the Avro mapping shares), NaN and the infinities the
  strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; ``Timestamp`` an RFC 3339 UTC instant
  (``"2024-01-31T12:00:00.005Z"``: 0, 3, 6 or 9 fraction digits), ``Duration`` ``"1.5s"``,
  ``FieldMask`` its paths joined by commas, ``Struct``/``Value``/``ListValue`` the JSON they
  hold, the other wrappers their value, ``Any`` ``{"@type": url, ...fields}`` when its type is
  in the schema (else the record is rejected), ``Empty`` ``{}``; extensions ``"[full.name]"``.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from versiq.ingest.records.floats import shortest_float32

#: How long protoc may take to compile one schema before the run fails (a machine problem).
PROTOC_TIMEOUT_S = 60.0
#: The name the schema's own text gets among its references (any name no import uses).
MAIN_FILE = "versiq-registry/schema.proto"
#: At most this many message indexes (nesting levels) in one value.
MAX_INDEXES = 64
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")
_WRAPPERS_FILE = "google/protobuf/wrappers.proto"
_INT64_WRAPPERS = frozenset({"google.protobuf.Int64Value", "google.protobuf.UInt64Value"})
_FLOAT_WRAPPER = "google.protobuf.FloatValue"
#: The well-known types MessageToDict prints in a form of their own (not a JSON object of fields).
_SPECIAL = frozenset({"google.protobuf.Any", "google.protobuf.Duration", "google.protobuf.FieldMask",
                      "google.protobuf.ListValue", "google.protobuf.Struct", "google.protobuf.Timestamp",
                      "google.protobuf.Value"})


class ProtoUnusable(Exception):
    """The schema's text (or a reference's) does not compile: every record of it is rejected."""


class ProtocFailed(Exception):
    """protoc could not be run at all (missing, killed, timed out): the machine's problem, not the
    schema's; the run fails."""


# ---------------------------------------------------------------- message indexes
def _zigzag_varint(data: bytes, pos: int) -> tuple[int, int]:
    """One zigzag varint (a 32-bit int, at most 5 bytes) at ``pos``: (value, next position)."""
    result = shift = 0
    for i in range(5):
        if pos + i >= len(data):
            raise ValueError("the message indexes end in the middle of a varint")
        byte = data[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos + i + 1
        shift += 7
    raise ValueError("a message index varint is longer than 5 bytes")


def read_indexes(data: bytes, pos: int) -> tuple[list[int], int]:
    """The message indexes of Confluent's Protobuf wire format at ``pos`` (after the 5-byte
    header): a zigzag varint count, then that many zigzag varints; a count of 0 (the single byte
    0) means ``[0]``, the file's first message. (indexes, position of the message bytes);
    ValueError when they cannot be read."""
    count, pos = _zigzag_varint(data, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > MAX_INDEXES:
        raise ValueError(f"the message index count is {count} (at most {MAX_INDEXES})")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag_varint(data, pos)
        if index < 0:
            raise ValueError(f"message index {index} is negative")
        indexes.append(index)
    return indexes, pos


# ---------------------------------------------------------------- building the schema
def _protoc_include() -> str:
    import grpc_tools

    return os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")


def serialized_file(text: str) -> Any | None:
    """The ``FileDescriptorProto`` of which ``text`` is the standard base64 (whitespace aside),
    when it is one that declares something (a name, a package, messages, enums or services), else
    None: ``.proto`` text is never valid base64 (its statements end in ``;`` or ``}``), and bytes
    that happen to parse as an empty descriptor are not taken for a schema."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    compact = "".join(text.split())
    if not compact or len(compact) % 4 or not _BASE64.fullmatch(compact):
        return None
    try:
        found = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(compact, validate=True))
    except (binascii.Error, DecodeError, ValueError):
        return None
    if not (found.name or found.package or found.message_type or found.enum_type or found.service):
        return None
    return found


def build(text: str, imports: dict[str, str]) -> ProtoSchema:
    """The schema of ``text`` whose imports (other than the well-known types) are the texts in
    ``imports`` by import path. Each text is ``.proto`` source or a serialized
    ``FileDescriptorProto`` in base64 (``serialized_file``); protoc reads the descriptors
    (``--descriptor_set_in``, named by their import path, the schema's own by ``MAIN_FILE``) as it
    reads the sources, and checks them as it checks what it compiles. ``ProtoUnusable`` when it
    does not compile; ``ProtocFailed`` when protoc cannot be run."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    for name in imports:
        if not _SAFE_NAME.fullmatch(name) or ".." in name.split("/"):
            raise ProtoUnusable(f"the reference name {name!r} is not a relative .proto path")
    given = descriptor_pb2.FileDescriptorSet()  # the texts that are serialized descriptors
    with tempfile.TemporaryDirectory(prefix="versiq-proto-") as work:
        source = os.path.join(work, "src")
        os.makedirs(source)
        for name, content in [*imports.items(), (MAIN_FILE, text)]:
            serialized = serialized_file(content)
            if serialized is not None:
                serialized.name = name  # the path its dependents import it by (the schema's own: MAIN_FILE)
                given.file.append(serialized)
                continue
            path = os.path.join(source, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as out:
                out.write(content)
        descriptor_set = os.path.join(work, "set.pb")
        command = [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={source}",
                   f"--proto_path={_protoc_include()}", f"--descriptor_set_out={descriptor_set}",
                   "--include_imports", MAIN_FILE]
        if given.file:
            with open(os.path.join(work, "given.pb"), "wb") as out:
                out.write(given.SerializeToString())
            command.insert(3, f"--descriptor_set_in={os.path.join(work, 'given.pb')}")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PROTOC_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, cwd=work)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProtocFailed(f"protoc could not compile a Protobuf schema: {type(exc).__name__}: {exc}") from None
        if done.returncode != 0:
            errors = " ".join((done.stderr or done.stdout).replace(source + os.sep, "").split())
            if done.returncode < 0 or "No module named" in errors:
                raise ProtocFailed(f"protoc could not be run (exit {done.returncode}): {errors[:300]}")
            errors = errors.replace(MAIN_FILE, "the schema")
            raise ProtoUnusable(f"the Protobuf schema does not compile: {errors[:500]}")
        with open(descriptor_set, "rb") as found:
            files = descriptor_pb2.FileDescriptorSet.FromString(found.read()).file
    pool = descriptor_pool.DescriptorPool()
    main = None
    for file in files:  # dependencies first (protoc's order)
        pool.Add(file)
        if file.name == MAIN_FILE:
            main = file
    assert main is not None
    return ProtoSchema(pool, main)


@dataclass
class ProtoSchema:
    """A compiled Protobuf schema: its own descriptor pool, its file's descriptor (to follow the
    message indexes) and the message classes made so far, by indexes."""

    pool: Any
    file: Any  # descriptor_pb2.FileDescriptorProto of the schema's own text
    classes: dict[tuple[int, ...], tuple[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def message_class(self, indexes: list[int]) -> tuple[str, Any]:
        """(full name, class) of the message ``indexes`` pick; LookupError naming what is missing."""
        key = tuple(indexes)
        with self.lock:
            found = self.classes.get(key)
            if found is not None:
                return found
            from google.protobuf import message_factory

            messages, names = self.file.message_type, [self.file.package] if self.file.package else []
            for depth, index in enumerate(indexes):
                if index >= len(messages):
                    where = "the schema's top level" if depth == 0 else ".".join(names)
                    raise LookupError(f"message index {index} (indexes {indexes}) is not a message of {where}, "
                                      f"which has {len(messages)}")
                names.append(messages[index].name)
                messages = messages[index].nested_type
            full_name = ".".join(names)
            found = full_name, message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full_name))
            self.classes[key] = found
            return found

    def to_json(self, message: Any) -> Any:
        """The JSON value of a decoded message (module docstring)."""
        from google.protobuf import json_format

        js = json_format.MessageToDict(message, always_print_fields_with_no_presence=True,
                                       preserving_proto_field_name=True, descriptor_pool=self.pool)
        return self._message(message.DESCRIPTOR, js)

    # The shape MessageToDict gives, in declaration order with 64-bit integers as numbers.
    def _message(self, desc: Any, js: Any) -> Any:
        name = desc.full_name
        if name in _INT64_WRAPPERS and desc.file.name == _WRAPPERS_FILE:
            return int(js)
        if name == _FLOAT_WRAPPER and desc.file.name == _WRAPPERS_FILE and isinstance(js, float):
            return shortest_float32(js)
        if desc.file.name.startswith("google/protobuf/") and (name in _SPECIAL or desc.file.name == _WRAPPERS_FILE):
            return self._any(js) if name == "google.protobuf.Any" else js
        out: dict[str, Any] = {}
        for fd in desc.fields:
            if fd.name in js:
                out[fd.name] = self._field(fd, js[fd.name])
        for member, value in js.items():  # extensions: "[full.name]"
            if member not in out:
                out[member] = value
        return out

    def _any(self, js: dict[str, Any]) -> Any:
        url = js.get("@type")
        if not isinstance(url, str):
            return js
        desc = self.pool.FindMessageTypeByName(url.rsplit("/", 1)[-1])
        if "value" in js and len(js) == 2 and desc.file.name.startswith("google/protobuf/"):
            return {"@type": url, "value": self._message(desc, js["value"])}
        return {"@type": url, **self._message(desc, {k: v for k, v in js.items() if k != "@type"})}

    def _field(self, fd: Any, value: Any) -> Any:
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
            numeric = key_fd.cpp_type in _INTEGER_TYPES
            items = sorted(value.items(), key=(lambda kv: int(kv[0])) if numeric else (lambda kv: kv[0]))
            return {k: self._single(value_fd, v) for k, v in items}
        if fd.is_repeated:
            return [self._single(fd, v) for v in value]
        return self._single(fd, value)

    def _single(self, fd: Any, value: Any) -> Any:
        if fd.message_type is not None:
            return self._message(fd.message_type, value)
        if fd.cpp_type in _INT64_TYPES and isinstance(value, str):
            return int(value)
        if fd.cpp_type == _FLOAT_TYPE and isinstance(value, float):  # not "NaN" and the infinities
            return shortest_float32(value)
        return value


def _cpp_types() -> tuple[frozenset[int], frozenset[int], int]:
    from google.protobuf.descriptor import FieldDescriptor as F

    int64 = frozenset({F.CPPTYPE_INT64, F.CPPTYPE_UINT64})
    return int64, int64 | {F.CPPTYPE_INT32, F.CPPTYPE_UINT32}, F.CPPTYPE_FLOAT


_INT64_TYPES, _INTEGER_TYPES, _FLOAT_TYPE = _cpp_types()
