"""Files on any `tf.io.gfile` filesystem: local paths, gs://, s3:// (with its plugin),
hdfs://, ram://. Every file txl_keras and tf_records read or write goes through here.

Atomicity. A file written with `atomic_write` (or `local_output`) appears whole or not at
all: it is written under a temporary name and renamed onto the final one. Locally and on
HDFS the rename is atomic; on object stores (gs://, s3://) an object only becomes visible
when its upload completes, but a rename is a copy, so a folder of several files is never
complete by itself: readers trust a set of files only once its commit marker (the record
info of a split, the checkpoint index of a run) names it, and that marker is written last.
"""

import contextlib
import os
import posixpath
import re
import shutil
import tempfile
import uuid

import tensorflow as tf

gfile = tf.io.gfile
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


class StorageError(OSError):
    """A path that cannot be read or written; the message names it and what to check."""


def scheme(path):
    """The URL scheme of `path` ("gs", "ram", ...) or "" for a local path."""
    match = _SCHEME.match(str(path))
    return match.group(1).lower() if match else ""


def is_local(path):
    return scheme(path) in ("", "file")


def join(path, *parts):
    """`os.path.join` for local paths, "/" for URLs (also on Windows)."""
    return os.path.join(path, *parts) if is_local(path) else posixpath.join(path, *parts)


def dirname(path):
    return os.path.dirname(path) if is_local(path) else posixpath.dirname(path.rstrip("/"))


def basename(path):
    return os.path.basename(path) if is_local(path) else posixpath.basename(path.rstrip("/"))


def _hint(path):
    kind = scheme(path)
    if kind == "gs":
        return "check the network, the credentials (gcloud auth application-default login) and the bucket name"
    if kind == "s3":
        return "check that tensorflow-io is installed (it provides s3://), the credentials and the bucket name"
    if kind == "hdfs":
        return "check that the HDFS client libraries are installed (HADOOP_HDFS_HOME) and the namenode address"
    return "check the path and its permissions"


def storage_error(path, error):
    """A StorageError naming `path`, the cause in one line and what to check."""
    first = str(getattr(error, "message", None) or error).strip().splitlines()
    cause = first[0] if first else type(error).__name__
    if len(cause) > 200:
        cause = cause[:200] + "..."
    return StorageError(f"Cannot access {path}: {cause} ({_hint(path)}).")


@contextlib.contextmanager
def reporting(path):
    """Turn TensorFlow's filesystem errors about `path` into a one-line StorageError."""
    try:
        yield
    except (tf.errors.OpError, OSError) as e:
        if isinstance(e, (StorageError, FileNotFoundError)):
            raise
        if isinstance(e, tf.errors.NotFoundError):
            raise FileNotFoundError(f"No such file or folder: {path}") from None
        raise storage_error(path, e) from None


def check_access(path):
    """Fail early, with a clear message, when `path`'s filesystem cannot be reached.
    Writes nothing."""
    if is_local(path):
        return
    with reporting(path):
        gfile.exists(path)


def exists(path):
    with reporting(path):
        return gfile.exists(path)


def isdir(path):
    with reporting(path):
        return gfile.isdir(path)


def isfile(path):
    with reporting(path):
        return gfile.exists(path) and not gfile.isdir(path)


def listdir(path):
    """Entry names of a folder (no trailing "/"), or [] when it does not exist."""
    with reporting(path):
        if not gfile.isdir(path):
            return []
        return [name.rstrip("/") for name in gfile.listdir(path)]


def glob(pattern):
    with reporting(pattern):
        return sorted(gfile.glob(pattern))


def walk(path):
    with reporting(path):
        yield from gfile.walk(path)


def size(path):
    with reporting(path):
        return gfile.stat(path).length


def makedirs(path):
    """Create a folder (and its parents). Never makes a local folder named like a URL."""
    if is_local(path) and re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:$", str(path).split(os.sep)[0]):
        raise StorageError(f"Refusing to create the local folder {path!r}: it looks like a URL missing a '/'.")
    with reporting(path):
        gfile.makedirs(path)


def remove(path):
    with reporting(path):
        if gfile.isdir(path):
            gfile.rmtree(path)
        elif gfile.exists(path):
            gfile.remove(path)


def read_bytes(path):
    with reporting(path):
        with gfile.GFile(path, "rb") as f:
            return f.read()


def read_text(path):
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StorageError(f"{path} is not UTF-8 text (byte {e.start}); is it the right file?") from None


def _temporary_name(path):
    return f"{path}.{uuid.uuid4().hex[:8]}.partial"


def atomic_write(path, data):
    """Write bytes or text to `path` whole: a reader sees the old file or the new one."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with local_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def copy(source, target, overwrite=True):
    with reporting(target):
        gfile.copy(source, target, overwrite=overwrite)


def rename(source, target):
    """Rename a file or folder (a copy and delete on object stores)."""
    with reporting(target):
        gfile.rename(source, target)


@contextlib.contextmanager
def local_output(path):
    """Yield a local file path to write; on success it becomes `path` atomically (see the
    module docstring), on error nothing is left. For writers that need a local file
    (h5py, numpy) and for plain atomic writes."""
    folder = dirname(path) or "."
    makedirs(folder)
    if is_local(path):
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".partial", dir=folder)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would create it
        try:
            yield tmp
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(folder)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    local_dir = tempfile.mkdtemp(prefix="txl-upload-")
    local = os.path.join(local_dir, basename(path))
    remote_tmp = _temporary_name(path)
    try:
        yield local
        copy(local, remote_tmp)
        with reporting(path):
            gfile.rename(remote_tmp, path, overwrite=True)
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)
        try:
            if gfile.exists(remote_tmp):
                gfile.remove(remote_tmp)
        except tf.errors.OpError:
            pass


@contextlib.contextmanager
def local_input(path):
    """Yield a local path holding the contents of `path` (a copy for URLs), for readers
    that need a local file (h5py, numpy, pickle)."""
    if is_local(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"No such file: {path}")
        yield path
        return
    local_dir = tempfile.mkdtemp(prefix="txl-download-")
    try:
        local = os.path.join(local_dir, basename(path))
        with reporting(path):
            gfile.copy(path, local, overwrite=True)
        yield local
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)


def fsync_dir(directory):
    """Make a rename in a local folder durable (no-op elsewhere)."""
    if not is_local(directory):
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
