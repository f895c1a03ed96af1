import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;
import io.delta.storage.S3SingleDriverLogStore;

/** PROTOTYPE (research only): Delta LogStore whose non-overwrite writes are S3 PUTs with If-None-Match: *. */
public class ConditionalS3LogStore extends S3SingleDriverLogStore {
  public ConditionalS3LogStore(Configuration c) { super(c); }
  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf) throws IOException {
    if (overwrite) { super.write(path, actions, true, conf); return; }
    FileSystem fs = path.getFileSystem(conf);
    try (FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path)
        .must("fs.option.create.conditional.overwrite", true).build()) {
      while (actions.hasNext()) out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
    } catch (RemoteFileChangedException e) {
      // 412: another writer created this version first -> Delta's optimistic-concurrency retry path.
      throw new java.nio.file.FileAlreadyExistsException(path.toString());
    }
  }
}
