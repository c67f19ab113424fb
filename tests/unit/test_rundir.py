"""The private runtime directory: creation, refusal of unsafe ones, socket paths."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from dlwatch import rundir
from dlwatch.rundir import RuntimeDirError


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(m):
        os.umask(m)

    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o002])
def test_created_0700_whatever_the_umask(short_tmpdir, umask, mask):
    umask(mask)
    path = os.path.join(short_tmpdir, "rt")
    assert rundir.ensure_dir(path) == path
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.getuid()
    # Idempotent on a good existing directory.
    assert rundir.ensure_dir(path) == path
    assert mode_of(path) == 0o700


def test_runtime_dir_error_is_an_oserror():
    # The publisher turns OSError into "not monitoring": this must stay true.
    assert issubclass(RuntimeDirError, OSError)


def test_symlink_refused(short_tmpdir):
    real = os.path.join(short_tmpdir, "real")
    os.mkdir(real, 0o700)
    link = os.path.join(short_tmpdir, "link")
    os.symlink(real, link)
    for f in (rundir.check_dir, rundir.ensure_dir):
        with pytest.raises(RuntimeDirError, match="is a symlink; refusing"):
            f(link)


def test_dangling_symlink_refused(short_tmpdir):
    link = os.path.join(short_tmpdir, "link")
    os.symlink(os.path.join(short_tmpdir, "nowhere"), link)
    with pytest.raises(RuntimeDirError, match="symlink"):
        rundir.ensure_dir(link)
    assert not os.path.exists(os.path.join(short_tmpdir, "nowhere"))


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o750, 0o701, 0o710, 0o1777])
def test_loose_modes_refused(short_tmpdir, mode):
    path = os.path.join(short_tmpdir, "rt")
    os.mkdir(path)
    os.chmod(path, mode)
    with pytest.raises(RuntimeDirError) as e:
        rundir.ensure_dir(path)
    msg = str(e.value)
    assert f"mode {stat.S_IMODE(mode):04o}" in msg and "0700" in msg and path in msg
    assert mode_of(path) == stat.S_IMODE(mode)  # refused, not silently "fixed"


@pytest.mark.parametrize("mode", [0o700, 0o500, 0o300])
def test_private_modes_accepted(short_tmpdir, mode):
    path = os.path.join(short_tmpdir, "rt")
    os.mkdir(path)
    os.chmod(path, mode)
    rundir.check_dir(path)


def test_owned_by_another_user_refused(short_tmpdir):
    if os.getuid() != 0:
        pytest.skip("needs root to chown")
    path = os.path.join(short_tmpdir, "rt")
    os.mkdir(path, 0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(RuntimeDirError, match="owned by uid 65534, not by you"):
        rundir.ensure_dir(path)


def test_not_a_directory_refused(short_tmpdir):
    path = os.path.join(short_tmpdir, "file")
    with open(path, "w") as f:
        f.write("x")
    os.chmod(path, 0o600)
    with pytest.raises(RuntimeDirError, match="is not a directory"):
        rundir.ensure_dir(path)
    sock_path = os.path.join(short_tmpdir, "s")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(sock_path)
        with pytest.raises(RuntimeDirError, match="is not a directory"):
            rundir.check_dir(sock_path)
    finally:
        s.close()


def test_missing_directory(short_tmpdir):
    with pytest.raises(RuntimeDirError, match="does not exist"):
        rundir.check_dir(os.path.join(short_tmpdir, "missing"))
    with pytest.raises(RuntimeDirError, match="cannot create runtime directory"):
        rundir.ensure_dir(os.path.join(short_tmpdir, "no", "such", "parent"))


# --- socket paths ---------------------------------------------------------------------


def test_socket_path_short():
    assert rundir.socket_path("/tmp/x", 1234) == "/tmp/x/1234.sock"


def test_socket_path_too_long_names_dlwatch_dir():
    d = "/tmp/" + "d" * 120
    with pytest.raises(RuntimeDirError) as e:
        rundir.socket_path(d, 1234)
    msg = str(e.value)
    assert "DLWATCH_DIR" in msg and "107" in msg


def test_socket_path_limit_is_exact_and_real(short_tmpdir):
    pid = 12345
    suffix = f"/{pid}.sock"
    room = rundir.MAX_SOCKET_PATH - len(short_tmpdir) - len(suffix) - 1
    d107 = os.path.join(short_tmpdir, "a" * room)
    os.mkdir(d107)
    p = rundir.socket_path(d107, pid)
    assert len(p) == 107
    # 107 bytes is really bindable.
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(p)
    finally:
        s.close()
    with pytest.raises(RuntimeDirError):
        rundir.socket_path(d107 + "b", pid)


def test_socket_path_counts_bytes_not_characters():
    d = "/tmp/" + "é" * 60  # 65 characters, 125 bytes
    assert len(os.path.join(d, "1.sock")) < 107
    with pytest.raises(RuntimeDirError, match="DLWATCH_DIR"):
        rundir.socket_path(d, 1)


# --- resolution order -------------------------------------------------------------------


def test_env_resolution_order(short_tmpdir, monkeypatch):
    xdg = os.path.join(short_tmpdir, "xdg")
    os.mkdir(xdg, 0o700)
    own = os.path.join(short_tmpdir, "own")
    fallback = f"/tmp/dlwatch-{os.getuid()}"

    monkeypatch.setenv("DLWATCH_DIR", own)
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    assert rundir.runtime_dir() == own

    monkeypatch.setenv("DLWATCH_DIR", "")  # empty counts as unset
    assert rundir.runtime_dir() == os.path.join(xdg, "dlwatch")

    monkeypatch.delenv("DLWATCH_DIR")
    assert rundir.runtime_dir() == os.path.join(xdg, "dlwatch")

    monkeypatch.setenv("XDG_RUNTIME_DIR", os.path.join(short_tmpdir, "gone"))
    assert rundir.runtime_dir() == fallback

    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    assert rundir.runtime_dir() == fallback

    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert rundir.runtime_dir() == fallback


def test_relative_dlwatch_dir_is_made_absolute(short_tmpdir, monkeypatch):
    monkeypatch.chdir(short_tmpdir)
    monkeypatch.setenv("DLWATCH_DIR", "rel")
    assert rundir.runtime_dir() == os.path.join(short_tmpdir, "rel")


def test_ensure_dir_without_argument_uses_the_environment(short_tmpdir, monkeypatch):
    target = os.path.join(short_tmpdir, "fromenv")
    monkeypatch.setenv("DLWATCH_DIR", target)
    assert rundir.ensure_dir() == target
    assert mode_of(target) == 0o700


def test_ensure_dir_under_xdg(short_tmpdir, monkeypatch):
    monkeypatch.delenv("DLWATCH_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", short_tmpdir)
    assert rundir.ensure_dir() == os.path.join(short_tmpdir, "dlwatch")
    assert mode_of(os.path.join(short_tmpdir, "dlwatch")) == 0o700


def test_list_sockets(short_tmpdir):
    for name in ["300.sock", "20.sock", "abc.sock", "12.txt", "7.sock.bak", "-1.sock"]:
        open(os.path.join(short_tmpdir, name), "w").close()
    assert rundir.list_sockets(short_tmpdir) == [
        (20, os.path.join(short_tmpdir, "20.sock")),
        (300, os.path.join(short_tmpdir, "300.sock")),
    ]
    assert rundir.list_sockets(os.path.join(short_tmpdir, "missing")) == []
