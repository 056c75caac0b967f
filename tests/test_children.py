"""An interrupted measurement leaves nothing running: a child an instrument starts ends with its whole session
(grandchildren, one that ignores SIGTERM and one in a process group of its own included) when the instrument is
interrupted (SIGINT, SIGTERM), times out, fails, or simply finishes. The oracle is the process table itself
(/proc), read by pid, independent of the code under test."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from stages.bench import children

ROOT = Path(__file__).resolve().parents[1]

# A peer's runner as vLLM's is: a process that starts others (a plain one, one that ignores SIGTERM, one in a process
# group of its own), writes every pid it knows to $PIDS_FILE, then works until it is stopped.
FAKE_RUNNER = """
    import signal, subprocess, sys, time
    from pathlib import Path
    sleep = "import time; time.sleep(600)"
    kids = [subprocess.Popen([sys.executable, "-c", sleep]),
            subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(600)"]),
            subprocess.Popen([sys.executable, "-c", sleep], process_group=0)]
    Path(os.environ["PIDS_FILE"]).write_text(" ".join(str(p) for p in [os.getpid()] + [k.pid for k in kids]))
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running, by the process table: gone, or a zombie waiting for its parent, is not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def started_pids(folder: Path) -> list[int]:
    pids = wait_for(lambda: (folder / "pids").exists() and (folder / "pids").read_text().split())
    return [int(p) for p in pids]


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("PIDS_FILE", str(tmp_path / "pids"))
    path = tmp_path / "runner.py"
    path.write_text("import os\n" + textwrap.dedent(FAKE_RUNNER))
    yield path
    for pid in map(int, (tmp_path / "pids").read_text().split() if (tmp_path / "pids").exists() else []):
        if alive(pid):  # the test failed: leave nothing behind anyway
            os.kill(pid, signal.SIGKILL)


def test_the_fake_runner_leaves_processes_behind_when_only_it_is_ended(runner, tmp_path):
    """The oracle first: ending the runner alone (what `subprocess.run` does on a timeout) leaves its children."""
    proc = subprocess.Popen([sys.executable, str(runner), str(tmp_path / "settings.json")])
    pids = started_pids(tmp_path)
    proc.kill()
    proc.wait()
    assert not alive(pids[0]) and all(alive(p) for p in pids[1:])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_vllm_peer_leaves_nothing_running(runner, tmp_path, signum):
    """The ladder's vLLM peer (`run_vllm`), its runner replaced by the fake, interrupted mid-run."""
    driver = textwrap.dedent(f"""
        import signal
        from pathlib import Path
        from stages.bench import children, peer_vllm
        # Ctrl-C as in a terminal: a suite started in the background by a non-interactive shell (nohup ... &)
        # hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt (this test hung so)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        children.GRACE_S = 1.0
        peer_vllm.VENV = Path({str(tmp_path / "no-venv")!r})
        peer_vllm.run_vllm({{"prompts": [[1]]}}, python={sys.executable!r}, runner={str(runner)!r})
    """)
    env = {**os.environ, "STEPWISE_HOME": str(tmp_path / "home")}
    ladder = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        pids = started_pids(tmp_path)
        assert all(alive(p) for p in pids)
        ladder.send_signal(signum)
        code = ladder.wait(timeout=60)
    finally:
        if ladder.poll() is None:
            ladder.kill()
    assert code == (128 + signal.SIGTERM if signum == signal.SIGTERM else -signal.SIGINT), ladder.stderr.read()
    assert [p for p in pids if alive(p)] == []


def test_a_timed_out_or_failed_child_leaves_nothing_running(runner, tmp_path):
    """A run past its timeout (the peer's hour; here 15 s, time enough for the fake to start everything), then a
    measurement that fails while its child runs."""
    with pytest.raises(subprocess.TimeoutExpired):
        children.run([sys.executable, str(runner), str(tmp_path / "a")], timeout=15, grace=1.0)
    pids = started_pids(tmp_path)
    assert len(pids) == 4 and [p for p in pids if alive(p)] == []
    (tmp_path / "pids").unlink()
    with pytest.raises(RuntimeError, match="the measurement failed"):
        with children.session([sys.executable, str(runner), str(tmp_path / "b")], grace=1.0):
            started_pids(tmp_path)
            raise RuntimeError("the measurement failed")
    assert [p for p in started_pids(tmp_path) if alive(p)] == []


def test_a_finished_child_leaves_no_grandchild(tmp_path):
    """A run that ends by itself still ends what it started and left behind."""
    script = tmp_path / "leaves.py"
    script.write_text("import subprocess, sys\nkid = subprocess.Popen([sys.executable, '-c', "
                      "'import time; time.sleep(600)'])\nprint(kid.pid)\n")
    out = children.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert not alive(int(out.stdout.split()[0]))


def server_of(load_pid: int) -> tuple[int, str]:
    """The `serve` process a load run started, and its URL (from its command line)."""
    for pid, fields in children.proc_stats().items():
        if int(fields[1]) == load_pid:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "serve" in cmdline and (port := re.search(r"--port (\d+)", cmdline)):
                return pid, f"http://127.0.0.1:{port.group(1)}"
    return None


def test_an_interrupted_load_run_stops_the_server_it_started(tmp_path):
    """`python -m stages.bench.load`, stopped with SIGTERM while its clients stream from the `serve` it started:
    it exits through its cleanup, and the server is gone when it has."""
    load = subprocess.Popen([sys.executable, "-m", "stages.bench.load", "--model", "tiny", "--num-requests", "400",
                             "--max-tokens", "64", "--ignore-eos", "--max-concurrency", "4"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        server, url = wait_for(lambda: server_of(load.pid), 120)
        wait_for(lambda: _healthy(url), 300)
        time.sleep(1.0)  # the warm-up done, requests streaming
        assert alive(server)
        load.send_signal(signal.SIGTERM)
        assert load.wait(timeout=120) == 128 + signal.SIGTERM, load.stderr.read()[-2000:]
        assert not alive(server)
    finally:
        if load.poll() is None:
            load.kill()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
