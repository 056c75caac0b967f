"""The learner's workspace: ``labs/NN/`` (git-ignored), the stage's files with each marked body stubbed, and a
task sheet. Nothing here writes to the repository's own source."""
from __future__ import annotations

import difflib
import shutil
from pathlib import Path

from . import markers
from .catalog import LABS, Lab
from .grade import ROOT, workspace_path

DEFAULT_WORKSPACE = ROOT / "labs"


def learner_files(lab: Lab) -> dict[str, str]:
    """Repository path -> the learner's starting text: every file of the stage, the files of a subpackage that
    holds a task (stage 05's server/), and the marked files outside the stage."""
    stage = ROOT / "stages" / lab.stage
    folders = [stage] + sorted({(ROOT / f).parent for f in lab.files if (ROOT / f).parent.is_relative_to(stage)}
                               - {stage})
    paths = [str(p.relative_to(ROOT)) for folder in folders for p in sorted(folder.iterdir())
             if p.suffix in (".py", ".md", ".cpp")]
    out = {}
    for path in dict.fromkeys(paths + lab.files):
        text = (ROOT / path).read_text(encoding="utf-8")
        out[path] = markers.stub(text, lab.number, path) if path.endswith(".py") else text
    return out


def task_sheet(lab: Lab, workspace: Path) -> str:
    lines = [f"# Lab {lab.number}: stages/{lab.stage}", "",
             f"Read first: [{lab.readme}]({ROOT / lab.readme}).", "",
             "Write each answer between its markers (`# lab NN.K begin: ...` and `# lab NN.K end`), in the files of",
             f"this folder; everything outside the markers is the real stage, unchanged. Check your work with "
             f"`python -m stages.lab check {lab.number}`: each task is graded alone (your body spliced into the "
             f"solution) against the one-request-at-a-time reference, so a rubric line is about that task only.", ""]
    for t in lab.tasks:
        where = workspace_path(lab, workspace, t.file).relative_to(workspace.parent)
        lines += [f"## {t.id}: {t.title}", "", f"File: `{where}`", "", t.build, "", f"The idea: {t.idea}", "",
                  f"Check: `python -m stages.lab check {lab.number}`; stuck: `python -m stages.lab hint {lab.number} "
                  f"{t.id}`.", ""]
    return "\n".join(lines)


def start(number: str, workspace: Path = DEFAULT_WORKSPACE) -> Path:
    lab = LABS[number]
    folder = workspace / number
    if folder.exists():
        raise FileExistsError(f"{folder} exists: keep working there, or `python -m stages.lab reset {number}` to "
                              f"start over (that deletes your answers)")
    for path, text in learner_files(lab).items():
        target = workspace_path(lab, workspace, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    (folder / "TASKS.md").write_text(task_sheet(lab, workspace), encoding="utf-8")
    return folder


def reset(number: str, workspace: Path = DEFAULT_WORKSPACE) -> Path:
    shutil.rmtree(workspace / number, ignore_errors=True)
    return start(number, workspace)


def solution(number: str) -> str:
    """Each task's solution body, from the stage's source."""
    lab, out = LABS[number], []
    for t in lab.tasks:
        text = (ROOT / t.file).read_text(encoding="utf-8")
        for body in markers.bodies(text, t.id, t.file):
            out += [f"# {t.id} {t.title} ({t.file})", body]
    return "\n".join(out)


def diff(number: str, workspace: Path = DEFAULT_WORKSPACE) -> str:
    """The learner's files against the solution (a unified diff)."""
    lab, out = LABS[number], []
    for path in lab.files:
        mine = workspace_path(lab, workspace, path)
        theirs = mine.read_text(encoding="utf-8") if mine.exists() else ""
        out += difflib.unified_diff((ROOT / path).read_text(encoding="utf-8").splitlines(keepends=True),
                                    theirs.splitlines(keepends=True), f"solution/{path}", str(mine))
    return "".join(out)
