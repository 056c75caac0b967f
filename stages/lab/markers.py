"""A lab's tasks are regions of the stages' real source, between two comments the solution keeps:

    # lab 02.1 begin: refill free slots
    ...the solution...
    # lab 02.1 end

so a lab cannot drift from the code it teaches: the learner's copy is the source itself with each marked body
replaced by a stub, and grading puts the learner's body back into the solution (``splice``).
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# lab (?P<task>\d\d\.\d+) begin: (?P<title>.+?)\s*$")
END = re.compile(r"^[ \t]*# lab (?P<task>\d\d\.\d+) end\s*$")


class MarkerError(ValueError):
    """The markers of a file are broken (unmatched, nested, or gone from a learner's copy)."""


@dataclass(frozen=True)
class Region:
    task: str  # "02.1"
    title: str
    indent: str  # the begin marker's indentation, which the body keeps
    begin: int  # line index of the begin marker
    end: int  # line index of the end marker


def regions(source: str, name: str = "<source>") -> list[Region]:
    """Every marked region of ``source``, in order; a task may own several (a function and its helper)."""
    found, open_ = [], None
    for i, line in enumerate(source.splitlines()):
        if m := BEGIN.match(line):
            if open_ is not None:
                raise MarkerError(f"{name}:{i + 1}: lab {m['task']} begins inside lab {open_[0]['task']}")
            open_ = (m, i)
        elif m := END.match(line):
            if open_ is None or open_[0]["task"] != m["task"]:
                raise MarkerError(f"{name}:{i + 1}: 'lab {m['task']} end' without its begin marker")
            b = open_[0]
            found.append(Region(b["task"], b["title"], b["indent"], open_[1], i))
            open_ = None
    if open_ is not None:
        raise MarkerError(f"{name}:{open_[1] + 1}: lab {open_[0]['task']} has no end marker")
    return found


def tasks_in(source: str, name: str = "<source>") -> list[str]:
    return list(dict.fromkeys(r.task for r in regions(source, name)))


def bodies(source: str, task: str, name: str = "<source>") -> list[str]:
    """The text between each pair of ``task``'s markers."""
    lines = source.splitlines(keepends=True)
    return ["".join(lines[r.begin + 1:r.end]) for r in regions(source, name) if r.task == task]


def replace(source: str, task: str, new_bodies: list[str], name: str = "<source>") -> str:
    """``source`` with the bodies of ``task``'s regions replaced, in order, by ``new_bodies`` (kept as given)."""
    lines = source.splitlines(keepends=True)
    mine = [r for r in regions(source, name) if r.task == task]
    if len(mine) != len(new_bodies):
        raise MarkerError(f"{name}: lab {task} has {len(mine)} marked regions, got {len(new_bodies)} bodies")
    for r, body in sorted(zip(mine, new_bodies), key=lambda rb: -rb[0].begin):  # from the end: indices hold
        if body and not body.endswith("\n"):
            body += "\n"
        lines[r.begin + 1:r.end] = [body] if body else []
    return "".join(lines)


def indented(body: str, indent: str) -> str:
    """A body written flush left (a planted bug in the catalog), at the region's indentation."""
    return "".join(indent + line if line.strip() else line for line in body.splitlines(keepends=True))


def yields(body: str) -> bool:
    """Whether a marked body makes its function a generator (a ``yield`` of its own, not of a nested function)."""
    tree = ast.parse("async def body():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "    pass\n")
    todo = list(tree.body[0].body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def stub_body(region: Region, solution_body: str) -> str:
    """``raise NotImplementedError`` naming the task; where the solution's body yields, an unreachable ``yield``
    keeps the stub a generator, so that it raises where the caller first reads from it (as the solution runs)."""
    text = f'{region.indent}raise NotImplementedError("lab {region.task}: {region.title}")\n'
    if yields(solution_body):
        text += f"{region.indent}yield  # unreachable: this stays a generator, as the solution is\n"
    return text


def stub(source: str, lab: str, name: str = "<source>") -> str:
    """The learner's copy: every body of lab ``lab``'s tasks ("02") is a ``raise NotImplementedError`` naming it."""
    for task in tasks_in(source, name):
        if task.split(".")[0] == lab:
            mine = [r for r in regions(source, name) if r.task == task]
            stubs = [stub_body(r, b) for r, b in zip(mine, bodies(source, task, name))]
            source = replace(source, task, stubs, name)
    return source


def plant(source: str, task: str, flush_left: list[str], name: str = "<source>") -> str:
    """``source`` with ``task``'s bodies replaced by ``flush_left`` ones, each at its region's indentation."""
    mine = [r for r in regions(source, name) if r.task == task]
    return replace(source, task, [indented(b, r.indent) for b, r in zip(flush_left, mine)], name)


def splice(solution: str, learner: str, task: str, name: str = "<source>") -> str:
    """The solution with ``task``'s bodies taken from the learner's copy: one task graded with the others correct."""
    theirs = bodies(learner, task, name)
    if len(theirs) != len(bodies(solution, task, name)):
        raise MarkerError(f"{name}: the markers of lab {task} are missing or changed in your copy; write your answer "
                          f"between '# lab {task} begin: ...' and '# lab {task} end' (`reset` restores them)")
    return replace(solution, task, theirs, name)
