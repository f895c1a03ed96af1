package dev.versiq.conformance;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.processor.StateStore;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.query.MultiVersionedKeyQuery;
import org.apache.kafka.streams.query.PositionBound;
import org.apache.kafka.streams.query.QueryConfig;
import org.apache.kafka.streams.query.QueryResult;
import org.apache.kafka.streams.query.VersionedKeyQuery;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.TimestampedKeyValueStore;
import org.apache.kafka.streams.state.ValueAndTimestamp;
import org.apache.kafka.streams.state.VersionedKeyValueStore;
import org.apache.kafka.streams.state.VersionedRecord;
import org.apache.kafka.streams.state.VersionedRecordIterator;

/**
 * Runs versioned-store scenarios through real Kafka Streams and prints Kafka's answers.
 *
 * <p>Input (a file named by the first argument): {@code {"scenarios": [{"id", "kind" ("versioned",
 * the default, or "timestamped": a KIP-258 timestamped store, latest reads only), "historyRetentionMs",
 * "partitions": [[{"key", "value" (string or null), "ts"}, ...], ...], "queries": [{"partition",
 * "kind": "latest"|"asof"|"range", "key", "t", "from", "to", "ascending"}, ...]}]}}. Each partition
 * is its own task: one {@link TopologyTestDriver} whose processor puts every record, in order, into
 * a RocksDB versioned store ({@code Stores.persistentVersionedKeyValueStore}) and records the put's
 * return value. Queries then read that store: {@code get(key)}, {@code get(key, t)} and a {@link
 * MultiVersionedKeyQuery} through the store's IQv2 {@code query(...)}.
 *
 * <p>Output (stdout): {@code {"results": [{"id", "puts": [[code, ...], ...], "answers": [...]}]}};
 * an answer is null, a record {@code {"value", "timestamp", "validTo"}} or a list of records.
 */
public final class StoreScenarios {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String STORE = "versioned";

  /** Puts each record into the store and keeps the put's return code. */
  static final class PutProcessor implements Processor<String, String, Void, Void> {
    private final List<Long> codes;
    private VersionedKeyValueStore<String, String> store;

    PutProcessor(List<Long> codes) {
      this.codes = codes;
    }

    @Override
    public void init(ProcessorContext<Void, Void> context) {
      store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, String> record) {
      codes.add(store.put(record.key(), record.value(), record.timestamp()));
    }
  }

  /** KIP-258: keeps the latest value of each key by processing order, with its timestamp. */
  static final class TimestampedProcessor implements Processor<String, String, Void, Void> {
    private final List<Long> codes;
    private TimestampedKeyValueStore<String, String> store;

    TimestampedProcessor(List<Long> codes) {
      this.codes = codes;
    }

    @Override
    public void init(ProcessorContext<Void, Void> context) {
      store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, String> record) {
      if (record.value() == null) {
        store.delete(record.key());
      } else {
        store.put(record.key(), ValueAndTimestamp.make(record.value(), record.timestamp()));
      }
      codes.add(-1L); // a timestamped store has no put outcome: every record is applied
    }
  }

  public static void main(String[] args) throws Exception {
    Harness.runAll(args, JSON, "versiq-conformance-", StoreScenarios::run);
  }

  private static ObjectNode run(JsonNode scenario, File stateDir) {
    long retention = scenario.get("historyRetentionMs").asLong();
    boolean timestamped = scenario.has("kind") && scenario.get("kind").asText().equals("timestamped");
    ObjectNode result = JSON.createObjectNode();
    result.put("id", scenario.get("id").asText());
    ArrayNode puts = result.putArray("puts");
    ArrayNode answers = result.putArray("answers");
    List<TopologyTestDriver> drivers = new ArrayList<>();
    try {
      int p = 0;
      for (JsonNode partition : scenario.get("partitions")) {
        List<Long> codes = new ArrayList<>();
        Topology topology = new Topology();
        topology.addSource("in", new StringDeserializer(), new StringDeserializer(), "changelog");
        if (timestamped) {
          topology.addProcessor("put", () -> new TimestampedProcessor(codes), "in");
          topology.addStateStore(
              Stores.timestampedKeyValueStoreBuilder(
                      Stores.persistentTimestampedKeyValueStore(STORE), Serdes.String(), Serdes.String())
                  .withLoggingDisabled(),
              "put");
        } else {
          topology.addProcessor("put", () -> new PutProcessor(codes), "in");
          topology.addStateStore(
              Stores.versionedKeyValueStoreBuilder(
                      Stores.persistentVersionedKeyValueStore(STORE, Duration.ofMillis(retention)),
                      Serdes.String(), Serdes.String())
                  .withLoggingDisabled(),
              "put");
        }
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "versiq-conformance");
        props.put(StreamsConfig.STATE_DIR_CONFIG, new File(stateDir, "p" + (p++)).getAbsolutePath());
        TopologyTestDriver driver = new TopologyTestDriver(topology, props);
        drivers.add(driver);
        TestInputTopic<String, String> topic =
            driver.createInputTopic("changelog", new StringSerializer(), new StringSerializer());
        for (JsonNode rec : partition) {
          JsonNode value = rec.get("value");
          topic.pipeInput(rec.get("key").asText(), value == null || value.isNull() ? null : value.asText(),
              Instant.ofEpochMilli(rec.get("ts").asLong()));
        }
        ArrayNode out = puts.addArray();
        codes.forEach(out::add);
      }
      for (JsonNode query : scenario.get("queries")) {
        TopologyTestDriver driver = drivers.get(query.get("partition").asInt());
        answers.add(timestamped ? latestTimestamped(driver, query.get("key").asText()) : answer(driver, query));
      }
    } finally {
      for (TopologyTestDriver driver : drivers) {
        driver.close();
      }
    }
    return result;
  }

  @SuppressWarnings("unchecked")
  private static JsonNode answer(TopologyTestDriver driver, JsonNode query) {
    String key = query.get("key").asText();
    String kind = query.get("kind").asText();
    switch (kind) {
      case "latest":
      case "asof": {
        // IQv2 VersionedKeyQuery (KIP-960), as an interactive query asks it. (The store's own
        // get(key, t) leaves validTo out for versions older than the latest; IQv2 fills it in.)
        VersionedKeyQuery<String, String> q = VersionedKeyQuery.withKey(key);
        if (kind.equals("asof")) {
          q = q.asOf(Instant.ofEpochMilli(query.get("t").asLong()));
        }
        StateStore raw = driver.getAllStateStores().get(STORE);
        QueryResult<VersionedRecord<String>> result = raw.query(q, PositionBound.unbounded(), new QueryConfig(false));
        if (!result.isSuccess()) {
          throw new IllegalStateException(result.getFailureReason() + ": " + result.getFailureMessage());
        }
        return record(result.getResult());
      }
      case "range": {
        MultiVersionedKeyQuery<String, String> q = MultiVersionedKeyQuery.withKey(key);
        if (query.hasNonNull("from")) {
          q = q.fromTime(Instant.ofEpochMilli(query.get("from").asLong()));
        }
        if (query.hasNonNull("to")) {
          q = q.toTime(Instant.ofEpochMilli(query.get("to").asLong()));
        }
        q = query.get("ascending").asBoolean() ? q.withAscendingTimestamps() : q.withDescendingTimestamps();
        StateStore raw = driver.getAllStateStores().get(STORE);
        QueryResult<VersionedRecordIterator<String>> result =
            raw.query(q, PositionBound.unbounded(), new QueryConfig(false));
        if (!result.isSuccess()) {
          throw new IllegalStateException(result.getFailureReason() + ": " + result.getFailureMessage());
        }
        ArrayNode records = JSON.createArrayNode();
        try (VersionedRecordIterator<String> it = result.getResult()) {
          while (it.hasNext()) {
            records.add(record(it.next()));
          }
        }
        return records;
      }
      default:
        throw new IllegalArgumentException("unknown query kind " + kind);
    }
  }

  private static JsonNode latestTimestamped(TopologyTestDriver driver, String key) {
    KeyValueStore<String, ValueAndTimestamp<String>> store = driver.getTimestampedKeyValueStore(STORE);
    ValueAndTimestamp<String> found = store.get(key);
    return found == null ? JSON.nullNode() : record(new VersionedRecord<>(found.value(), found.timestamp()));
  }

  private static JsonNode record(VersionedRecord<String> rec) {
    if (rec == null) {
      return JSON.nullNode();
    }
    ObjectNode node = JSON.createObjectNode();
    node.put("value", rec.value());
    node.put("timestamp", rec.timestamp());
    if (rec.validTo().isPresent()) {
      node.put("validTo", rec.validTo().get());
    } else {
      node.putNull("validTo");
    }
    return node;
  }
}
