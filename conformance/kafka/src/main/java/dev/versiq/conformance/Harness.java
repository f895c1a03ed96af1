package dev.versiq.conformance;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.nio.file.Files;
import java.util.function.BiFunction;

/** The driver loop both harnesses share: scenarios in (a JSON file), results out (stdout). */
final class Harness {
  private Harness() {}

  /**
   * Reads {@code {"scenarios": [...]}} from the file named by {@code args[0]}, runs each one with
   * {@code run(scenario, its own state directory)} and prints {@code {"results": [...]}}.
   */
  static void runAll(String[] args, ObjectMapper json, String tempPrefix,
                     BiFunction<JsonNode, File, ObjectNode> run) throws Exception {
    JsonNode input = json.readTree(new File(args[0]));
    ObjectNode output = json.createObjectNode();
    ArrayNode results = output.putArray("results");
    File stateRoot = Files.createTempDirectory(tempPrefix).toFile();
    int n = 0;
    for (JsonNode scenario : input.get("scenarios")) {
      results.add(run.apply(scenario, new File(stateRoot, "s" + (n++))));
    }
    json.writeValue(System.out, output);
    System.out.flush();
    System.exit(0); // RocksDB and driver threads must not keep the JVM alive
  }
}
