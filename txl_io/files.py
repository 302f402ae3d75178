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
import errno
import json
import os
import posixpath
import re
import shutil
import socket
import tempfile
import time
import uuid


def _tf():
    """TensorFlow, imported on first use (its gfile holds every filesystem)."""
    import tensorflow as tf

    return tf


class _LazyGfile:
    """`tf.io.gfile`, reached on first use: importing this module does not import TensorFlow."""

    def __getattr__(self, name):
        return getattr(_tf().io.gfile, name)


gfile = _LazyGfile()
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


class StorageError(OSError):
    """A path that cannot be read or written; the message names it and what to check."""


class InUseError(StorageError):
    """A folder that another process is writing (its lock is held)."""


# The names of the temporary files and folders this module makes beside their destination:
# `<name>.<8 random characters>.partial`, with an optional suffix kept after it.
TEMPORARY = re.compile(r"^(?P<name>.+)\.[a-z0-9_]{8}\.partial(?P<suffix>(\.[A-Za-z0-9]+)*)$")
LOCK = "txl_keras.lock"


def scheme(path):
    """The URL scheme of `path` ("gs", "ram", ...) or "" for a local path."""
    match = _SCHEME.match(str(path))
    return match.group(1).lower() if match else ""


def user_path(path):
    """`path` as a user means it: a local path's leading `~` expanded, as a shell and the
    command lines do."""
    return os.path.expanduser(path) if is_local(path) else path


def is_local(path):
    return scheme(path) in ("", "file")


def join(path, *parts):
    """`os.path.join` for local paths, "/" for URLs (also on Windows)."""
    return os.path.join(path, *parts) if is_local(path) else posixpath.join(path, *parts)


def dirname(path):
    """The folder holding `path`; of a URL's top level ("ram://exp") its root ("ram://")."""
    if is_local(path):
        return os.path.dirname(path)
    head = posixpath.dirname(path.rstrip("/"))
    return head + "//" if head.endswith(":") else head


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
    except (_tf().errors.OpError, OSError) as e:
        if isinstance(e, (StorageError, FileNotFoundError)):
            raise
        if isinstance(e, _tf().errors.NotFoundError):
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
    try:
        gfile.makedirs(path)
    except (_tf().errors.OpError, OSError) as e:
        raise StorageError(f"Cannot create the folder {path}: {storage_error(path, e).args[0].split(': ', 1)[1]}") \
            from None


def is_link(path):
    """Whether a local `path` is a symbolic link (object stores have none)."""
    return is_local(path) and os.path.islink(path)


def remove_file(path):
    """Delete a file (nothing if it is absent); a folder is refused, never deleted; a link is
    removed as a link, never followed."""
    if is_link(path):
        os.remove(path)
        return
    with reporting(path):
        if gfile.isdir(path):
            raise StorageError(f"Refusing to delete {path}: it is a folder, where a file was expected.")
        if gfile.exists(path):
            gfile.remove(path)


def remove_folder(path, names, pattern=None):
    """Delete the files `names` (and those matching `pattern`) of a folder this program
    wrote, then the folder if nothing else is left in it. Returns whether it is gone; a
    folder holding anything else is left as it is (with what was ours removed). A folder that
    is a link is removed as a link: nothing it points to is touched."""
    if is_link(path):
        os.remove(path)
        return True
    for name in listdir(path):
        if name in names or (pattern is not None and pattern.match(name)):
            remove_file(join(path, name))
    if listdir(path):
        return False
    with reporting(path):
        if is_local(path):
            os.rmdir(path)
        elif gfile.exists(path):
            gfile.rmtree(path)  # an empty prefix on an object store
    return True


def remove_tree(path):
    """Delete a folder this program wrote and everything in it; a link is removed as a
    link, and links inside are never followed."""
    if is_link(path):
        os.remove(path)
        return
    with reporting(path):
        if is_local(path):
            shutil.rmtree(path)
        elif gfile.exists(path):
            gfile.rmtree(path)


def free_bytes(path):
    """Free bytes on the local filesystem of `path` (its nearest existing folder), or None
    where it cannot be told (object stores)."""
    if not is_local(path):
        return None
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def check_free_space(path, needed, what):
    """A StorageError naming `path` when its filesystem has less than `needed` bytes free
    (nothing is written; a full disk must not interrupt `what` halfway)."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise StorageError(f"Not enough free space for {what} at {path}: it needs about {needed / 1e6:,.0f} MB, "
                           f"{free / 1e6:,.0f} MB are free. Free some space or choose another folder.")


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


def random_tag():
    """8 random characters of a temporary name (`TEMPORARY`)."""
    return uuid.uuid4().hex[:8]


def _temporary_name(path, suffix=""):
    return f"{path}.{random_tag()}.partial{suffix}"


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
    """Rename a file or folder (atomic locally: `os.replace`; a copy and delete on object
    stores)."""
    with reporting(target):
        if is_local(source) and is_local(target):
            os.replace(source, target)
        else:
            gfile.rename(source, target)


@contextlib.contextmanager
def local_output(path, suffix="", overwrite=True):
    """Yield a local file path to write; on success it becomes `path` atomically (see the
    module docstring), on error nothing is left. For writers that need a local file
    (h5py, numpy) and for plain atomic writes. The temporary file lies beside `path` (for
    a URL, in the system's temporary folder) and ends with `suffix` (Keras requires
    `.weights.h5`). Without `overwrite` an existing `path` is an error, and no other
    writer can have made it meanwhile (a hard link, locally)."""
    folder = dirname(path) or "."
    makedirs(folder)
    if not overwrite and exists(path):
        raise FileExistsError(f"{path} exists; nothing was overwritten.")
    if is_local(path):
        with reporting(path):
            fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".partial" + suffix, dir=folder)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would create it
        try:
            yield tmp
            with reporting(path):
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                if overwrite:
                    os.replace(tmp, path)
                else:
                    os.link(tmp, path)  # fails if another writer made `path` meanwhile
            fsync_dir(folder)
        except FileExistsError:
            raise FileExistsError(f"{path} exists; nothing was overwritten.") from None
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    local_dir = tempfile.mkdtemp(prefix="txl-upload-")
    local = os.path.join(local_dir, basename(path) + suffix)
    remote_tmp = _temporary_name(path)
    try:
        yield local
        copy(local, remote_tmp)
        with reporting(path):  # (object stores: `overwrite` was checked before, not atomically)
            gfile.rename(remote_tmp, path, overwrite=True)
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)
        try:
            if gfile.exists(remote_tmp):
                gfile.remove(remote_tmp)
        except _tf().errors.OpError:
            pass


def remove_leftovers(folder, names):
    """Delete the temporary files (and temporary checkpoint folders' files) that an
    interrupted write of one of `names` (a set, or a compiled pattern of names) left in
    `folder`; only names of the exact `TEMPORARY` form. Returns the paths removed."""
    removed = []
    for entry in listdir(folder):
        match = TEMPORARY.match(entry)
        if not match:
            continue
        name = match.group("name")
        if not (name in names if isinstance(names, (set, frozenset)) else names.match(name)):
            continue
        path = join(folder, entry)
        if isdir(path):
            if not remove_folder(path, (), TEMPORARY_CONTENT):
                continue
        else:
            remove_file(path)
        removed.append(path)
    return removed


# What a temporary checkpoint folder may hold: the files of a checkpoint and their temporaries.
TEMPORARY_CONTENT = re.compile(r"^(model\.weights\.h5|state\.npz)(\.[a-z0-9_]{8}\.partial(\.weights\.h5)?)?$")


# -- one writer per folder ----------------------------------------------------------------------


def _holder(lock_path):
    try:
        with open(lock_path) if is_local(lock_path) else gfile.GFile(lock_path) as f:
            data = json.loads(f.read() or "{}")
        return f"pid {data['pid']} on {data['host']}, since {data['since']}"
    except (OSError, ValueError, KeyError, TypeError, _tf().errors.OpError):
        return "another process"


def _owner():
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "since": time.strftime("%Y-%m-%d %H:%M:%S")})


@contextlib.contextmanager
def exclusive(folder, what):
    """Hold `folder`'s lock (`txl_keras.lock`, naming its holder's host and pid) while the
    block runs: a second writer gets an InUseError naming the holder. Locally the lock is
    an `flock` on the file, which the system releases when its holder dies, so the lock of
    a killed process is taken over safely; the file is deleted when the block ends. On
    object stores it is a best effort: the file exists while a holder runs, and the file
    of a killed holder must be deleted by hand. A folder it had to create and that the
    block left empty is removed again."""
    created = not exists(folder)
    makedirs(folder)
    try:
        with _locked(join(folder, LOCK), what):
            yield
    finally:
        if created and not listdir(folder):
            with contextlib.suppress(OSError, StorageError):
                remove_folder(folder, ())


@contextlib.contextmanager
def _locked(path, what):
    """Hold the lock file `path` (see `exclusive`)."""
    if not is_local(path):
        with reporting(path):
            if gfile.exists(path):
                raise InUseError(f"{what} is in use ({_holder(path)}; {path}). If that run has ended "
                                 "(killed), delete the lock file and run again.")
        atomic_write(path, _owner())
        try:
            yield
        finally:
            remove_file(path)
        return
    handle = _flock(path, what)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(_owner())
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)  # (while holding it: a waiter that opened this file tries again)
        handle.close()  # releases the flock


def _flock(path, what):
    """The open lock file at `path`, exclusively locked (retried if it was replaced)."""
    import fcntl

    while True:
        with reporting(path):
            try:  # (never through a link: its target would be truncated)
                handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644), "a+")
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise StorageError(f"The lock file {path} is a symbolic link, which this program never writes "
                                   "through; delete the link and run again.") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise InUseError(f"{what} is in use by {_holder(path)}; wait for it to end, or use another "
                             "folder.") from None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()  # its holder deleted it on release: lock the new file


def check_new_folder(output):
    """Refuse, before any work, an `output` folder that `staged_folder` would refuse: a
    file, or a folder that is not empty."""
    if exists(output) and not isdir(output):
        raise FileExistsError(f"{output} is a file, not a folder; choose a new folder (nothing is overwritten).")
    if listdir(output):
        raise FileExistsError(f"{output} is not empty; choose a new folder (nothing is overwritten).")


@contextlib.contextmanager
def staged_folder(output, what, last=None):
    """Write the new folder `output` whole: the block writes into the staging folder it is
    given, `.<name>.partial` beside it, which is published as `output` when the block
    succeeds (a rename locally; on object stores a copy whose file `last` comes last, the
    commit).

    One writer at a time (the lock file `.<name>.lock` beside it, see `exclusive`); an
    `output` that is a file or a non-empty folder is refused before anything is written; the
    staging folder that an interrupted run left (with its lock file) is cleared and written
    again, so the same command after any interruption completes, and a partial output never
    appears under `output`. A failed block leaves nothing behind."""
    output = output.rstrip("/")
    parent = dirname(output) or "."
    staging = join(parent, f".{basename(output)}.partial")  # (not a prefix of `output`)
    lock = join(parent, f".{basename(output)}.lock")
    if exists(staging) and not exists(lock):
        raise StorageError(f"{staging} exists and was not made by txl_keras; move it away and run again.")
    makedirs(parent)
    published = False
    with _locked(lock, f"{what} ({output})"):
        check_new_folder(output)
        _clear(staging)
        makedirs(staging)
        try:
            yield staging
            _publish(staging, output, last)
            published = True
        finally:
            if not published:
                _clear(staging)


def _clear(folder):
    """Delete a staging folder of ours (its lock beside it proves whose it is)."""
    with reporting(folder):
        if gfile.exists(folder):
            gfile.rmtree(folder)


def _publish(staging, output, last):
    if is_local(output):
        try:
            os.replace(staging, output)  # onto a missing or empty folder only
        except OSError as e:
            raise storage_error(output, e) from None
        fsync_dir(dirname(os.path.abspath(output)))
        return
    names = [os.path.relpath(os.path.join(d, f), staging) for d, _, found in walk(staging) for f in found]
    for name in sorted(names, key=lambda n: n == last):
        target = join(output, name.replace(os.sep, "/"))
        makedirs(dirname(target))
        copy(join(staging, name.replace(os.sep, "/")), target)
    _clear(staging)


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
