package dev.versiq.delta;

import io.delta.storage.S3SingleDriverLogStore;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * A Delta {@code LogStore} for {@code s3://} and {@code s3a://} tables whose commits are atomic
 * across JVMs and machines: the commit file {@code _delta_log/N.json} is created with an S3
 * conditional create ({@code PUT} with {@code If-None-Match: *}), which the S3 server accepts for
 * exactly one writer of each version.
 *
 * <p>Delta's own choice for S3, {@link S3SingleDriverLogStore}, checks that the file is absent and
 * then writes it unconditionally, serialised only by a lock inside its own JVM: two writers on two
 * machines can both "win" version N and one silently overwrites the other's commit. The released
 * delta-storage (4.4.0) has no conditional-put store, so this class adds one on top of S3A's
 * conditional create (Hadoop 3.4.2+, HADOOP-19256): {@code
 * fs.createFile(path).must("fs.option.create.conditional.overwrite", true)}. S3A sends
 * {@code If-None-Match: *} when the stream closes and skips its (racy) HEAD/LIST probe; the loser's
 * 412 reaches this class as {@link RemoteFileChangedException}, which is mapped to {@link
 * java.nio.file.FileAlreadyExistsException}: Delta's signal for a lost race, after which it checks
 * the winner's commit for conflicts and, for a conflict-free transaction such as a blind append,
 * retries at the next version.
 *
 * <p>An ambiguous outcome (the PUT was stored but the response was lost, and the retry got 412) is
 * resolved by reading the existing file back: when it holds exactly the lines this call wrote, the
 * write was this writer's own and succeeds. Delta's commit files carry a unique transaction id in
 * {@code commitInfo.txnId}, so another writer's commit never has the same content.
 *
 * <p>Overwrites ({@code overwrite=true}, e.g. {@code _last_checkpoint}), reads and listing are
 * {@link S3SingleDriverLogStore}'s. Requires an S3 server that supports conditional writes (AWS S3
 * since 2024, SeaweedFS, MinIO) and {@code fs.s3a.create.conditional.enabled=true} (S3A's default):
 * without it S3A refuses the create ("Conditional Writes Unavailable") rather than write unsafely.
 * Never combine it with {@code fs.s3a.performance.flags=create}, which makes S3A's plain {@code
 * create(path, false)} overwrite silently (this class does not use that call, but Delta's other
 * writers could).
 *
 * <p>Registered by versiq/ingest/spark.py: {@code spark.delta.logStore.s3a.impl} and {@code
 * spark.delta.logStore.s3.impl}.
 */
public class ConditionalS3LogStore extends S3SingleDriverLogStore {

  /** The create option that makes S3A send {@code If-None-Match: *} (Hadoop's Options constant). */
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  public ConditionalS3LogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    if (overwrite) {
      super.write(path, actions, true, hadoopConf);
      return;
    }
    List<String> lines = new ArrayList<>();
    actions.forEachRemaining(lines::add);
    byte[] body = toBytes(lines);
    FileSystem fs = path.getFileSystem(hadoopConf);
    try {
      // createFile returns a raw builder type: build() is typed Object.
      try (FSDataOutputStream out =
          (FSDataOutputStream) fs.createFile(path).must(CONDITIONAL_CREATE, true).build()) {
        out.write(body);
      }
    } catch (RemoteFileChangedException e) {
      // 412 Precondition Failed: the key exists. Ours (an ambiguous retry) or another writer's?
      if (holds(fs, path, body)) {
        return;
      }
      java.nio.file.FileAlreadyExistsException lost =
          new java.nio.file.FileAlreadyExistsException(path.toString(), null, "another writer committed it first");
      lost.initCause(e);
      throw lost;
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      // Not expected on this path (S3A skips its probe for a conditional create); kept so a file
      // system that does probe still gives Delta the exception type it retries on.
      java.nio.file.FileAlreadyExistsException lost =
          new java.nio.file.FileAlreadyExistsException(path.toString(), null, e.getMessage());
      lost.initCause(e);
      throw lost;
    }
  }

  private static byte[] toBytes(List<String> lines) {
    StringBuilder text = new StringBuilder();
    for (String line : lines) {
      text.append(line).append('\n');
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }

  /** Whether the object at {@code path} holds exactly {@code body}. */
  private static boolean holds(FileSystem fs, Path path, byte[] body) throws IOException {
    byte[] existing;
    try (FSDataInputStream in = fs.open(path)) {
      existing = in.readAllBytes();
    } catch (FileNotFoundException e) {
      return false;
    }
    return java.util.Arrays.equals(existing, body);
  }
}
