"""`python -m stages.lab check NN --xray DIR`: a task that fails on an engine run leaves the failing example as an
X-ray page, and the page's run is that example (the step count the failure names)."""
import json
import re

from stages.lab import LABS, markers
from stages.lab.grade import ROOT, grade_task


def page_trace(path):
    html = path.read_text(encoding="utf-8")
    return json.loads(html.split('<script type="application/json" id="xray-data">')[1].split("</script>")[0])["trace"]


def test_a_failing_lab_task_writes_its_example_as_a_page(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_EXAMPLES_SCALE", "0.5")
    lab = LABS["02"]
    task = lab.tasks[0]
    solution = (ROOT / task.file).read_text(encoding="utf-8")
    planted = markers.plant(solution, task.id, list(task.planted), task.file)
    result = grade_task(lab, task, planted, tmp_path)
    assert not result.passed
    page = tmp_path / f"{task.id}.html"
    assert f"step by step (open it in a browser): {page}" in result.detail and page.exists()
    (run,) = page_trace(page)["runs"]
    took = re.search(r"took (\d+) steps", result.detail)
    assert took, result.detail
    assert len(run["steps"]) == int(took.group(1))
    passing = grade_task(lab, task, solution, tmp_path / "none")
    assert passing.passed and not (tmp_path / "none" / f"{task.id}.html").exists()
