"""The processes an instrument starts, and how every one of them ends.

A peer or a server is a tree of processes (vLLM's runner starts an engine core and workers; aiperf a controller
and its workers), and ending the one process an instrument started leaves the rest running, holding memory and
cores that every later measurement then shares without saying so. So each child starts in a session of its own
(``start_new_session``), and ending it ends the session: SIGTERM to every member, a grace period for them to
go, SIGKILL to whatever stayed, then a wait until none is left. It ends that way on every exit: done, failed,
timed out, or interrupted (SIGINT, or SIGTERM, which `session` turns into an exit that runs ``finally``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

GRACE_S = 10.0  # how long a session gets to end on SIGTERM before SIGKILL


def proc_stats() -> dict[int, list[str]]:
    """Every live process's /proc/PID/stat fields after ``pid (comm)``: [0] state, [1] ppid, [2] process group,
    [3] session, ..., [11] utime and [12] stime in clock ticks. A process that ends while it is read is left out."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    stats[int(entry.name)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    return stats


def members(sid: int) -> list[int]:
    """The processes of session ``sid`` still running (a zombie has ended: it only waits for its parent)."""
    return [pid for pid, f in proc_stats().items() if int(f[3]) == sid and f[0] != "Z"]


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def end(proc: subprocess.Popen, grace: float | None = None) -> None:
    """End ``proc`` and every process of its session, and return only when none is left. A SIGINT or SIGTERM
    that comes meanwhile is held and delivered after, so a second Ctrl-C cannot cut the cleanup short."""
    grace = GRACE_S if grace is None else grace
    with signals_held():
        signal_all(members(proc.pid), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (proc.poll() is None or members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        signal_all(members(proc.pid), signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + grace
        while members(proc.pid) and time.monotonic() < deadline:  # killed, not yet gone from the process table
            time.sleep(0.01)


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM recorded, not acted on, inside the block; the first one is raised again after it, to the
    handler that was there before (on the main thread, where Python runs its signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    before = {s: h for s, h in before.items() if h is not None}  # None: set outside Python, left alone
    for s in before:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        if held:
            signal.raise_signal(held[0])


def exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # runs every ``finally`` on the way out, as Ctrl-C's KeyboardInterrupt does


@contextlib.contextmanager
def session(cmd: list[str], grace: float | None = None, **popen):
    """``cmd`` in a session of its own (``popen`` as `subprocess.Popen` takes it); yields the process, then ends
    the whole session (`end`), whatever ends the block. While it runs, SIGTERM exits this process through that
    cleanup where it would otherwise kill it outright (where no other handler was set, on the main thread)."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if on_main else None
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        with subprocess.Popen(cmd, start_new_session=True, **popen) as proc:  # its exit closes the pipes
            try:
                yield proc
            finally:
                end(proc, grace)
    finally:
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


def run(cmd: list[str], timeout: float | None = None, capture_output: bool = False, grace: float | None = None,
        **popen) -> subprocess.CompletedProcess:
    """`subprocess.run` in a session of its own: on a timeout (`subprocess.TimeoutExpired` is raised) or an
    interruption the child's whole session ends, not the child alone; and when the child ends, so does what it
    left running (which would otherwise hold a captured output's pipe open, and this call, forever)."""
    if capture_output:
        popen |= {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    deadline = None if timeout is None else time.monotonic() + timeout
    with session(cmd, grace, **popen) as proc:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=0.2)  # retried, it loses no output
                break
            except subprocess.TimeoutExpired:
                if proc.poll() is not None:
                    end(proc, grace)
                elif deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(cmd, timeout) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
