"""Files the commands read and write: checked before any work, written atomically.

Every output is written beside its target under a hidden temporary name and
renamed into place (`os.replace`, atomic on one file system), so a killed
command leaves the previous file intact, or no file, never a half-written
one. Inputs and output folders are checked up front, so a bad path costs one
`error:` line instead of the work done before it was found.
"""

import contextlib
import json
import os
import shutil
import socket
import tempfile

from pipelines.errors import ConfigError, DataError

# Temporary files and folders start with this, then `staging_owner()`.
STAGING = ".staging-"


def staging_owner():
    """`PID@HOST-`: which process on which machine writes a staging file.

    Only this machine's dead writers are cleaned up: on shared storage (NFS,
    a volume several containers mount) another machine's pid says nothing.
    """
    return f"{os.getpid()}@{socket.gethostname()}-"


def make_shareable(path):
    """Gives a staging file or folder the mode a plain `open`/`mkdir` would have.

    `mkstemp` and `mkdtemp` create owner-only files (0600) and folders (0700);
    outputs renamed from them would keep that mode.
    """
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)


def check_input_file(path, flag):
    """Raises `DataError` unless `path` is a readable file.

    Args:
        path: str, the file.
        flag: str, the argument that named it (`--input`), for the message.
    """
    if not os.path.exists(path):
        raise DataError(f"{flag}: file not found: {path}")
    if not os.path.isfile(path):
        raise DataError(f"{flag}: not a file: {path}")
    if not os.access(path, os.R_OK):
        raise DataError(f"{flag}: file not readable: {path}")


def prepare_output_file(path, flag):
    """Creates `path`'s folder if need be and checks a file can be written there.

    Raises:
        DataError: naming `flag` and the path, when the folder cannot be
            created or written, or `path` is a folder.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise DataError(f"{flag}: {path} is a folder, not a file")
    prepare_output_folder(folder, flag)


def prepare_output_folder(folder, flag):
    """Creates `folder` if need be; raises `DataError` unless files can be written in it."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise DataError(f"{flag}: cannot create the folder {folder} ({error.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(f"{flag}: cannot write in the folder {folder}")


def staging_path(path, suffix=""):
    """A hidden name beside `path` that no other process uses: `.staging-PID@HOST-...`."""
    folder, name = os.path.split(os.path.abspath(path))
    handle, staging = tempfile.mkstemp(
        prefix=f"{STAGING}{staging_owner()}{name}-", suffix=suffix, dir=folder
    )
    os.close(handle)
    return staging


def staging_folder(parent):
    """A new hidden folder in `parent` to write a whole output in, before renaming it.

    Staging left in `parent` by this machine's dead writers is removed first.
    The folder has the mode a plain `mkdir` gives.
    """
    os.makedirs(parent, exist_ok=True)
    remove_stale_staging(parent)
    folder = tempfile.mkdtemp(prefix=f"{STAGING}{staging_owner()}", dir=parent)
    make_shareable(folder)
    return folder


@contextlib.contextmanager
def atomic_output(path, suffix=""):
    """Yields a temporary path beside `path`; on success renames it to `path`.

    The caller writes the whole file to the yielded path (a `.keras` save,
    say; `suffix` keeps an extension a writer insists on). On an exception the
    temporary file is removed and `path` is left as it was. Temporary files
    that killed writers left in the folder are removed first.
    """
    remove_stale_staging(os.path.dirname(os.path.abspath(path)))
    staging = staging_path(path, suffix)
    try:
        yield staging
        make_shareable(staging)
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(staging)
        raise


@contextlib.contextmanager
def atomic_text(path):
    """A text file opened for writing that appears at `path` only when complete."""
    with atomic_output(path) as staging:
        with open(staging, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())


def free_bytes(path):
    """Free bytes on the disk `path` is on, or would be on once created."""
    while not os.path.exists(path):
        path = os.path.dirname(os.path.abspath(path))
    return shutil.disk_usage(path).free


def read_json(path):
    """The JSON value in the UTF-8 file `path`."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json(path, data):
    """Writes `data` as indented JSON to `path`, atomically."""
    with atomic_text(path) as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def remove_stale_staging(folder):
    """Removes staging files and folders in `folder` left by this machine's dead processes.

    Returns:
        list of str, the paths removed.
    """
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in os.listdir(folder):
        if not name.startswith(STAGING):
            continue
        pid, _, rest = name[len(STAGING) :].partition("@")
        here = rest.startswith(f"{socket.gethostname()}-")
        if not (here and pid.isdigit()) or _running(int(pid)):
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
        removed.append(path)
    return removed


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# The lock file a run folder's writer holds (`run_folder_lock`).
RUN_LOCK = "run.lock"


def run_folder_lock(folder, flag):
    """`output_lock` on a run folder: held by `kt train`, `kt import` and `kt average` in it."""
    return output_lock(folder, flag, os.path.join(folder, RUN_LOCK))


@contextlib.contextmanager
def output_lock(path, flag, lock_path=None):
    """Holds `PATH.lock` while a command writes `path`; refuses a second writer at once.

    The lock is the kernel's (`flock`): a killed run's lock is released (its
    file may stay, and the next run takes it over); the file holds the
    writer's process id for the message.

    Args:
        path: str, the file or folder written.
        flag: str, the argument that named it, for the message.
        lock_path: str, the lock file (default `PATH.lock`).

    Raises:
        ConfigError: another process holds the lock, named by its id.
    """
    import fcntl

    lock_path = lock_path or f"{path}.lock"
    while True:
        handle = open(lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"{flag} {path} is being written by another run (process {owner}); "
                f"wait for it to finish, or choose another {flag}"
            ) from None
        try:
            same = os.path.samestat(os.fstat(handle.fileno()), os.stat(lock_path))
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its last holder removed meanwhile
            break
        handle.close()
    try:
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        try:
            os.remove(lock_path)  # while still holding it, so no one locks the removed file
        except FileNotFoundError:
            pass
        finally:
            handle.close()
