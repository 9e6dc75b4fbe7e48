"""Atomic writes of whole folders and of single text files: nothing half-written is ever visible under the final name,
and what is written gets the permissions the user's umask gives (not the private 0700 / 0600 of tempfile.mkdtemp and
some writers). Writers of one folder take turns (writer_lock); a destination reached through a symbolic link is
written where the link points, and the link stays (real_destination).

The module is long because every atomic write and lock of the package lives here, one way each.
"""

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO

try:
    import fcntl
except ImportError:  # not a POSIX system: writers are not serialised (see writer_lock)
    fcntl = None

logger = logging.getLogger(__name__)


def current_umask() -> int:
    """The process umask, read without changing it where Linux exposes it (/proc/self/status), else by setting and
    immediately restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def apply_umask_modes(path: str | os.PathLike) -> None:
    """Give `path` and everything under it the modes a plain mkdir / open would have: folders 0o777 & ~umask, files
    0o666 & ~umask. For a staging folder made by tempfile.mkdtemp (0700) whose files some writers create 0600, so
    that a saved model is as readable as any other file the user writes. Symbolic links are not followed, and a file
    with other hard links (e.g. block records linked from the cache) keeps its mode: changing it would change the
    other names too."""
    mask = current_umask()
    dir_mode, file_mode = 0o777 & ~mask, 0o666 & ~mask
    root = os.fspath(path)
    entries = [root]
    for folder, names, files in os.walk(root):
        entries.extend(os.path.join(folder, name) for name in names + files)
    for entry in entries:
        info = os.lstat(entry)
        if stat.S_ISDIR(info.st_mode):
            os.chmod(entry, dir_mode)
        elif stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            os.chmod(entry, file_mode)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Yield a file open for writing (`mode` "wb" or "w", UTF-8) that replaces `path` when the block ends: written to a
    temporary file beside it, flushed to disk, renamed over `path`, the rename made durable (the folder fsynced). A
    reader sees the old file or the whole new one, never a part, even after a power cut; on an error the temporary
    file is removed and `path` is untouched (a full disk raises FullDiskError naming `path`). The file gets the
    umask's mode; the parent folder must exist. A `path` that is a symbolic link stays one: the file it points to is
    replaced. The one way this package writes a file atomically."""
    path = real_destination(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        full = full_disk_error(error, path)
        if full is not None:
            raise full from error
        raise
    fsync_directory(os.path.dirname(path))


def write_text_atomic(path: str | os.PathLike, text: str) -> str:
    """Write `text` (UTF-8) to `path` atomically (see atomic_file). Returns the path (a symbolic link's target)."""
    with atomic_file(path, "w") as file:
        file.write(text)
    return real_destination(path)


def fsync_directory(path: str | os.PathLike) -> None:
    """Flush a folder's entries to disk (makes a rename inside it durable); a no-op where a folder cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FullDiskError(OSError):
    """A write that failed for want of space (ENOSPC, EDQUOT), naming what was being written (see full_disk_error)."""

    def __init__(self, code: int, reason: str, written: str):
        self.reason, self.written = reason, written
        super().__init__(
            code,
            f"No space left on the device holding {written} while writing it ({reason}); nothing was written: free "
            "some space or choose another output",
        )

    def __str__(self) -> str:  # the sentence alone, without OSError's "[Errno 28]"
        return self.strerror


# How safetensors (Rust) reports an OS error while serializing: "... (os error 28)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def full_disk_error(error: BaseException, written: str | os.PathLike) -> FullDiskError | None:
    """For a write of `written` (a folder or file) that failed because its device is full or the user's quota is
    spent, the error to raise instead: it names `written`, where the writers' own errors name a temporary file inside
    it (or, from safetensors, nothing). None for any other error. A FullDiskError of a nested write is renamed."""
    seen = set()
    while error is not None and id(error) not in seen:  # the error, or what it wraps (e.g. datasets' errors)
        seen.add(id(error))
        if isinstance(error, FullDiskError):
            return FullDiskError(error.errno, error.reason, os.fspath(written))
        code = error.errno if isinstance(error, OSError) else None
        if code is None and type(error).__name__ == "SafetensorError":
            found = _RUST_OS_ERROR.search(str(error))
            code = int(found.group(1)) if found else None
        if code in (errno.ENOSPC, errno.EDQUOT):
            return FullDiskError(code, os.strerror(code), os.fspath(written))
        error = error.__cause__ or error.__context__
    return None


def path_within(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether `path` is `folder` or lies inside it (compared as real paths: links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


# What a job reads, as check_apart takes it: paths, or (name for messages, path) pairs; None entries are skipped.
Inputs = Iterable[str | os.PathLike | tuple[str, str | os.PathLike | None] | None]


def real_destination(destination: str | os.PathLike) -> str:
    """The absolute path a write of `destination` goes to: every symbolic link on the way resolved, the last component
    included. A new version is staged beside the real folder (same file system) and exchanged there, so a link (e.g.
    to a corpus kept on another disk) stays a link to the new version instead of being replaced by a folder."""
    return os.path.realpath(os.path.abspath(os.fspath(destination)))


def check_apart(
    output: str | os.PathLike,
    inputs: Inputs,
    output_name: str = "",
    why: str = "the job writes",
    existing_only: bool = True,
) -> None:
    """Raise ValueError when `output` (what a job writes) is, holds or lies inside one of `inputs` (what it reads),
    compared as real paths: replacing an output would delete an input inside it, and writing into an input changes
    it. inputs: paths, or (name, path) pairs that name them in the message (e.g. ("--corpus", path)); None is
    skipped, and so is a path that does not exist unless not existing_only (a Hub repo id is no local path).
    output_name names the output in the message (e.g. "--output")."""
    for item in inputs:
        name, path = item if isinstance(item, tuple) else ("the input", item)
        if path is None or (existing_only and not os.path.lexists(path)):
            continue
        if path_within(path, output):
            relation = "is" if os.path.realpath(path) == os.path.realpath(output) else "lies inside"
        elif path_within(output, path):
            relation = "holds"
        else:
            continue
        where = f"{output_name} {os.fspath(output)}" if output_name else os.fspath(output)
        raise ValueError(
            f"{name} {os.fspath(path)} {relation} {where}, which {why}: choose {output_name or 'an output'} apart "
            "from what the job reads."
        )


def check_replaceable(
    destination: str | os.PathLike,
    overwrite: bool = False,
    replaceable: Callable[[str], str | None] | None = None,
    inputs: Inputs = (),
) -> None:
    """Raise unless atomic_directory(destination, overwrite, replaceable) may write `destination`: never one that is,
    holds or lies inside one of `inputs` (check_apart), an existing one only with overwrite, never one that is or
    holds the working directory (replacing it would delete them), and, when not empty, only one that
    `replaceable(destination)` accepts (it returns None, else the reason, raised as FileExistsError). A destination
    reached through symbolic links is checked where they point, where atomic_directory writes."""
    destination = real_destination(destination)
    check_apart(destination, inputs, why="replacing would delete")
    if not os.path.lexists(destination):
        return
    if not overwrite:
        raise FileExistsError(
            f"{destination} already exists: choose another folder, or pass --overwrite (overwrite=True in Python)"
        )
    if path_within(os.getcwd(), destination):
        raise ValueError(f"Refusing to replace {destination}: it is or holds the working directory.")
    if replaceable is not None and not (os.path.isdir(destination) and not os.listdir(destination)):
        reason = replaceable(destination)
        if reason is not None:
            raise FileExistsError(f"Refusing to replace {destination}: {reason}")


def missing_folders(folder: str | os.PathLike) -> list[str]:
    """`folder` and those of its ancestors that do not exist yet, outermost first: what creating it would make, so
    that a failed write can remove them again with remove_empty_folders."""
    folder, missing = os.path.abspath(os.fspath(folder)), []
    while not os.path.isdir(folder):
        missing.insert(0, folder)
        folder = os.path.dirname(folder)
    return missing


def remove_empty_folders(folders: list[str]) -> None:
    """Remove `folders` (outermost first, as missing_folders lists them) innermost first, each only if empty: another
    writer may have filled one meanwhile."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


class _HeldLock:
    """This process's hold of one writer lock: a thread lock (threads of one process take turns, and one thread may
    take it again inside its own write) around the open lock file that holds the flock."""

    def __init__(self) -> None:
        self.thread_lock = threading.RLock()
        self.fd: int | None = None
        self.depth = 0


_HELD_LOCKS: dict[str, _HeldLock] = {}
_HELD_LOCKS_GUARD = threading.Lock()


def _forget_held_locks() -> None:
    """In a forked child: the parent's holds are not the child's (the child must wait for the parent like any
    other writer); their inherited file descriptors are closed, which leaves the parent's flocks in place."""
    global _HELD_LOCKS_GUARD
    for held in _HELD_LOCKS.values():
        if held.fd is not None:
            with contextlib.suppress(OSError):
                os.close(held.fd)
    _HELD_LOCKS.clear()
    _HELD_LOCKS_GUARD = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_locks)


def lock_path(destination: str | os.PathLike) -> str:
    """The lock file of writers of `destination`: `.NAME.lock` beside the real folder (inside it, it would leave with
    the old version at each exchange). It exists only while a writer holds it, or after one was killed."""
    parent, name = os.path.split(real_destination(destination))
    return os.path.join(parent, f".{name}.lock")


def _take_lock_file(path: str, destination: str, wait: bool = True) -> int | None:
    """Open and flock `path` exclusively, waiting for the writer that holds it (said once in the log), or with `wait`
    False raising WriterBusyError; returns the descriptor, or None where the file system has no locks. A lock file
    that its releasing holder unlinked while this process waited on it is not the lock any more: the new one is taken
    instead."""
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 100, 0).decode("ascii", "replace").strip() or "unknown"
                if not wait:
                    raise WriterBusyError(destination, f"process {holder}") from None
                if not waited:
                    logger.warning("Waiting for another writer of %s to finish (process %s).", destination, holder)
                    waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            taken = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (taken.st_dev, taken.st_ino):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode("ascii", "replace"), 0)
                return fd
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL):
                logger.warning("%s has no file locks: writers of %s are not serialised.", path, destination)
                return None
            raise
        except BaseException:  # e.g. Ctrl-C while waiting
            os.close(fd)
            raise
        os.close(fd)


def _drop_lock_file(path: str, fd: int | None) -> None:
    """Release the lock taken by _take_lock_file, removing the lock file first (no writer is left waiting on it:
    each re-checks that the file it locked is still the lock)."""
    if fd is None:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)  # also for a copy of the descriptor a fork may have taken meanwhile
        finally:
            os.close(fd)


class WriterBusyError(FileExistsError):
    """Another writer holds the lock of a folder that writer_lock(..., wait=False) was asked to take."""

    def __init__(self, destination: str, holder: str):
        self.destination, self.holder = destination, holder
        super().__init__(
            f"{destination} is being written by another process ({holder}): wait for it to finish, or choose "
            "another folder"
        )


@contextlib.contextmanager
def writer_lock(destination: str | os.PathLike, wait: bool = True) -> Iterator[str]:
    """Hold the lock of writers of the folder (or file) `destination` for the block, waiting until no other writer,
    in any process or thread, holds it (with `wait` False: raising WriterBusyError at once, e.g. for a training run,
    which would otherwise wait hours to find the folder taken); yields the real destination. Every atomic_directory
    write takes it, and a read-modify-write (corpus add / remove / update) holds it from the read to the write, so
    that no writer builds on a version another one is replacing. The same thread may take it again inside the block.
    Folders above `destination` that do not exist are made for the lock file, and removed again if left empty.

    It is an advisory lock (flock) on a file beside the destination (lock_path): released by the system when its
    holder dies, also by kill -9, so a killed writer never blocks the next one; on NFS the kernel turns it into an
    NFS byte-range lock shared by every client. Readers never take it: a folder is replaced in one step, so they see
    one whole version either way. Where the file system has no locks, a warning says so and writers are not
    serialised."""
    destination = real_destination(destination)
    path = lock_path(destination)
    created = missing_folders(os.path.dirname(destination))  # for the lock file; removed again if left empty
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    with _HELD_LOCKS_GUARD:
        held = _HELD_LOCKS.setdefault(path, _HeldLock())
    try:
        if not held.thread_lock.acquire(blocking=False):
            if not wait:
                raise WriterBusyError(destination, f"a thread of process {os.getpid()}")
            logger.warning("Waiting for another writer of %s to finish (a thread of this process).", destination)
            held.thread_lock.acquire()
        try:
            if held.depth == 0:
                held.fd = _take_lock_file(path, destination, wait) if fcntl is not None else None
            held.depth += 1
            try:
                yield destination
            finally:
                held.depth -= 1
                if held.depth == 0:
                    fd, held.fd = held.fd, None
                    _drop_lock_file(path, fd)
        finally:
            held.thread_lock.release()
    finally:
        remove_empty_folders(created)


# Staging and retired folders are named after the destination, this machine and the writing process, so that the
# leftovers of a crashed writer can be told from the work of a live one: ".NAME.saving-HOST-PID-RANDOM".
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>saving|replaced)-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[^.]+$")


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def staging_folder(destination: str | os.PathLike, kind: str = "saving") -> str:
    """A new empty sibling folder of `destination` to write into before it replaces `destination` by rename (same
    file system, so the rename is one step). Its name tells clean_leftovers which crashed writer left it."""
    destination = os.path.abspath(os.fspath(destination))
    parent, name = os.path.split(destination)
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.{kind}-{_host_tag()}-{os.getpid()}-", dir=parent)


def clean_leftovers(destination: str | os.PathLike) -> list[str]:
    """Remove what crashed writers of `destination` left beside it (staging folders, a retired old version) and
    return their paths. A retired version is put back first when `destination` itself is missing: a writer that
    died between its two renames (only where one-step exchange is unavailable) loses nothing. Folders of live
    writers, and of writers on other machines sharing the file system, are left alone. Leftovers are looked for beside
    the real folder, where atomic_directory stages (real_destination)."""
    destination = real_destination(destination)
    parent, name = os.path.split(destination)
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return []
    host, removed = _host_tag(), []
    for entry in entries:
        match = _LEFTOVER.match(entry)
        if match is None or match["name"] != name or match["host"] != host or _process_alive(int(match["pid"])):
            continue
        path = os.path.join(parent, entry)
        if match["kind"] == "replaced" and not os.path.lexists(destination):
            os.replace(path, destination)
            logger.warning("Restored %s from %s, left by a writer that crashed while replacing it.", destination, path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.warning("Removed %d leftover(s) of crashed writes of %s: %s", len(removed), destination, removed)
    return removed


def exchange_paths(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Swap two paths in one step (Linux renameat2 with RENAME_EXCHANGE): at every moment each name holds one whole
    version. Returns False, changing nothing, where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(error, os.strerror(error), os.fspath(second))


def _link_tree(source: str, target: str) -> None:
    """Put `source` (file, folder or symbolic link) at `target` without copying data where a hard link can share it."""
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
        shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)
    else:
        link_or_copy(source, target)


def link_or_copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put an immutable file at `target`: a hard link where possible (instant, even for a 12.6 GB corpus or 6.8 GB of
    block embeddings), else a copy written beside the target and renamed into place, so `target` is never partial."""
    temporary = f"{os.fspath(target)}.tmp-{os.getpid()}"
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
    os.replace(temporary, target)


@dataclass(frozen=True)
class FileMapping:
    """The file a span of this process's memory is mapped from (see `file_mapping`)."""

    path: str  # the name it was mapped through, which may since have been unlinked
    device: int  # st_dev of the file
    inode: int
    written_bytes: int  # pages of the span's mappings written since mapping (copied: they no longer equal the file)

    def is_named(self, path: str | os.PathLike) -> bool:
        """Whether `path` names the mapped file now (the name it was mapped through may have been replaced since, or
        deleted while another hard link keeps the file)."""
        try:
            info = os.stat(path)
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == (self.device, self.inode)


def file_mapping(address: int, num_bytes: int) -> FileMapping | None:
    """The file whose pages back the memory [address, address + num_bytes) of this process, or None when (part of) it
    is anonymous memory (a tensor read into RAM), spans several files, or the system has no /proc/self/smaps (not
    Linux). Works for any mapping (np.memmap, safetensors' safe_open, torch.load(mmap=True)). A private mapping's
    written pages become anonymous copies, counted in `written_bytes`: 0 means the memory still equals the file."""
    if num_bytes < 1:
        return None
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="surrogateescape") as smaps:
            lines = smaps.read().splitlines()
    except OSError:
        return None
    end, covered, found, written, inside = address + num_bytes, address, None, 0, False
    for line in lines:
        fields = line.split(maxsplit=5)
        if not fields:
            continue
        if not fields[0].endswith(":"):  # a mapping's header: start-end perms offset dev inode [path]
            start, stop = (int(bound, 16) for bound in fields[0].split("-"))
            inside = start < end and stop > address
            if not inside:
                continue
            path = fields[5] if len(fields) == 6 else ""
            if start > covered or not path or path.startswith("[") or fields[4] == "0":
                return None  # a gap or anonymous memory
            path = path.removesuffix(" (deleted)")  # the name was unlinked; the file is still mapped
            major, minor = (int(part, 16) for part in fields[3].split(":"))
            key = (path, os.makedev(major, minor), int(fields[4]))
            if found is not None and key != found:
                return None
            found, covered = key, max(covered, stop)
        elif inside and fields[0] == "Anonymous:":
            written += int(fields[1]) * 1024
    if found is None or covered < end:
        return None
    return FileMapping(path=found[0], device=found[1], inode=found[2], written_bytes=written)


def replace_folder(
    staging: str | os.PathLike, destination: str | os.PathLike, keep: Callable[[str], bool] | None = None
) -> None:
    """Make the finished `staging` folder the folder `destination`, all at once as a reader sees it: a loader finds
    either the whole old version or the whole new one, never new weights beside an old index.

    keep(name) chooses entries of the old `destination` (by name, top level) that `staging` lacks to carry into the
    new version, hard-linked (no data copied): e.g. a model card, checkpoints or an index beside saved weights. Then
    the two folders are exchanged in one rename (renameat2) where the system can; elsewhere the old one is renamed
    aside and the new one into place, and the next atomic_directory write of `destination` (its clean_leftovers)
    repairs a crash between the two. The one case that cannot
    be all-or-nothing is a destination holding the working directory (exchanging it would leave the process in the
    deleted old version): there each entry replaces its namesake by rename, one at a time. A `destination` reached
    through symbolic links is replaced where they point (real_destination): make `staging` beside that folder."""
    staging, destination = os.path.abspath(os.fspath(staging)), real_destination(destination)
    if os.path.isdir(destination) and not os.path.islink(destination) and keep is not None:
        for name in os.listdir(destination):
            if not os.path.lexists(os.path.join(staging, name)) and keep(name):
                _link_tree(os.path.join(destination, name), os.path.join(staging, name))
    if not os.path.lexists(destination):
        try:
            os.replace(staging, destination)
            return
        except OSError as error:  # another writer's version appeared meanwhile: replace it as below
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if path_within(os.getcwd(), destination):
        _move_entries(staging, destination)
        shutil.rmtree(staging, ignore_errors=True)
        return
    if exchange_paths(staging, destination):
        shutil.rmtree(staging, ignore_errors=True)  # now the old version
        return
    retired = staging_folder(destination, "replaced")  # empty: the old folder is renamed onto it
    os.replace(destination, retired)
    try:
        os.replace(staging, destination)
    except BaseException:
        os.replace(retired, destination)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _move_entries(staging: str, directory: str) -> None:
    """Each entry of staging replaces its namesake in directory by rename (a folder by exchange where possible)."""
    for name in os.listdir(staging):
        source, target = os.path.join(staging, name), os.path.join(directory, name)
        if os.path.isdir(source) and os.path.isdir(target) and not os.path.islink(target):
            if exchange_paths(source, target):
                shutil.rmtree(source)  # now the old version
                continue
            shutil.rmtree(target)
        os.replace(source, target)


@contextlib.contextmanager
def atomic_directory(
    destination: str | os.PathLike,
    overwrite: bool = False,
    replaceable: Callable[[str], str | None] | None = None,
    keep: Callable[[str], bool] | None = None,
    inputs: Inputs = (),
) -> Iterator[str]:
    """Yield a staging folder to fill; on success it gets umask-derived modes and replaces `destination` with
    replace_folder (all at once; entries of the old folder that keep(name) accepts carried over); on failure it
    vanishes. The whole write holds writer_lock(destination): a second writer of the folder waits for the first.
    Leftovers of crashed earlier writes of `destination` are cleaned first. A destination reached through symbolic
    links is written where they point; the links stay.

    What may be written: never a folder that is, holds or lies inside one of `inputs`; else see check_replaceable,
    checked before and again after writing. With `keep` the destination is updated rather than replaced, and is
    refused only when `replaceable` is given too (then as check_replaceable says). A failed write leaves nothing
    behind, not even the parent folders it created."""
    destination = real_destination(destination)
    try:
        with writer_lock(destination):  # makes the parent folders, and removes them again if the write fails
            _check_writable(destination, overwrite, replaceable, keep, inputs)
            clean_leftovers(destination)
            staging = staging_folder(destination)
            try:
                yield staging
                _check_writable(destination, overwrite, replaceable, keep, inputs)  # changed by another program?
                apply_umask_modes(staging)  # mkdtemp makes it private, safetensors' writer 0600
                replace_folder(staging, destination, keep)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except BaseException as error:
        full = full_disk_error(error, destination)
        if full is not None:
            raise full from error
        raise


def _check_writable(destination: str, overwrite: bool, replaceable, keep, inputs) -> None:
    """atomic_directory's refusals: check_replaceable's, or for an update only what it cannot update."""
    if keep is None or replaceable is not None:
        check_replaceable(destination, overwrite, replaceable, inputs)
        return
    check_apart(destination, inputs, why="replacing would delete")
    if os.path.lexists(destination) and not os.path.isdir(destination):
        raise NotADirectoryError(f"{destination} exists and is not a folder.")


__all__ = [
    "FileMapping",
    "FullDiskError",
    "WriterBusyError",
    "apply_umask_modes",
    "atomic_directory",
    "check_apart",
    "check_replaceable",
    "clean_leftovers",
    "current_umask",
    "exchange_paths",
    "file_mapping",
    "full_disk_error",
    "link_or_copy",
    "lock_path",
    "missing_folders",
    "path_within",
    "real_destination",
    "remove_empty_folders",
    "replace_folder",
    "staging_folder",
    "write_text_atomic",
    "writer_lock",
]
