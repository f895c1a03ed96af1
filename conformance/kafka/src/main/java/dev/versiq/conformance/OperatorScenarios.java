package dev.versiq.conformance;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.RoundingMode;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.function.BiFunction;
import java.util.function.Function;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedTable;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.ValueAndTimestamp;
import org.apache.kafka.streams.state.VersionedKeyValueStore;
import org.apache.kafka.streams.state.VersionedRecord;
import org.apache.kafka.streams.test.TestRecord;

/**
 * Runs DSL-operator scenarios over versioned (and timestamped) tables through real Kafka Streams
 * and prints what Kafka emits.
 *
 * <p>Input (a file named by the first argument): {@code {"scenarios": [{"id", "op" (filter, join,
 * fk_join, aggregate, aggregate_join, aggregate_twice, stream_join), "type" (inner/left/outer), "inputs":
 * [{"kind" (versioned, timestamped, stream), "historyRetentionMs"}, ...], "filter", "foreignKey", "groupBy",
 * "aggregator" (count, sum, count_sum, concat, reduce), "sumOf", "regroupBy", "regroupAggregator",
 * "regroupSumOf", "outputRetentionMs", "records": [{"input", "key",
 * "value" (JSON text or null), "ts"}, ...]}]}}. Records are piped in the order given, each one
 * processed completely (repartition and subscription topics included) before the next: that is
 * the order versiq's merge rule gives the same records. "aggregate_join" is the group-by aggregate
 * of input 0 (as "aggregate" builds it, in a timestamped store of its own) joined by primary key
 * with input 1, a table keyed by group ("type" the join's); its output is the join's results
 * (versiq: an aggregate whose group partition also reads the store it is joined with).
 * "aggregate_twice" is that aggregate ({@code groupBy}, {@code aggregator}, {@code sumOf}) grouped
 * again, its result table's rows by {@code regroupBy} ({@code regroupAggregator} of
 * {@code regroupSumOf}): each {@code groupBy} crosses a repartition topic of its own, which the
 * driver hands over before the next input record; its output is the second aggregate's results
 * (store {@code out}), the first's go to the topic {@code first} (store {@code agg}), reported as
 * "emittedFirst" and "latestFirst".
 *
 * <p>Expressions are versiq's expression texts; each one the differential test uses is written
 * here in Java with versiq's meaning (a failure is null) in {@link #extractor}.
 *
 * <p>Output (stdout): {@code {"results": [{"id", "emitted": [{"key", "value", "ts"}, ...],
 * "latest": {key: {"value", "ts"} or null}}]}}: every record the result table (or stream) sent
 * downstream, in order, and the result store's latest record per emitted key (tables only);
 * "aggregate_twice" also the same of its first aggregate ("emittedFirst", "latestFirst").
 */
public final class OperatorScenarios {
  private static final ObjectMapper JSON =
      new ObjectMapper().enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS);
  private static final String OUT_STORE = "out";
  /**
   * The aggregate's store in "aggregate_join" (the join's results are in {@link #OUT_STORE}) and
   * the first aggregate's in "aggregate_twice" (its results also sent to the topic "first").
   */
  private static final String AGG_STORE = "agg";
  /** The second group-by of "aggregate_twice": the first aggregate's group minus its pin (6 characters). */
  static final String REGROUP_BY_COUNT = "concat(substring(key, 1, length(key) - 6), \"c\", value.count)";

  public static void main(String[] args) throws Exception {
    Harness.runAll(args, JSON, "versiq-operators-", OperatorScenarios::run);
  }

  // ---------------------------------------------------------------------------------- values

  /** versiq's parse_value: JSON text to a tree (decimals exact), null stays null. */
  static JsonNode parse(String text) {
    if (text == null) {
      return null;
    }
    try {
      return JSON.readTree(text);
    } catch (Exception e) {
      return null;
    }
  }

  /** A member of an object value, or null (missing member, JSON null, not an object). */
  static JsonNode member(JsonNode value, String name) {
    if (value == null || !value.isObject()) {
      return null;
    }
    JsonNode found = value.get(name);
    return found == null || found.isNull() ? null : found;
  }

  static BigDecimal number(JsonNode node) {
    return node != null && node.isNumber() ? node.decimalValue() : null;
  }

  /** versiq's render_number: an integer when integral, else a plain decimal, no trailing zeros. */
  static String render(BigDecimal n) {
    BigDecimal stripped = n.stripTrailingZeros();
    if (stripped.signum() == 0) {
      return "0";
    }
    return stripped.scale() < 0 ? stripped.setScale(0).toPlainString() : stripped.toPlainString();
  }

  /** versiq's key_string: a string as is, a number rendered, anything else its JSON text. */
  static String keyString(JsonNode node) {
    if (node == null || node.isNull()) {
      return null;
    }
    if (node.isTextual()) {
      return node.asText();
    }
    if (node.isNumber()) {
      return render(node.decimalValue());
    }
    return node.toString();
  }

  /** versiq's int(): a number (or a string holding one) truncated toward zero. */
  static BigInteger toInt(JsonNode node) {
    BigDecimal n = number(node);
    if (n == null && node != null && node.isTextual()) {
      n = number(parse(node.asText().strip()));
    }
    return n == null ? null : n.setScale(0, RoundingMode.DOWN).toBigInteger();
  }

  /** The joined value versiq builds: {"left":L,"right":R} from the two texts, verbatim. */
  static String joined(String left, String right) {
    return "{\"left\":" + (left == null ? "null" : left) + ",\"right\":" + (right == null ? "null" : right) + "}";
  }

  /** {@code value.<name>}: a member path of one name (the differential test's and the bench's). */
  private static final Pattern MEMBER = Pattern.compile("value\\.([A-Za-z_][A-Za-z_0-9]*)");
  /** {@code value.<name> > <number>}: the predicates the differential test and the bench use. */
  private static final Pattern GREATER = Pattern.compile("value\\.([A-Za-z_][A-Za-z_0-9]*) > (-?[0-9]+(\\.[0-9]+)?)");

  /** The member a {@code value.<name>} expression reads. */
  static String memberOf(String expression) {
    Matcher m = MEMBER.matcher(expression);
    if (!m.matches()) {
      throw new IllegalArgumentException("no Java version of the expression " + expression);
    }
    return m.group(1);
  }

  /** The versiq expressions the differential test and the bench use, written in Java (a failure is null). */
  static BiFunction<String, String, String> extractor(String expression) {
    if (MEMBER.matcher(expression).matches()) { // value.f, value.g, value.customer_id, value.region
      String name = memberOf(expression);
      return (k, v) -> keyString(member(parse(v), name));
    }
    switch (expression) {
      case "concat(substring(key, 1, length(key) - 2), int(value) % 3)":
        return (k, v) -> {
          // key minus its last two code points (the harness's keys are ASCII), then int(value) % 3
          BigInteger i = toInt(parse(v));
          if (i == null || k.length() < 2) {
            return null;
          }
          return k.substring(0, k.length() - 2) + i.remainder(BigInteger.valueOf(3));
        };
      case REGROUP_BY_COUNT:
        return (k, v) -> {
          // the key minus its last six code points (a group "x~0012": the scenario's prefix), "c", the count
          String count = keyString(member(parse(v), "count"));
          if (count == null || k.length() < 6) {
            return null;
          }
          return k.substring(0, k.length() - 6) + "c" + count;
        };
      default:
        throw new IllegalArgumentException("no Java version of the expression " + expression);
    }
  }

  /** {@code value.<name> > <number>} (value.n > 3, value.amount > 500): false unless a number. */
  static Predicate<String> predicate(String expression) {
    Matcher m = GREATER.matcher(expression);
    if (!m.matches()) {
      throw new IllegalArgumentException("no Java version of the predicate " + expression);
    }
    String name = m.group(1);
    BigDecimal bound = new BigDecimal(m.group(2));
    return value -> {
      BigDecimal n = number(member(parse(value), name));
      return n != null && n.compareTo(bound) > 0;
    };
  }

  // ------------------------------------------------------------------------------ topologies

  @SuppressWarnings("unchecked")
  private static <V> Materialized<String, V, KeyValueStore<Bytes, byte[]>> store(
      String name, String kind, long retentionMs) {
    if (kind.equals("versioned")) {
      return Materialized.<String, V>as(
          Stores.persistentVersionedKeyValueStore(name, Duration.ofMillis(retentionMs)));
    }
    return Materialized.<String, V>as(Stores.persistentTimestampedKeyValueStore(name));
  }

  private static Materialized<String, String, KeyValueStore<Bytes, byte[]>> stringStore(
      String name, String kind, long retentionMs) {
    return OperatorScenarios.<String>store(name, kind, retentionMs)
        .withKeySerde(Serdes.String())
        .withValueSerde(Serdes.String());
  }

  /**
   * The scenario's topology: its inputs {@code in0, in1, ...} (tables over the stores the scenario
   * names, or a stream), the operator, and its results sent to the topic {@code out} (tables:
   * materialized in the store {@code out}). {@link OperatorBench} builds the same.
   */
  static Topology topology(JsonNode scenario) {
    String op = scenario.get("op").asText();
    String type = scenario.path("type").asText("inner");
    long outRetention = scenario.get("outputRetentionMs").asLong();
    String outKind = scenario.path("outputKind").asText("versioned");
    JsonNode inputs = scenario.get("inputs");
    StreamsBuilder builder = new StreamsBuilder();
    List<KTable<String, String>> tables = new ArrayList<>();
    KStream<String, String> stream = null;
    for (int i = 0; i < inputs.size(); i++) {
      JsonNode in = inputs.get(i);
      String kind = in.get("kind").asText();
      if (kind.equals("stream")) {
        stream = builder.stream("in" + i, Consumed.with(Serdes.String(), Serdes.String()));
        tables.add(null);
      } else {
        tables.add(builder.table("in" + i, Consumed.with(Serdes.String(), Serdes.String()),
            stringStore("in" + i, kind, in.path("historyRetentionMs").asLong(0))));
      }
    }
    ValueJoiner<String, String, String> joiner = OperatorScenarios::joined;
    Materialized<String, String, KeyValueStore<Bytes, byte[]>> out = stringStore(OUT_STORE, outKind, outRetention);
    KStream<String, String> emitted;
    switch (op) {
      case "filter": {
        Predicate<String> predicate = predicate(scenario.get("filter").asText());
        emitted = tables.get(0).filter((k, v) -> predicate.test(v), out).toStream();
        break;
      }
      case "join": {
        KTable<String, String> left = tables.get(0);
        KTable<String, String> right = tables.get(1);
        KTable<String, String> result = type.equals("inner") ? left.join(right, joiner, out)
            : type.equals("left") ? left.leftJoin(right, joiner, out) : left.outerJoin(right, joiner, out);
        emitted = result.toStream();
        break;
      }
      case "fk_join": {
        BiFunction<String, String, String> extract = extractor(scenario.get("foreignKey").asText());
        Function<String, String> fk = v -> extract.apply(null, v);
        KTable<String, String> left = tables.get(0);
        KTable<String, String> right = tables.get(1);
        KTable<String, String> result = type.equals("inner") ? left.join(right, fk, joiner, out)
            : left.leftJoin(right, fk, joiner, out);
        emitted = result.toStream();
        break;
      }
      case "aggregate": {
        emitted = aggregate(scenario, tables.get(0), OUT_STORE, outKind, outRetention).toStream();
        break;
      }
      case "aggregate_join": {
        // the aggregate exactly as "aggregate" builds it (its own timestamped store), then a
        // primary-key join of its results with input 1 (keyed by group) as "join" builds it
        KTable<String, String> left = aggregate(scenario, tables.get(0), AGG_STORE, "timestamped", outRetention);
        KTable<String, String> right = tables.get(1);
        KTable<String, String> result = type.equals("inner") ? left.join(right, joiner, out)
            : type.equals("left") ? left.leftJoin(right, joiner, out) : left.outerJoin(right, joiner, out);
        emitted = result.toStream();
        break;
      }
      case "aggregate_twice": {
        // the aggregate exactly as "aggregate" builds it (its own timestamped store), its results
        // also sent to the topic "first", then its result table grouped again and aggregated
        KTable<String, String> first = aggregate(scenario, tables.get(0), AGG_STORE, "timestamped", outRetention);
        first.toStream().to("first", Produced.with(Serdes.String(), Serdes.String()));
        BiFunction<String, String, String> group = extractor(scenario.get("regroupBy").asText());
        KGroupedTable<String, String> regrouped = first.groupBy(
            (k, v) -> KeyValue.pair(group.apply(k, v), v), Grouped.with(Serdes.String(), Serdes.String()));
        emitted = aggregate(regrouped, scenario.get("regroupAggregator").asText(),
            scenario.path("regroupSumOf").asText("value.sum"), OUT_STORE, outKind, outRetention).toStream();
        break;
      }
      case "stream_join": {
        KTable<String, String> table = tables.get(1);
        Joined<String, String, String> joined = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
        emitted = type.equals("inner") ? stream.join(table, joiner, joined) : stream.leftJoin(table, joiner, joined);
        break;
      }
      default:
        throw new IllegalArgumentException("unknown op " + op);
    }
    emitted.to("out", Produced.with(Serdes.String(), Serdes.String()));
    return builder.build();
  }

  /** The driver's settings: no record cache (every update is forwarded), state under {@code stateDir}. */
  static Properties properties(File stateDir) {
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, "versiq-operators");
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.getAbsolutePath());
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0); // every update is forwarded
    return props;
  }

  private static ObjectNode run(JsonNode scenario, File stateDir) {
    String op = scenario.get("op").asText();
    String outKind = scenario.path("outputKind").asText("versioned");
    JsonNode inputs = scenario.get("inputs");
    ObjectNode result = JSON.createObjectNode();
    result.put("id", scenario.get("id").asText());
    try (TopologyTestDriver driver = new TopologyTestDriver(topology(scenario), properties(stateDir))) {
      List<TestInputTopic<String, String>> topics = new ArrayList<>();
      for (int i = 0; i < inputs.size(); i++) {
        topics.add(driver.createInputTopic("in" + i, new StringSerializer(), new StringSerializer()));
      }
      TestOutputTopic<String, String> topic =
          driver.createOutputTopic("out", new StringDeserializer(), new StringDeserializer());
      boolean twice = op.equals("aggregate_twice");
      TestOutputTopic<String, String> firstTopic =
          twice ? driver.createOutputTopic("first", new StringDeserializer(), new StringDeserializer()) : null;
      ArrayNode records = result.putArray("emitted");
      ArrayNode firstRecords = twice ? result.putArray("emittedFirst") : null;
      Set<String> keys = new LinkedHashSet<>();
      Set<String> firstKeys = new LinkedHashSet<>();
      for (JsonNode rec : scenario.get("records")) {
        JsonNode value = rec.get("value");
        topics.get(rec.get("input").asInt()).pipeInput(rec.get("key").asText(),
            value == null || value.isNull() ? null : value.asText(), Instant.ofEpochMilli(rec.get("ts").asLong()));
        drain(topic, records, keys);
        if (twice) {
          drain(firstTopic, firstRecords, firstKeys);
        }
      }
      if (!op.equals("stream_join")) {
        ObjectNode latest = result.putObject("latest");
        for (String key : keys) {
          latest.set(key, latestRecord(driver, OUT_STORE, key, outKind));
        }
      }
      if (twice) {
        ObjectNode latest = result.putObject("latestFirst");
        for (String key : firstKeys) {
          latest.set(key, latestRecord(driver, AGG_STORE, key, "timestamped"));
        }
      }
    }
    return result;
  }

  /** Append what {@code topic} holds to {@code into} ({"key", "value", "ts"}), its keys to {@code keys}. */
  private static void drain(TestOutputTopic<String, String> topic, ArrayNode into, Set<String> keys) {
    for (TestRecord<String, String> r : topic.readRecordsToList()) {
      ObjectNode node = into.addObject();
      node.put("key", r.key());
      node.put("value", r.value());
      node.put("ts", r.timestamp());
      keys.add(r.key());
    }
  }

  /**
   * The group-by aggregate of {@code table} ({@code groupBy}, {@code aggregator}, {@code sumOf}
   * of the scenario), materialized in the store {@code name}, its values rendered as versiq's.
   */
  private static KTable<String, String> aggregate(
      JsonNode scenario, KTable<String, String> table, String name, String kind, long retention) {
    BiFunction<String, String, String> group = extractor(scenario.get("groupBy").asText());
    KGroupedTable<String, String> grouped = table.groupBy(
        (k, v) -> KeyValue.pair(group.apply(k, v), v), Grouped.with(Serdes.String(), Serdes.String()));
    return aggregate(grouped, scenario.get("aggregator").asText(), scenario.path("sumOf").asText("value.n"),
        name, kind, retention);
  }

  /**
   * Kafka's count/sum/concat/reduce, each written as versiq's pipeline declares it; count_sum is
   * versiq's {@code aggregate: {count: true, sum: <sumOf>}} (the bench's), kept as "count,sum".
   */
  private static KTable<String, String> aggregate(KGroupedTable<String, String> grouped, String aggregator,
      String sumOf, String name, String kind, long retention) {
    String field = memberOf(sumOf);
    switch (aggregator) {
      case "count": // versiq: aggregate: {count: true} -> {"count":n}
        return grouped.count(OperatorScenarios.<Long>store(name, kind, retention)
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
            .mapValues(n -> n == null ? null : "{\"count\":" + n + "}");
      case "sum": // versiq: aggregate: {sum: "value.n"} -> {"sum":x}; non-numbers add nothing
        return grouped.aggregate(
                () -> "0",
                (k, v, agg) -> sumStep(agg, field, v, 1),
                (k, v, agg) -> sumStep(agg, field, v, -1),
                stringStore(name, kind, retention))
            .mapValues(s -> s == null ? null : "{\"sum\":" + s + "}");
      case "count_sum": // versiq: aggregate: {count: true, sum: "value.amount"} -> {"count":n,"sum":x}
        return grouped.aggregate(
                () -> "0,0",
                (k, v, agg) -> countSumStep(agg, field, v, 1),
                (k, v, agg) -> countSumStep(agg, field, v, -1),
                stringStore(name, kind, retention))
            .mapValues(s -> {
              if (s == null) {
                return null;
              }
              int comma = s.indexOf(',');
              return "{\"count\":" + s.substring(0, comma) + ",\"sum\":" + s.substring(comma + 1) + "}";
            });
      case "concat": // versiq: aggregate: {init: '"0"', add: 'concat(agg, "+", value.n)', subtract: ...}
        return grouped.aggregate(
                () -> "0",
                (k, v, agg) -> concatStep(agg, "+", v),
                (k, v, agg) -> concatStep(agg, "-", v),
                stringStore(name, kind, retention))
            .mapValues(s -> s == null ? null : JSON.getNodeFactory().textNode(s).toString());
      case "reduce": // versiq: reduce: {add: "agg + value", subtract: "agg - value"} (number values)
        return grouped.reduce(
                (agg, v) -> arithmetic(agg, v, 1),
                (agg, v) -> arithmetic(agg, v, -1),
                stringStore(name, kind, retention));
      default:
        throw new IllegalArgumentException("unknown aggregator " + aggregator);
    }
  }

  static String sumStep(String agg, String field, String value, int sign) {
    BigDecimal n = number(member(parse(value), field));
    if (n == null) {
      return agg;
    }
    BigDecimal total = new BigDecimal(agg);
    return render(sign > 0 ? total.add(n) : total.subtract(n));
  }

  static String countSumStep(String agg, String field, String value, int sign) {
    int comma = agg.indexOf(',');
    long count = Long.parseLong(agg.substring(0, comma)) + sign;
    return count + "," + sumStep(agg.substring(comma + 1), field, value, sign);
  }

  static String concatStep(String agg, String separator, String value) {
    BigDecimal n = number(member(parse(value), "n"));
    return agg == null || n == null ? null : agg + separator + render(n);
  }

  static String arithmetic(String agg, String value, int sign) {
    BigDecimal a = number(parse(agg));
    BigDecimal b = number(parse(value));
    if (a == null || b == null) {
      return null;
    }
    return render(sign > 0 ? a.add(b) : a.subtract(b));
  }

  @SuppressWarnings("unchecked")
  private static JsonNode latestRecord(TopologyTestDriver driver, String storeName, String key, String outKind) {
    Object found;
    long ts;
    if (outKind.equals("versioned")) {
      VersionedKeyValueStore<String, Object> store =
          (VersionedKeyValueStore<String, Object>) driver.getAllStateStores().get(storeName);
      VersionedRecord<Object> rec = store.get(key);
      if (rec == null) {
        return JSON.nullNode();
      }
      found = rec.value();
      ts = rec.timestamp();
    } else {
      KeyValueStore<String, ValueAndTimestamp<Object>> store = driver.getTimestampedKeyValueStore(storeName);
      ValueAndTimestamp<Object> rec = store.get(key);
      if (rec == null) {
        return JSON.nullNode();
      }
      found = rec.value();
      ts = rec.timestamp();
    }
    ObjectNode node = JSON.createObjectNode();
    node.put("value", found == null ? null : String.valueOf(found)); // count: the Long
    node.put("ts", ts);
    return node;
  }

  private OperatorScenarios() {}
}
