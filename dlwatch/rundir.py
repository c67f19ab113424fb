"""Where the job sockets live, and the checks that keep that place private.

Stdlib only: the probe uses this inside the training job.

The directory is ``$DLWATCH_DIR``, else ``$XDG_RUNTIME_DIR/dlwatch``, else
``/tmp/dlwatch-<uid>``. It must be a real directory (not a symlink), owned by
this user, with no access for group or others; we create it 0700 and refuse
one that is not, because anyone who can write there could impersonate a job
or read its stream.
"""

from __future__ import annotations

import os
import stat

SOCKET_SUFFIX = ".sock"
# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


class RuntimeDirError(OSError):
    """The runtime directory cannot be used safely; the message says why."""


def runtime_dir() -> str:
    d = os.environ.get("DLWATCH_DIR")
    if d:
        return os.path.abspath(d)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "dlwatch")
    return f"/tmp/dlwatch-{os.getuid()}"


def check_dir(path: str) -> None:
    """Raise RuntimeDirError unless ``path`` is a private directory of ours."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RuntimeDirError(f"runtime directory {path} does not exist") from None
    except OSError as e:
        raise RuntimeDirError(f"runtime directory {path} cannot be read: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise RuntimeDirError(f"runtime directory {path} is a symlink; refusing to use it")
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"runtime directory {path} is not a directory")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(
            f"runtime directory {path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
        )
    if st.st_mode & 0o077:
        raise RuntimeDirError(
            f"runtime directory {path} has mode {stat.S_IMODE(st.st_mode):04o}; "
            "it must give no access to group or others (0700)"
        )


def creatable_problem(path: str) -> str | None:
    """Why a job could not create ``path`` as its runtime directory, or None.
    A monitor looking at a directory that does not exist says this rather than
    "no jobs found": no job could ever have published there."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    if not os.path.isdir(parent):
        return (
            f"runtime directory {path} does not exist and cannot be created: "
            f"{parent} is not a directory (check DLWATCH_DIR)"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        return (
            f"runtime directory {path} does not exist and cannot be created: "
            f"no permission to write in {parent} (check DLWATCH_DIR)"
        )
    # access() says yes to root everywhere, and a pseudo-filesystem (/proc,
    # /sys) or a read-only mount refuses anyway: try, with a name of our own
    # beside it (never the directory itself, which a starting job may be
    # creating at this moment), and remove it again.
    import tempfile  # here: the probe imports this module, and needs none of this

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dlwatch-probe-", dir=parent))
    except OSError as e:
        return (
            f"runtime directory {path} does not exist and cannot be created in {parent}: "
            f"{e.strerror} (check DLWATCH_DIR)"
        )
    return None


def problem(path: str) -> str | None:
    """Why a monitor cannot use ``path`` as the runtime directory, or None.
    A directory that does not exist yet is fine (no job has run) unless it
    cannot be created either: then no job could ever publish there."""
    try:
        check_dir(path)
    except RuntimeDirError as e:
        if not os.path.lexists(path):  # missing, or a path through a non-directory
            return creatable_problem(path)
        return str(e)
    return None


def ensure_dir(path: str | None = None) -> str:
    """Create the runtime directory 0700 if missing, then check it."""
    path = path or runtime_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise RuntimeDirError(f"cannot create runtime directory {path}: {e.strerror}") from None
    check_dir(path)
    return path


def socket_path(directory: str, pid: int) -> str:
    path = os.path.join(directory, f"{pid}{SOCKET_SUFFIX}")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise RuntimeDirError(
            f"socket path {path} is longer than the {MAX_SOCKET_PATH}-byte limit of Unix "
            "sockets; set DLWATCH_DIR to a shorter directory"
        )
    return path


def list_sockets(directory: str) -> list[tuple[int, str]]:
    """(pid, path) of every job socket in ``directory``, sorted by pid."""
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        stem, ext = os.path.splitext(name)
        if ext == SOCKET_SUFFIX and stem.isdigit():
            out.append((int(stem), os.path.join(directory, name)))
    return sorted(out)
