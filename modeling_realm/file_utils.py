"""Atomic writes of whole folders: nothing half-written is ever visible under the final name."""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_directory(destination: str | os.PathLike, overwrite: bool = False) -> Iterator[str]:
    """Yield a temporary sibling folder to fill; on success it replaces `destination` by rename (an existing folder
    only with overwrite=True, and only once the new one is complete); on failure it vanishes."""
    destination = os.path.abspath(os.fspath(destination))
    if os.path.exists(destination) and not overwrite:
        raise FileExistsError(f"{destination} already exists; choose another folder or pass overwrite=True.")
    parent = os.path.dirname(destination)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(destination)}-", dir=parent)
    try:
        yield staging
        os.chmod(staging, 0o755)  # mkdtemp makes it private
        retired = None
        if os.path.exists(destination):
            retired = tempfile.mkdtemp(prefix=".replaced-", dir=parent)
            os.replace(destination, os.path.join(retired, "old"))
        os.replace(staging, destination)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


__all__ = ["atomic_directory"]
