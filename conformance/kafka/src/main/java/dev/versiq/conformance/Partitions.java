package dev.versiq.conformance;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Kafka's default partition of record keys: what versiq's {@code murmur2} partitioner must give.
 *
 * <p>Input: {@code {"scenarios": [{"key": text, "partitions": n}, ...]}}. Each key is serialized
 * as a producer with a {@code StringSerializer} would (UTF-8); the output gives per scenario
 * {@code Utils.murmur2} of those bytes ({@code "murmur2"}, a signed Java int) and the partition
 * of the producer's built-in partitioner ({@code "partition"}: {@code toPositive(murmur2) % n}).
 */
public final class Partitions {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final StringSerializer KEYS = new StringSerializer();

  private Partitions() {}

  public static void main(String[] args) throws Exception {
    Harness.runAll(args, JSON, "versiq-partitions-", Partitions::run);
  }

  private static ObjectNode run(JsonNode scenario, File unused) {
    byte[] key = KEYS.serialize("topic", scenario.get("key").asText());
    ObjectNode out = JSON.createObjectNode();
    out.put("murmur2", Utils.murmur2(key));
    out.put("partition", BuiltInPartitioner.partitionForKey(key, scenario.get("partitions").asInt()));
    return out;
  }
}
