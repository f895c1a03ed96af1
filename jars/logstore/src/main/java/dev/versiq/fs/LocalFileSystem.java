package dev.versiq.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system (checksummed, as {@code org.apache.hadoop.fs.LocalFileSystem}),
 * whose file permissions are set with {@code java.nio} instead of a {@code chmod} process.
 *
 * <p>Without Hadoop's native library (PySpark ships none), {@code RawLocalFileSystem} sets the
 * permission of every file and directory it creates by running {@code chmod}: a process started
 * by the JVM for each data file, its {@code .crc} and each Delta log file, about 40 per small
 * ingest run, in the write task and the commit. {@code Files.setPosixFilePermissions} makes the
 * same {@code chmod} system call in the JVM. A permission Java cannot express (the sticky,
 * setuid or setgid bits), a file system without POSIX permissions, or an available native
 * library keep Hadoop's own way. Likewise {@link RawLocal#getFileLinkStatus} asks
 * {@code java.nio} whether a path is a symbolic link instead of running {@code readlink}.
 *
 * <p>versiq's Spark sessions set it as {@code fs.file.impl}, and {@link LocalFs} (the same for
 * Hadoop's {@code FileContext}, through which Delta writes its log) as
 * {@code fs.AbstractFileSystem.file.impl} (versiq/ingest/spark.py).
 */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {

  public LocalFileSystem() {
    super(new RawLocal());
  }

  /** {@code RawLocalFileSystem} with {@link #setPermission} and {@link #getFileLinkStatus}
   * through {@code java.nio}. */
  public static class RawLocal extends RawLocalFileSystem {

    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      if (NativeIO.isAvailable() || (mode & ~0777) != 0) {
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          set.add(BITS[bit]);
        }
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
      } catch (UnsupportedOperationException e) {
        super.setPermission(p, permission);
      }
    }

    /** As Hadoop's: the status of {@code f} itself; of a path that is not a symbolic link
     * (or does not exist) its {@code getFileStatus}, which Hadoop's returns too once
     * {@code readlink} found no link. A symbolic link goes to Hadoop's own code. */
    @Override
    public FileStatus getFileLinkStatus(Path f) throws IOException {
      if (!Files.isSymbolicLink(pathToFile(f).toPath())) {
        return getFileStatus(f);
      }
      return super.getFileLinkStatus(f);
    }
  }
}
