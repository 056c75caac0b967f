"""The labs grade: on every lab, `check` passes the untouched solution, fails every task on the fresh stubs, and
fails exactly the planted task (and no other) on each planted wrong answer; the markers round-trip; the command
line starts, checks, hints and resets a workspace without touching the real tree."""
import os
import re
import subprocess
import sys

import pytest

from stages.lab import LABS, grade, markers, rubric
from stages.lab.grade import ROOT, grade_task

pytest.importorskip("triton")


def solution_sources(lab):
    return {t.file: (ROOT / t.file).read_text(encoding="utf-8") for t in lab.tasks}


def marked_files():
    """Every source file that carries a lab marker, and the tasks it marks."""
    out = {}
    for folder in ("common", "stages"):
        for p in (ROOT / folder).rglob("*.py"):
            if "lab" not in p.relative_to(ROOT).parts[:2]:
                tasks = markers.tasks_in(p.read_text(encoding="utf-8"), str(p))
                if tasks:
                    out[str(p.relative_to(ROOT))] = tasks
    return out


def test_every_marker_is_a_catalog_task_and_every_task_is_marked():
    marked = {(path, task) for path, tasks in marked_files().items() for task in tasks}
    catalog = {(t.file, t.id) for lab in LABS.values() for t in lab.tasks}
    assert marked == catalog
    for lab in LABS.values():
        assert [t.id for t in lab.tasks] == [f"{lab.number}.{i}" for i in range(1, len(lab.tasks) + 1)]
        for t in lab.tasks:
            assert len(t.planted) == len(markers.bodies((ROOT / t.file).read_text(encoding="utf-8"), t.id))


def test_stub_and_splice_round_trip():
    for path, tasks in marked_files().items():
        solution = (ROOT / path).read_text(encoding="utf-8")
        lab = tasks[0].split(".")[0]
        stubbed = markers.stub(solution, lab)
        assert markers.tasks_in(stubbed) == tasks  # the markers stay for the learner
        for task in tasks:
            mine = [r for r in markers.regions(stubbed) if r.task == task]
            for b, r, s in zip(markers.bodies(stubbed, task), mine, markers.bodies(solution, task)):
                raises = f'raise NotImplementedError("lab {task}: {r.title}")'
                # a generator's stub stays a generator (an unreachable yield), so it raises where it is read
                assert [line.split("#")[0].strip() for line in b.splitlines()] == (
                    [raises, "yield"] if re.search(r"^\s*(.*= )?yield\b", s, re.M) else [raises])
            assert markers.splice(solution, solution, task) == solution
            assert markers.splice(stubbed, solution, task) != stubbed
        compile(stubbed, path, "exec")  # a stub is valid Python
        assert markers.splice(solution, stubbed, tasks[0]) == markers.splice(solution, stubbed, tasks[0])
        gone = re.sub(r"# lab \d\d\.\d+ (begin: .*|end)\n", "", stubbed)
        with pytest.raises(markers.MarkerError, match="markers of lab .* are missing"):
            markers.splice(solution, gone, tasks[0])


def test_broken_markers_are_refused_with_the_line():
    with pytest.raises(markers.MarkerError, match=":2: lab 01.1 has no end marker"):
        markers.regions("x = 1\n    # lab 01.1 begin: a\ny = 2\n")
    with pytest.raises(markers.MarkerError, match=":1: 'lab 01.2 end' without its begin marker"):
        markers.regions("# lab 01.2 end\n")


@pytest.mark.parametrize("number", sorted(LABS))
def test_lab_grades_solution_stubs_and_each_planted_bug(number, monkeypatch):
    if "STEPWISE_EXAMPLES_SCALE" not in os.environ:
        monkeypatch.setenv("STEPWISE_EXAMPLES_SCALE", "0.5")  # the fixed scenarios catch every planted bug
    lab = LABS[number]
    before = {p: (ROOT / p).read_bytes() for p in lab.files}
    solution = solution_sources(lab)
    results = grade(number, sources=solution)
    assert all(r.passed for r in results), rubric(results)
    stubs = {path: markers.stub(text, number, path) for path, text in solution.items()}
    results = grade(number, sources=stubs)
    for r in results:
        assert not r.passed and "NotImplementedError" in r.detail and f"lab {r.task.id}: " in r.detail, rubric(results)
    for task in lab.tasks:
        planted = dict(solution)
        planted[task.file] = markers.plant(solution[task.file], task.id, list(task.planted), task.file)
        results = grade(number, sources=planted)
        assert [r.task.id for r in results if not r.passed] == [task.id], f"planted {task.id}:\n{rubric(results)}"
        assert "NotImplementedError" not in results[[t.id for t in lab.tasks].index(task.id)].detail
    assert {p: (ROOT / p).read_bytes() for p in lab.files} == before  # grading never writes the real tree


def lab_command(workspace, *args):
    env = {**os.environ, "STEPWISE_EXAMPLES_SCALE": os.environ.get("STEPWISE_EXAMPLES_SCALE", "0.5")}
    return subprocess.run([sys.executable, "-m", "stages.lab", "--workspace", str(workspace), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_command_line_start_check_hint_diff_reset(tmp_path):
    out = lab_command(tmp_path, "start", "05")
    assert out.returncode == 0, out.stderr
    sheet = (tmp_path / "05" / "TASKS.md").read_text()
    assert "stages/05_streaming/README.md#what-the-code-does" in sheet and "python -m stages.lab check 05" in sheet
    assert "## 05.1: the incremental detokenizer" in sheet and "## 05.2: hold back a possible stop string" in sheet
    assert "## 05.3: the SSE chunk events" in sheet and "/05/server/events.py`" in sheet
    mine = tmp_path / "05" / "common" / "tokenizer.py"
    assert 'raise NotImplementedError("lab 05.1: the incremental detokenizer")' in mine.read_text()
    events = tmp_path / "05" / "server" / "events.py"
    assert 'raise NotImplementedError("lab 05.3: the SSE chunk events")' in events.read_text()
    assert (tmp_path / "05" / "engine.py").read_text() == (ROOT / "stages/05_streaming/engine.py").read_text()
    assert (tmp_path / "05/server/app.py").read_text() == (ROOT / "stages/05_streaming/server/app.py").read_text()
    assert lab_command(tmp_path, "start", "05").returncode == 1  # never overwrites answers
    out = lab_command(tmp_path, "check", "05")
    assert out.returncode == 1 and "0 of 3 tasks pass" in out.stdout, out.stdout + out.stderr
    mine.write_text((ROOT / "common/tokenizer.py").read_text())  # the learner solves 05.1 and 05.3
    events.write_text((ROOT / "stages/05_streaming/server/events.py").read_text())
    out = lab_command(tmp_path, "check", "05")
    assert out.returncode == 1 and "2 of 3 tasks pass" in out.stdout, out.stdout + out.stderr
    assert re.search(r"05\.1 the incremental detokenizer +pass", out.stdout)
    assert re.search(r"05\.2 hold back a possible stop string +FAIL", out.stdout)
    assert re.search(r"05\.3 the SSE chunk events +pass", out.stdout)
    assert "hold back" in lab_command(tmp_path, "hint", "05", "2").stdout.lower()
    assert "lab 05.2" in lab_command(tmp_path, "diff", "05").stdout
    assert "return max(0, len(seq.output_text)" in lab_command(tmp_path, "solution", "05").stdout
    assert lab_command(tmp_path, "reset", "05").returncode == 0
    assert "NotImplementedError" in mine.read_text()
    listed = lab_command(tmp_path, "list").stdout
    assert all(t.id in listed for lab in LABS.values() for t in lab.tasks)


SSE_EVENTS = "stages/05_streaming/server/events.py"


@pytest.mark.parametrize("wrong, right, says", [
    ('        yield "data: [DONE]\\n\\n"\n        if include_usage and not failed:',
     "        if include_usage and not failed:",
     r"event 11 of 13 \(data: '\[DONE\]'\): \[DONE\] here, but 2 event\(s\) follow it"),
    ("            pass", '            yield sse(head | {"choices": [], "usage": usage(prompt_tokens, tokens)})',
     "include_usage asks for a usage chunk .*none came"),
    ("        pass", "        yield sse(internal_error(e).body())", "no error event came before \\[DONE\\]"),
    ("            tokens += 0", "            tokens += len(chunk.token_ids)",
     r"usage \{'prompt_tokens': 4, 'completion_tokens': 0, 'total_tokens': 4\}; expected \{'prompt_tokens': 4, "
     r"'completion_tokens': 12, 'total_tokens': 16\}"),
], ids=["DONE before the usage chunk", "usage omitted", "no error event", "usage counts no token"])
def test_wrong_sse_events_fail_05_3_naming_the_event(wrong, right, says):
    """More wrong answers than the planted one: each fails 05.3, its rubric line saying which event is wrong and
    what was expected there (the request, the event, the reference's usage)."""
    solution = (ROOT / SSE_EVENTS).read_text(encoding="utf-8")
    body = markers.bodies(solution, "05.3")[0]
    assert right in body
    lab = LABS["05"]
    result = grade_task(lab, lab.tasks[2], markers.replace(solution, "05.3", [body.replace(right, wrong, 1)]))
    assert not result.passed and re.search(says, result.detail), result.detail
    assert "NotImplementedError" not in result.detail
