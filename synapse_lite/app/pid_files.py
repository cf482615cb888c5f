"""Pid files in ``<data_dir>/run/``: one per running process (written by the
process itself) and ``launcher.pid`` for ``synapse-lite run``."""

from __future__ import annotations

import os

#: The file name (without .pid) of ``synapse-lite run``'s own pid file.
LAUNCHER = "launcher"


def pid_file_path(data_dir: str, name: str) -> str:
    """Where the process ``name`` (or :data:`LAUNCHER`) records its pid."""
    return os.path.join(data_dir, "run", f"{name}.pid")


def write_pid_file(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{os.getpid()}\n")


def remove_pid_file(path: str) -> None:
    """Remove the file if it is still ours (a newer run may have replaced it)."""
    if read_pid_file(path) == os.getpid():
        try:
            os.unlink(path)
        except OSError:
            pass


def read_pid_file(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid runs (a stale file's pid may not; an
    exited process nobody has reaped yet, a zombie, does not count)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (comm) state ...": the state follows the last ')'.
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc here: trust kill()


def running_pid(data_dir: str, name: str) -> int | None:
    """The pid of ``name`` if its pid file names a live process."""
    pid = read_pid_file(pid_file_path(data_dir, name))
    return pid if pid_alive(pid) else None
