"""Atomic writes of whole folders: nothing half-written is ever visible under the final name, and what is written
gets the permissions the user's umask gives (not the private 0700 / 0600 of tempfile.mkdtemp and some writers)."""

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator


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


def path_within(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether `path` is `folder` or lies inside it (compared as real paths: links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_replaceable(
    destination: str | os.PathLike,
    overwrite: bool = False,
    replaceable: Callable[[str], str | None] | None = None,
) -> None:
    """Raise unless atomic_directory(destination, overwrite, replaceable) may write `destination`: an existing one
    only with overwrite, never one that is or holds the working directory, and, when not empty, only one that
    `replaceable(destination)` accepts (it returns None, else the reason, raised as FileExistsError)."""
    destination = os.path.abspath(os.fspath(destination))
    if not os.path.lexists(destination):
        return
    if not overwrite:
        raise FileExistsError(f"{destination} already exists; choose another folder or pass overwrite=True.")
    if path_within(os.getcwd(), destination):
        raise ValueError(f"Refusing to replace {destination}: it is or holds the working directory.")
    if replaceable is not None and not (os.path.isdir(destination) and not os.listdir(destination)):
        reason = replaceable(destination)
        if reason is not None:
            raise FileExistsError(f"Refusing to replace {destination}: {reason}")


@contextlib.contextmanager
def atomic_directory(
    destination: str | os.PathLike,
    overwrite: bool = False,
    replaceable: Callable[[str], str | None] | None = None,
) -> Iterator[str]:
    """Yield a temporary sibling folder to fill; on success it gets umask-derived modes and replaces `destination` by
    rename (an existing folder only with overwrite=True, and only once the new one is complete); on failure it
    vanishes.

    What may be replaced: see check_replaceable (an existing folder holding the working directory never is)."""
    destination = os.path.abspath(os.fspath(destination))
    check_replaceable(destination, overwrite, replaceable)
    parent = os.path.dirname(destination)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(destination)}-", dir=parent)
    try:
        yield staging
        apply_umask_modes(staging)  # mkdtemp makes it private
        retired = None
        if os.path.lexists(destination):
            retired = tempfile.mkdtemp(prefix=".replaced-", dir=parent)
            os.replace(destination, os.path.join(retired, "old"))
        os.replace(staging, destination)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


__all__ = ["apply_umask_modes", "atomic_directory", "check_replaceable", "current_umask", "path_within"]
