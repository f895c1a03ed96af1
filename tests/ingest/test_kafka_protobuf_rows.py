"""Kafka values and keys in Confluent's Protobuf wire format (``value_format``/``key_format``
``protobuf``, ingest/records/protobuf.py and registry.py), parsed by ``parse_kafka`` with writer
schemas registered as ``.proto`` text in a real registry (the ``schema_registry`` fixture): the
message the indexes pick is decoded and stored as the JSON docs/contract.md documents (names as in
the .proto, default-valued fields present, 64-bit integers as numbers, enums as names, oneofs,
maps sorted by key, bytes base64, Timestamp RFC 3339, a referenced import); values that cannot be
decoded are ``bad_value`` naming the schema id; keys in the registry's formats (Avro, JSON
Schema, Protobuf) become the documented key text, and undecodable ones ``bad_key``."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import sys
from typing import Any

import fastavro
import pytest

from tests.support.kafka_rows import parse
from tests.support.protobuf_wire import file_descriptors, generate, message_indexes, wire
from versiq.ingest.records import protobuf
from versiq.ingest.records.jsonvalue import strict_loads
from versiq.ingest.records.kafka_rows import KafkaFormat, canonical_key
from versiq.ingest.records.registry import SchemaRegistryError

MONEY_FILE = "versiq_pbrows_money.proto"
MONEY = """syntax = "proto3";
package versiq.money;
message Money { int64 cents = 1; string currency = 2; }
"""
SHOP_FILE = "versiq_pbrows_shop.proto"
SHOP = f"""syntax = "proto3";
package versiq.shop;
import "google/protobuf/timestamp.proto";
import "{MONEY_FILE}";

enum Status {{ STATUS_UNKNOWN = 0; ACTIVE = 1; RETIRED = 2; }}

message Order {{
  message Line {{ string sku = 1; int32 qty = 2; }}
  string id = 1;
  int64 big = 2;
  uint64 ubig = 3;
  sint32 small = 4;
  float ratio = 5;
  double score = 6;
  bool flag = 7;
  bytes blob = 8;
  Status status = 9;
  google.protobuf.Timestamp at = 10;
  Line first_line = 11;
  repeated Line lines = 12;
  map<string, int64> counts = 13;
  map<int32, string> names = 14;
  oneof payment {{ string card = 15; int64 voucher = 16; }}
  optional string note = 17;
  versiq.money.Money total = 18;
  repeated string tags = 19;
  double nan = 20;
}}

message Refund {{
  message Reason {{ string code = 1; int32 level = 2; }}
  string order_id = 1;
  Reason reason = 2;
}}
"""
# The fields of Order in declaration order: the order of the stored JSON's members.
ORDER_FIELDS = ["id", "big", "ubig", "small", "ratio", "score", "flag", "blob", "status", "at", "first_line", "lines",
                "counts", "names", "card", "voucher", "note", "total", "tags", "nan"]


@pytest.fixture(scope="module")
def shop(schema_registry, tmp_path_factory):
    """The generated classes (a producer's) and the schema ids of the shop schema and its import."""
    modules = generate({MONEY_FILE: MONEY, SHOP_FILE: SHOP}, tmp_path_factory.mktemp("pb"))
    money_id = schema_registry.register("versiq-pbrows-money", MONEY, "PROTOBUF")
    shop_id = schema_registry.register("versiq-pbrows-shop-value", SHOP, "PROTOBUF", references=[
        {"name": MONEY_FILE, "subject": "versiq-pbrows-money", "version": 1}])
    return modules["versiq_pbrows_shop"], money_id, shop_id


def full_order(pb: Any) -> Any:
    order = pb.Order(id="o1", big=2**62 + 1, ubig=2**64 - 1, small=-5, ratio=0.1, score=0.1, flag=True,
                     blob=b"\x00\xff", status=pb.ACTIVE, card="4111", note="", tags=["x", "y"], nan=float("nan"))
    order.at.seconds, order.at.nanos = 1_706_702_400, 5_000_000
    order.first_line.sku, order.first_line.qty = "s1", 2
    order.lines.add(sku="s2", qty=1)
    order.lines.add(sku="s3")
    for name, count in [("z", 1), ("a", 2**53 + 1)]:
        order.counts[name] = count
    for number, name in [(10, "ten"), (2, "two"), (-1, "minus one")]:
        order.names[number] = name
    order.total.cents, order.total.currency = 1050, "EUR"
    return order


FULL_JSON = {
    "id": "o1", "big": 2**62 + 1, "ubig": 2**64 - 1, "small": -5, "ratio": 0.1, "score": 0.1, "flag": True,
    "blob": base64.b64encode(b"\x00\xff").decode(), "status": "ACTIVE", "at": "2024-01-31T12:00:00.005Z",
    "first_line": {"sku": "s1", "qty": 2}, "lines": [{"sku": "s2", "qty": 1}, {"sku": "s3", "qty": 0}],
    "counts": {"a": 2**53 + 1, "z": 1}, "names": {"-1": "minus one", "2": "two", "10": "ten"}, "card": "4111",
    "note": "", "total": {"cents": 1050, "currency": "EUR"}, "tags": ["x", "y"], "nan": "NaN",
}


def test_indexes_read_as_confluent_writes_them():
    assert protobuf.read_indexes(b"\x00\x00", 1) == ([0], 2)
    assert protobuf.read_indexes(b"\x00" + message_indexes([1]) + b"rest", 1) == ([1], 3)
    assert message_indexes([1, 0]) == b"\x04\x02\x00"  # count 2, then 1 and 0, zigzag
    assert protobuf.read_indexes(message_indexes([1, 0]), 0) == ([1, 0], 3)
    assert protobuf.read_indexes(message_indexes([300, 70]), 0)[0] == [300, 70]
    for bad, message in [(b"", "end in the middle"), (b"\x04\x02", "end in the middle"), (b"\x01", "count is -1"),
                         (b"\x02\x01", "negative"), (b"\xff\xff\xff\xff\xff\x01", "longer than 5 bytes")]:
        with pytest.raises(ValueError, match=message):
            protobuf.read_indexes(bad, 0)


def test_every_protobuf_type_becomes_the_documented_json(schema_registry, shop):
    pb, _money_id, shop_id = shop
    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url, timestamp_field="at")
    [row] = parse([wire(shop_id, full_order(pb))], fmt)
    assert row["reason"] is None, row["detail"]
    value = json.loads(row["value"])
    assert value == FULL_JSON
    assert list(value) == [f for f in ORDER_FIELDS if f in FULL_JSON]  # declaration order; the unset oneof member out
    assert row["value"] == json.dumps(FULL_JSON, separators=(",", ":"), ensure_ascii=False)  # compact
    assert row["ts"] == 1_706_702_400_005  # timestamp_field reads the Timestamp's RFC 3339 text
    assert json.loads(row["value"])["big"] == 2**62 + 1 and '"ubig":18446744073709551615' in row["value"]


def test_defaults_oneofs_and_presence(schema_registry, shop):
    pb, _money_id, shop_id = shop
    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url)
    empty, voucher = pb.Order(), pb.Order(voucher=7, big=0)
    rows = parse([wire(shop_id, empty), wire(shop_id, voucher), wire(shop_id, pb.Order(id="a", big=1)), None], fmt)
    assert [r["reason"] for r in rows] == [None] * 4, [r["detail"] for r in rows]
    defaults = {"id": "", "big": 0, "ubig": 0, "small": 0, "ratio": 0.0, "score": 0.0, "flag": False, "blob": "",
                "status": "STATUS_UNKNOWN", "lines": [], "counts": {}, "names": {}, "tags": [], "nan": 0.0}
    # an empty message is not a tombstone: every field without presence, with its default
    assert json.loads(rows[0]["value"]) == defaults
    assert list(json.loads(rows[0]["value"])) == [f for f in ORDER_FIELDS if f in defaults]
    assert json.loads(rows[1]["value"]) == {**defaults, "voucher": 7}  # the oneof's member that is set
    # the members' order does not depend on which fields hold their default
    assert list(json.loads(rows[2]["value"])) == list(json.loads(rows[0]["value"]))
    assert (rows[3]["value"], rows[3]["ts"]) == (None, 1_003)  # a null value: a tombstone


def test_a_second_message_and_a_nested_one_are_picked_by_the_indexes(schema_registry, shop):
    pb, _money_id, shop_id = shop
    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url)
    refund = pb.Refund(order_id="o1")
    refund.reason.code = "damaged"
    rows = parse([wire(shop_id, refund, [1]), wire(shop_id, pb.Refund.Reason(code="late", level=2), [1, 0]),
                  wire(shop_id, pb.Order.Line(sku="s", qty=3), [0, 0]), wire(shop_id, refund, [2]),
                  wire(shop_id, refund, [1, 5])], fmt)
    assert [json.loads(r["value"]) if r["value"] else None for r in rows[:3]] == [
        {"order_id": "o1", "reason": {"code": "damaged", "level": 0}}, {"code": "late", "level": 2},
        {"sku": "s", "qty": 3}]
    assert rows[3]["reason"] == "bad_value", rows[3]
    assert f"schema id {shop_id}: message index 2 (indexes [2]) is not a message of the schema's top level, which " \
           "has 2" in rows[3]["detail"]
    assert rows[4]["reason"] == "bad_value" and "versiq.shop.Refund, which has 1" in rows[4]["detail"], rows[4]


def test_a_referenced_schema_alone_and_the_cache(schema_registry, shop):
    pb, money_id, shop_id = shop
    from versiq.ingest.records import registry as wire_module

    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url)
    money = sys.modules["versiq_pbrows_money_pb2"]  # generated by the shop fixture
    [row] = parse([wire(money_id, money.Money(cents=-3, currency="USD"))], fmt)
    assert json.loads(row["value"]) == {"cents": -3, "currency": "USD"}
    built = wire_module.client(schema_registry.url).schema(shop_id)
    assert built is not None and built.schema_type == "PROTOBUF" and built.error is None
    assert wire_module.client(schema_registry.url).schema(shop_id) is built  # built once per schema id per process
    assert isinstance(built.parsed, protobuf.ProtoSchema)
    assert pb is not None


def test_schemas_registered_as_base64_file_descriptors(schema_registry, shop, tmp_path):
    """A schema registered as the base64 of a serialized FileDescriptorProto (protoc's, here), as
    some producers register it, and references in either form: the same classes, the same JSON."""
    pb, _money_id, _shop_id = shop
    descriptors = file_descriptors({MONEY_FILE: MONEY, SHOP_FILE: SHOP}, tmp_path / "descriptors")
    encoded = {name: base64.b64encode(data).decode() for name, data in descriptors.items()}
    money_b64_id = schema_registry.register("versiq-pbrows-money-b64", encoded[MONEY_FILE], "PROTOBUF")
    assert schema_registry.schema(money_b64_id)["schema"] == encoded[MONEY_FILE]  # kept as registered

    def money_reference(subject: str) -> list[dict[str, Any]]:
        return [{"name": MONEY_FILE, "subject": subject, "version": 1}]

    ids = [  # the schema as a descriptor, its import as text; both descriptors; the schema as text, its import not
        schema_registry.register("versiq-pbrows-shop-b64-value", encoded[SHOP_FILE], "PROTOBUF",
                                 references=money_reference("versiq-pbrows-money")),
        schema_registry.register("versiq-pbrows-shop-b64-b64-value", encoded[SHOP_FILE], "PROTOBUF",
                                 references=money_reference("versiq-pbrows-money-b64")),
        schema_registry.register("versiq-pbrows-shop-text-b64-value", SHOP, "PROTOBUF",
                                 references=money_reference("versiq-pbrows-money-b64")),
    ]
    refund = pb.Refund(order_id="o1")
    refund.reason.code = "late"
    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url)
    values = [value for schema_id in ids for value in (wire(schema_id, full_order(pb)), wire(schema_id, refund, [1]))]
    rows = parse([*values, wire(money_b64_id, sys.modules["versiq_pbrows_money_pb2"].Money(cents=1))], fmt)
    assert [r["reason"] for r in rows] == [None] * len(rows), [r["detail"] for r in rows]
    for order, refunded in zip(rows[0:6:2], rows[1:6:2], strict=True):
        assert order["value"] == json.dumps(FULL_JSON, separators=(",", ":"), ensure_ascii=False)
        assert json.loads(refunded["value"]) == {"order_id": "o1", "reason": {"code": "late", "level": 0}}
    assert json.loads(rows[6]["value"]) == {"cents": 1, "currency": ""}
    # a descriptor whose import is not among its references does not link: its records are bad_value
    unlinked_id = schema_registry.register("versiq-pbrows-shop-unlinked-value", encoded[SHOP_FILE], "PROTOBUF")
    [row] = parse([wire(unlinked_id, full_order(pb))], fmt)
    assert row["reason"] == "bad_value" and f"schema id {unlinked_id}: the Protobuf schema does not compile" in \
        row["detail"] and MONEY_FILE in row["detail"], row


def test_which_texts_are_serialized_descriptors(tmp_path):
    serialized = file_descriptors({"versiq_pbrows_detect.proto": 'syntax = "proto3";\nmessage D { int32 x = 1; }\n'},
                                  tmp_path)["versiq_pbrows_detect.proto"]
    found = protobuf.serialized_file(base64.b64encode(serialized).decode())
    assert found is not None and [m.name for m in found.message_type] == ["D"]
    wrapped = base64.encodebytes(serialized).decode()  # MIME's line breaks: whitespace is ignored
    assert "\n" in wrapped and protobuf.serialized_file(wrapped) == found
    not_descriptors = [SHOP, MONEY, "", "  ", "message A {}", base64.urlsafe_b64encode(b"\xfb\xff").decode(),
                       base64.b64encode(b"\xf8\x07\x01").decode()]  # the last: a descriptor declaring nothing
    for text in not_descriptors:
        assert protobuf.serialized_file(text) is None, text
    # the schema built from the descriptor is the one built from the text
    from_text = protobuf.build('syntax = "proto3";\nmessage D { int32 x = 1; }\n', {})
    from_descriptor = protobuf.build(base64.b64encode(serialized).decode(), {})
    assert from_descriptor.file == from_text.file
    _name, cls = from_descriptor.message_class([0])
    assert from_descriptor.to_json(cls(x=5)) == {"x": 5}


def test_floats_are_the_shortest_text_as_in_avro(schema_registry, shop):
    pb, _money_id, shop_id = shop
    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url)
    ratios = [1e-45, 1 / 3, 3.4028234663852886e38, 16777217.0, float("-inf")]
    rows = parse([wire(shop_id, pb.Order(ratio=ratio, score=ratio)) for ratio in ratios], fmt)
    # a float: the shortest text that reads back as it (ProtoJSON's own would write 1.4013e-45); a double: itself
    assert [json.loads(r["value"])["ratio"] for r in rows] == [1e-45, 0.33333334, 3.4028235e38, 16777216.0,
                                                                "-Infinity"]
    assert [json.loads(r["value"])["score"] for r in rows] == [1e-45, 1 / 3, 3.4028234663852886e38, 16777217.0,
                                                                "-Infinity"]


def test_values_that_cannot_be_decoded_are_bad_value_naming_the_schema_id(schema_registry, shop):
    pb, _money_id, shop_id = shop
    avro_id = schema_registry.register("versiq-pbrows-avro-value", {"type": "record", "name": "R", "fields": []})
    bad_id = schema_registry.register("versiq-pbrows-bad-value", 'syntax = "proto3";\nmessage A { Missing m = 1; }\n',
                                      "PROTOBUF")
    good = wire(shop_id, pb.Order(id="o1", big=5))
    fmt = KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url)
    cases = {
        b'{"id": "o1"}': "magic byte 0 (first byte 0x7b)",
        b"\x00\x00\x01": "3 byte(s), shorter than",
        b"\x00" + struct.pack(">I", 987_654) + good[5:]: "schema id 987654 is not in the schema registry (404)",
        good[:5]: f"schema id {shop_id}: the message indexes end in the middle of a varint",
        good[:-1]: f"schema id {shop_id}: the payload is not a versiq.shop.Order message",
        good[:6] + b"\x0a\x05ab": f"schema id {shop_id}: the payload is not a versiq.shop.Order message",
        b"\x00" + struct.pack(">I", avro_id) + b"\x00": f"schema id {avro_id} is a AVRO schema, not PROTOBUF "
                                                         "(value_format protobuf)",
        b"\x00" + struct.pack(">I", bad_id) + b"\x00": f"schema id {bad_id}: the Protobuf schema does not compile: ",
    }
    rows = parse(list(cases), fmt)
    for row, (value, expected) in zip(rows, cases.items(), strict=True):
        assert row["reason"] == "bad_value" and expected in row["detail"], (value, row["detail"])
        assert row["value"] is None
    assert '"Missing" is not defined' in rows[-1]["detail"], rows[-1]["detail"]


def test_a_registry_that_cannot_be_asked_raises(schema_registry, shop, monkeypatch):
    from tests.ingest.test_kafka_registry_rows import recorded_pauses
    from tests.support.server_process import free_ports
    from versiq.ingest.records.registry import RETRY_PAUSES_S

    pauses = recorded_pauses(monkeypatch)  # each request tried after every pause, none slept
    pb, _money_id, shop_id = shop
    (closed,) = free_ports(1)
    down = KafkaFormat(value_format="protobuf", schema_registry=f"http://127.0.0.1:{closed}")
    with pytest.raises(SchemaRegistryError, match="cannot be reached"):
        parse([wire(shop_id, pb.Order())], down)
    assert pauses == list(RETRY_PAUSES_S)
    keys_down = KafkaFormat(key_format="protobuf", schema_registry=f"http://127.0.0.1:{closed}")
    with pytest.raises(SchemaRegistryError, match="cannot be reached"):
        parse([b"{}"], keys_down, keys=[wire(shop_id, pb.Order())])
    assert pauses == [*RETRY_PAUSES_S, *RETRY_PAUSES_S]


# ------------------------------------------------------------------------------------------ keys
def avro_wire(schema_id: int, schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


KEY = {"type": "record", "name": "OrderKey", "namespace": "versiq.keys",
       "fields": [{"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}]}
# The same logical key, its fields in the other order (a second writer's schema)
KEY_SWAPPED = {**KEY, "fields": [KEY["fields"][1], KEY["fields"][0]]}


def test_avro_keys(schema_registry):
    key_id = schema_registry.register("versiq-pbrows-keys-key", KEY)
    swapped_id = schema_registry.register("versiq-pbrows-keys2-key", KEY_SWAPPED)
    string_id = schema_registry.register("versiq-pbrows-skey-key", json.dumps("string"))
    long_id = schema_registry.register("versiq-pbrows-lkey-key", json.dumps("long"))
    nullable_id = schema_registry.register("versiq-pbrows-nkey-key", ["null", "string"])
    fmt = KafkaFormat(key_format="avro", schema_registry=schema_registry.url)
    keys = [avro_wire(key_id, KEY, {"tenant": "t1", "id": 7}),
            avro_wire(swapped_id, KEY_SWAPPED, {"id": 7, "tenant": "t1"}),
            avro_wire(string_id, "string", "plain ü"),
            avro_wire(long_id, "long", -42),
            avro_wire(nullable_id, ["null", "string"], None),
            avro_wire(string_id, "string", ""),
            b"plain",
            None,
            avro_wire(key_id, KEY, {"tenant": "t1", "id": 7})[:-1]]
    rows = parse([b'{"v":1}'] * len(keys), fmt, keys=keys)
    assert [(r["key"], r["reason"]) for r in rows[:4]] == [
        ('{"id":7,"tenant":"t1"}', None), ('{"id":7,"tenant":"t1"}', None), ("plain ü", None), ("-42", None)]
    assert all(r["value"] == '{"v":1}' for r in rows[:4])
    bad = [(r["reason"], r["detail"]) for r in rows[4:]]
    assert bad[0] == ("bad_key", f"schema id {nullable_id}: the decoded key is null")
    assert bad[1] == ("bad_key", f"schema id {string_id}: the decoded key is the empty string")
    assert bad[2][0] == "bad_key" and "the key does not start with the schema registry's magic byte 0" in bad[2][1]
    assert bad[3] == ("bad_key", "the record has no key (null)")
    assert bad[4][0] == "bad_key" and f"schema id {key_id}: the payload is not Avro data" in bad[4][1]


def test_json_schema_and_protobuf_keys(schema_registry, shop):
    pb, _money_id, shop_id = shop
    json_id = schema_registry.register("versiq-pbrows-jkey-key", {"$schema": "http://json-schema.org/draft-07/schema#",
                                                                 "type": "object"}, "JSON")
    header = b"\x00" + struct.pack(">I", json_id)
    fmt = KafkaFormat(key_format="json_sr", schema_registry=schema_registry.url)
    rows = parse([b"1"] * 5, fmt, keys=[header + b'{"b": {"y": 1, "x": [2, {"d": 0, "c": 1.50}]}, "a": "\\u00fc"}',
                                        header + b'"text"', header + b"12", header + b"{oops", header + b"null"])
    assert [r["key"] for r in rows[:3]] == ['{"a":"ü","b":{"x":[2,{"c":1.50,"d":0}],"y":1}}', "text", "12"]
    assert rows[3]["reason"] == "bad_key" and f"schema id {json_id}: the key is not JSON text" in rows[3]["detail"]
    assert rows[4]["reason"] == "bad_key" and "the decoded key is null" in rows[4]["detail"]

    fmt = KafkaFormat(key_format="protobuf", value_format="protobuf", schema_registry=schema_registry.url)
    key = pb.Refund.Reason(code="k", level=3)
    rows = parse([wire(shop_id, pb.Order(id="o")), wire(shop_id, pb.Order(id="o"))], fmt,
                 keys=[wire(shop_id, key, [1, 0]), wire(shop_id, key, [7])])
    assert rows[0]["reason"] is None and rows[0]["key"] == '{"code":"k","level":3}', rows[0]
    assert json.loads(rows[0]["value"])["id"] == "o"
    assert rows[1]["reason"] == "bad_key" and f"schema id {shop_id}: message index 7" in rows[1]["detail"]


def test_canonical_key_rules():
    nested = strict_loads('{"b":1,"a":{"d":[{"z":1,"y":2}],"c":-0}}')
    assert canonical_key(nested) == '{"a":{"c":-0,"d":[{"y":2,"z":1}]},"b":1}'
    assert canonical_key(strict_loads("-0")) == "0"
    assert canonical_key(strict_loads("[3,1]")) == "[3,1]"
    assert canonical_key(strict_loads("true")) == "true"


def test_key_format_settings_are_checked():
    for kwargs, message in [
        ({"key_format": "avro"}, "key_format 'avro' needs a schema registry"),
        ({"key_format": "protobuf", "value_format": "avro"}, "value_format 'avro' and key_format 'protobuf' need a "
                                                             "schema registry"),
        ({"key_format": "json"}, "key_format 'json' is not one of 'string', 'avro', 'json_sr', 'protobuf'"),
        ({"key_format": "avro", "value_format": "debezium", "schema_registry": "http://r:1"},
         "key_format 'avro' does not apply to value_format 'debezium'"),
        ({"schema_registry": "http://r:1"}, "a schema registry applies to value_format or key_format"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            KafkaFormat(**kwargs).validate()
    KafkaFormat(key_format="protobuf", schema_registry="http://r:1").validate()
    KafkaFormat(value_format="protobuf", schema_registry="http://r:1", timestamp_field="at").validate()


WKT_FILE = "versiq_pbrows_wkt.proto"
WKT = """syntax = "proto3";
package versiq.wkt;
import "google/protobuf/any.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/field_mask.proto";
import "google/protobuf/empty.proto";

message Inner { int64 n = 1; map<int64, int64> m = 2; }
message Holder {
  google.protobuf.Int64Value big = 1;
  google.protobuf.StringValue label = 2;
  google.protobuf.Duration took = 3;
  google.protobuf.Struct extra = 4;
  google.protobuf.Any packed = 5;
  google.protobuf.Any packed_wkt = 6;
  google.protobuf.FieldMask mask = 7;
  google.protobuf.Empty nothing = 8;
  repeated google.protobuf.UInt64Value counts = 9;
}
"""


def test_well_known_types(schema_registry, tmp_path):
    pb = generate({WKT_FILE: WKT}, tmp_path / "pb")["versiq_pbrows_wkt"]
    wkt_id = schema_registry.register("versiq-pbrows-wkt-value", WKT, "PROTOBUF")
    holder = pb.Holder()
    holder.big.value = 2**60 + 1
    holder.label.value = "x"
    holder.took.seconds, holder.took.nanos = 1, 500_000_000
    holder.extra.update({"a": [1, "two", None], "b": {"c": True}})
    inner = pb.Inner(n=2**55 + 3)
    inner.m[10], inner.m[-2] = 1, 2**40
    holder.packed.Pack(inner)
    from google.protobuf import wrappers_pb2

    holder.packed_wkt.Pack(wrappers_pb2.Int64Value(value=7))
    holder.mask.paths.extend(["a.b", "c"])
    holder.nothing.SetInParent()
    holder.counts.add(value=2**64 - 1)
    [row] = parse([wire(wkt_id, holder, [1])], KafkaFormat(value_format="protobuf",
                                                           schema_registry=schema_registry.url))
    assert row["reason"] is None, row["detail"]
    assert json.loads(row["value"]) == {
        "big": 2**60 + 1, "label": "x", "took": "1.500s", "extra": {"a": [1, "two", None], "b": {"c": True}},
        "packed": {"@type": "type.googleapis.com/versiq.wkt.Inner", "n": 2**55 + 3, "m": {"-2": 2**40, "10": 1}},
        "packed_wkt": {"@type": "type.googleapis.com/google.protobuf.Int64Value", "value": 7},
        "mask": "a.b,c", "nothing": {}, "counts": [2**64 - 1]}


def test_a_protoc_that_cannot_run_fails_the_run(schema_registry, monkeypatch):
    """Not the schema's fault: SchemaRegistryError (the run fails, nothing committed), not bad_value."""
    schema_id = schema_registry.register("versiq-pbrows-noprotoc-value",
                                         'syntax = "proto3";\nmessage NoProtoc { int32 x = 1; }\n', "PROTOBUF")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(SchemaRegistryError, match=f"schema id {schema_id}: protoc could not compile"):
        parse([b"\x00" + struct.pack(">I", schema_id) + b"\x00"],
              KafkaFormat(value_format="protobuf", schema_registry=schema_registry.url))
