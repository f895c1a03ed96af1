package dev.versiq.conformance;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.AppInfoParser;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.test.TestRecord;

/**
 * Kafka Streams' throughput on bench/derived_bench.py's generated sources: one operator's
 * topology (the differential test's, {@link OperatorScenarios#topology}) driven with the bench's
 * records, for bench/derived_vs_kafka_streams.py.
 *
 * <p>Input (a file named by the first argument): an {@link OperatorScenarios} scenario without
 * {@code records}, each input naming its source {@code files} in versiq's order of one run
 * (rule 20: relative path, then line). The files are JSON lines {@code {"key", "value" (JSON or
 * null), "timestamp"}}, streamed (never held in memory) and merged as versiq's merge does
 * (rule 23): the head with the smallest timestamp next, ties to stores before streams, then to
 * the input declared first. Optional: {@code warmUpRecords} (default 50,000); {@code outputFile}:
 * the measured pass's outputs are written there, a JSON line {@code {"key", "value", "ts"}} each
 * (for the test that checks them; it slows the pass).
 *
 * <p>Three passes over the same records: a warm-up (the first {@code warmUpRecords} records,
 * through their own driver, timed alone, so the measured pass runs on a warm JVM), a read-only
 * pass (files read, parsed and merged, nothing piped: the reading's share of the measured pass),
 * then the measured pass through a fresh driver: {@code seconds} is its wall time (reading and
 * merging included, the driver's construction and closing excluded), {@code pipe_seconds} the
 * time inside {@code pipeInput} and reading the output topic.
 *
 * <p>TopologyTestDriver is single-threaded, synchronous and in memory, without a broker: every
 * record is processed completely (repartition and subscription topics included) before the next,
 * on one thread, with no produce or fetch round trips to a broker: Kafka Streams' processing
 * (RocksDB stores, serdes, the DSL's processors) on one core, favourable to Kafka Streams in that
 * respect. One cost it adds: it commits after every input record (the stores' positions written,
 * offsets checkpointed), where an application commits every {@code commit.interval.ms}; a JFR
 * profile of the filter put about a third of the samples there (docs/benchmarks.md).
 *
 * <p>Output: a JSON object on stdout; a readable summary on stderr.
 */
public final class OperatorBench {
  private static final ObjectMapper JSON = new ObjectMapper();
  static final String DRIVER_NOTE = "Kafka Streams TopologyTestDriver: single-threaded, synchronous, in memory, "
      + "no broker (no produce or fetch round trips), one core; it commits after every input record "
      + "(an application commits every commit.interval.ms)";

  private OperatorBench() {}

  /** One source record. */
  record Rec(String key, String value, long ts) {}

  /** One input's records in its own order: its files one after the other, line by line. */
  static final class Source implements AutoCloseable {
    private final List<String> files;
    private int file = -1;
    private BufferedReader reader;
    Rec head;

    Source(List<String> files) {
      this.files = files;
      advance();
    }

    /** Moves {@link #head} to the next record (null at the end). */
    void advance() {
      try {
        while (true) {
          if (reader != null) {
            String line = reader.readLine();
            if (line != null) {
              if (!line.isBlank()) {
                head = parse(line);
                return;
              }
              continue;
            }
            reader.close();
            reader = null;
          }
          if (++file >= files.size()) {
            head = null;
            return;
          }
          reader = Files.newBufferedReader(Path.of(files.get(file)), StandardCharsets.UTF_8);
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    @Override
    public void close() throws IOException {
      if (reader != null) {
        reader.close();
      }
    }
  }

  /**
   * A JSON line: the generator's layout ({@code {"key":"...","value":...,"timestamp":n}}, a key
   * without escapes) is cut apart directly; anything else is parsed with Jackson.
   */
  static Rec parse(String line) {
    String start = "{\"key\":\"";
    String valueAt = "\",\"value\":";
    String tsAt = ",\"timestamp\":";
    int v = line.indexOf(valueAt, start.length());
    int t = line.lastIndexOf(tsAt);
    int escape = line.indexOf('\\', start.length());
    if (line.startsWith(start) && line.endsWith("}") && v > 0 && t > v && (escape < 0 || escape > v)) {
      String key = line.substring(start.length(), v);
      String value = line.substring(v + valueAt.length(), t);
      long ts = Long.parseLong(line.substring(t + tsAt.length(), line.length() - 1).strip());
      return new Rec(key, value.equals("null") ? null : value, ts);
    }
    try {
      JsonNode node = JSON.readTree(line);
      JsonNode value = node.get("value");
      return new Rec(OperatorScenarios.keyString(node.get("key")),
          value == null || value.isNull() ? null : value.toString(), node.get("timestamp").asLong());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Versiq's merge of the inputs (rule 23), one record at a time. */
  static final class Merge implements AutoCloseable {
    private final List<Source> sources = new ArrayList<>();
    private final List<Integer> rank = new ArrayList<>(); // input indexes, stores first, then declared order
    int input; // the input of the record last returned

    Merge(JsonNode inputs) {
      for (JsonNode in : inputs) {
        List<String> files = new ArrayList<>();
        in.get("files").forEach(f -> files.add(f.asText()));
        sources.add(new Source(files));
      }
      for (int i = 0; i < inputs.size(); i++) {
        rank.add(i);
      }
      rank.sort(Comparator.comparing((Integer i) -> inputs.get(i).get("kind").asText().equals("stream"))
          .thenComparing(i -> i));
    }

    /** The next record in merge order (its input in {@link #input}), or null at the end. */
    Rec next() {
      int best = -1;
      for (int i : rank) {
        Rec head = sources.get(i).head;
        if (head != null && (best < 0 || head.ts() < sources.get(best).head.ts())) {
          best = i;
        }
      }
      if (best < 0) {
        return null;
      }
      Source source = sources.get(best);
      Rec rec = source.head;
      source.advance();
      input = best;
      return rec;
    }

    @Override
    public void close() throws IOException {
      for (Source s : sources) {
        s.close();
      }
    }
  }

  /** What one pass through a driver gave. */
  record Pass(long records, long outputs, double seconds, double pipeSeconds, double setupSeconds,
              double closeSeconds) {}

  /** Pipes up to {@code limit} records of the merge through a fresh driver of the scenario's topology. */
  static Pass drive(JsonNode spec, File stateDir, long limit, String outputFile) throws IOException {
    long t0 = System.nanoTime();
    TopologyTestDriver driver =
        new TopologyTestDriver(OperatorScenarios.topology(spec), OperatorScenarios.properties(stateDir));
    JsonNode inputs = spec.get("inputs");
    List<TestInputTopic<String, String>> topics = new ArrayList<>();
    for (int i = 0; i < inputs.size(); i++) {
      topics.add(driver.createInputTopic("in" + i, new StringSerializer(), new StringSerializer()));
    }
    TestOutputTopic<String, String> out =
        driver.createOutputTopic("out", new StringDeserializer(), new StringDeserializer());
    long t1 = System.nanoTime();
    long records = 0;
    long outputs = 0;
    long piping = 0;
    try (Merge merge = new Merge(inputs);
         BufferedWriter written = outputFile == null ? null
             : Files.newBufferedWriter(Path.of(outputFile), StandardCharsets.UTF_8)) {
      Rec rec;
      while (records < limit && (rec = merge.next()) != null) {
        long p = System.nanoTime();
        topics.get(merge.input).pipeInput(rec.key(), rec.value(), Instant.ofEpochMilli(rec.ts()));
        if ((++records & 1023) == 0) {
          outputs += drain(out, written);
        }
        piping += System.nanoTime() - p;
      }
      long p = System.nanoTime();
      outputs += drain(out, written);
      piping += System.nanoTime() - p;
    }
    long t2 = System.nanoTime();
    driver.close();
    long t3 = System.nanoTime();
    return new Pass(records, outputs, (t2 - t1) / 1e9, piping / 1e9, (t1 - t0) / 1e9, (t3 - t2) / 1e9);
  }

  /** Reads the output topic: how many records, each written to {@code written} when given. */
  private static int drain(TestOutputTopic<String, String> out, BufferedWriter written) throws IOException {
    List<TestRecord<String, String>> records = out.readRecordsToList();
    if (written != null) {
      for (TestRecord<String, String> r : records) {
        ObjectNode node = JSON.createObjectNode();
        node.put("key", r.key());
        node.put("value", r.value());
        node.put("ts", r.timestamp());
        written.write(JSON.writeValueAsString(node));
        written.write('\n');
      }
    }
    return records.size();
  }

  /** Reads and merges the records without piping them: the reading's share of a pass. */
  static double readOnly(JsonNode spec) throws IOException {
    long t0 = System.nanoTime();
    long n = 0;
    long sum = 0;
    try (Merge merge = new Merge(spec.get("inputs"))) {
      Rec rec;
      while ((rec = merge.next()) != null) {
        n++;
        sum += rec.key().length(); // keep the parse from being optimised away
      }
    }
    if (n < 0 || sum < 0) {
      throw new IllegalStateException();
    }
    return (System.nanoTime() - t0) / 1e9;
  }

  static void deleteTree(File dir) throws IOException {
    if (!dir.exists()) {
      return;
    }
    try (Stream<Path> walk = Files.walk(dir.toPath())) {
      for (Path p : walk.sorted(Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(p);
      }
    }
  }

  public static void main(String[] args) throws Exception {
    JsonNode spec = JSON.readTree(new File(args[0]));
    long warmUpRecords = spec.path("warmUpRecords").asLong(50_000);
    File stateRoot = Files.createTempDirectory("versiq-operator-bench-").toFile();
    ObjectNode result = JSON.createObjectNode();
    result.put("op", spec.get("op").asText());
    result.put("kafka_streams", AppInfoParser.getVersion());
    result.put("java", System.getProperty("java.version"));
    result.put("driver", DRIVER_NOTE);
    try {
      Pass warm = warmUpRecords > 0 ? drive(spec, new File(stateRoot, "warm-up"), warmUpRecords, null) : null;
      if (warm != null) {
        ObjectNode w = result.putObject("warm_up");
        w.put("records", warm.records());
        w.put("seconds", round(warm.seconds()));
        w.put("output_count", warm.outputs());
        deleteTree(new File(stateRoot, "warm-up"));
      }
      double read = readOnly(spec);
      Pass pass = drive(spec, new File(stateRoot, "measured"), Long.MAX_VALUE,
          spec.hasNonNull("outputFile") ? spec.get("outputFile").asText() : null);
      result.put("records_in", pass.records());
      result.put("seconds", round(pass.seconds()));
      result.put("records_per_s", pass.seconds() > 0 ? Math.round(pass.records() / pass.seconds()) : 0);
      result.put("pipe_seconds", round(pass.pipeSeconds()));
      result.put("read_only_seconds", round(read));
      result.put("output_count", pass.outputs());
      result.put("setup_seconds", round(pass.setupSeconds()));
      result.put("close_seconds", round(pass.closeSeconds()));
      System.err.printf("%s%nkafka streams %s, %s: %,d records in, %.2f s (reading %.2f s of it, "
              + "pipeInput %.2f s), %,d records/s, %,d records out; warm-up %s%n",
          DRIVER_NOTE, AppInfoParser.getVersion(), spec.get("op").asText(), pass.records(), pass.seconds(), read,
          pass.pipeSeconds(), result.get("records_per_s").asLong(), pass.outputs(),
          warm == null ? "none" : String.format("%,d records %.2f s (excluded)", warm.records(), warm.seconds()));
    } finally {
      deleteTree(stateRoot);
    }
    JSON.writeValue(System.out, result);
    System.out.println();
    System.out.flush();
    System.exit(0); // RocksDB and driver threads must not keep the JVM alive
  }

  private static double round(double seconds) {
    return Math.round(seconds * 1000) / 1000.0;
  }
}
