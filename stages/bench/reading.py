"""python -m stages.bench.reading [--steps]: what a learner reads to understand one stage, and what one step runs.

Counts measured from the code as it stands (no figure here is typed in):

* **lines read**, the lesson: what the issue calls "its folder plus the core modules and parent parts it names".
  Start at the stage's ``engine.py``; read every module of the stage's folder it reaches, every module those name
  (import, module-level or inside a function), and, read the same way, each part of another stage that one of
  their classes inherits from (a learner reads a parent to know what its child does). A core module (``common/``)
  is read where it is named, not followed further. Left out: the model loader every stage stands on
  (``common/loader.py``, ``prepare.py``, ``paths.py``, ``gguf_convert.py``, ``config.py``, ``tokenizer.py``) and
  the commands (``__main__.py``). An import through a stage's door (``from stages import paged_kv``) names the
  stage package it maps to, whose ``__init__`` is read through (it only hands names on). "Of them, parts named"
  reads a parent part without what it names in turn (its own parents still).
* **support, read apart**: support a stage rests on is read apart from its lesson: ``common/numerics/`` (the
  arithmetic under the core) and a stage's ``schema/``-style support sub-package (``SUPPORT_PACKAGES``; stage 07's
  JSON-Schema dialect layer, which in vLLM lives inside the grammar libraries). Its lines are counted in their own
  column, so no line disappears from view: the support modules the lesson's files name, followed within the
  support, and what they name that the lesson does not read.
* **files one step touches** (``--steps``, loads the tiny model): the repository's Python files whose code runs
  during one ``engine.step()`` of the tiny model, a step that prefills one request while two others decode, traced
  with ``sys.settrace``: the core and the stages' files, and apart from them the support (``common/numerics/``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stages.bench.reading_imports import REGISTRY, ROOT, is_face, parents, parse

STAGE_FOLDERS = sorted(p.name for p in (ROOT / "stages").iterdir() if p.is_dir() and p.name[:2].isdigit())
GROUND = {"common/loader.py", "common/prepare.py", "common/paths.py", "common/gguf_convert.py", "common/config.py",
          "common/tokenizer.py"}
SUPPORT_PACKAGES = ("schema",)  # a stage's sub-package of support: stages/07_structured/schema/


def support_root(path: Path) -> str | None:
    """The support folder ``path`` belongs to (``common/numerics/``, ``stages/07_structured/schema/``), or None."""
    parts = path.relative_to(ROOT).parts
    if parts[:2] == ("common", "numerics"):
        return "common/numerics/"
    if len(parts) > 3 and parts[0] == "stages" and parts[1] in STAGE_FOLDERS and parts[2] in SUPPORT_PACKAGES:
        return "/".join(parts[:3]) + "/"
    return None


def counted(path: Path) -> bool:
    """A module of the lesson: the core or a stage's, not the ground, a command or support (read apart)."""
    rel = path.relative_to(ROOT).as_posix()
    if rel in GROUND or support_root(path) or rel.endswith("__main__.py"):
        return False
    door = path.parent == ROOT / "stages" and path.stem in REGISTRY
    return door or rel.startswith("common/") or any(rel.startswith(f"stages/{folder}/") for folder in STAGE_FOLDERS)


def support_of(read: list[Path]) -> dict[str, set[Path]]:
    """Support folder -> its modules that the files ``read`` name, followed within the support, and the modules
    outside it they name that the lesson does not read (not followed further)."""
    found: dict[str, set[Path]] = {}
    todo = [dep for path in read for dep in parse(path)[1].values() if support_root(dep)]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        mine = found.setdefault(support_root(path), set())
        mine.add(path)
        for dep in parse(path)[1].values():
            if support_root(dep):
                todo.append(dep)
            elif counted(dep) and dep not in read:
                mine.add(dep)
    return found


def in_a_stage(path: Path) -> bool:
    return path.relative_to(ROOT).parts[:2] in {("stages", folder) for folder in STAGE_FOLDERS} or is_face(path)


def read_set(folder: str, everything: bool = False, parent_names: bool = True) -> list[Path]:
    """The stage's engine and the modules of its folder it reaches; every module those name (import); and, read
    the same way, each part of another stage that a class inherits from, with what it names (a package's
    __init__, which only hands names on, is read through). A core module (common/) is read where it is named, not
    followed further. ``parent_names=False``: a parent part is read, and its own parents, but not what it names
    (the issue's words: the stage's folder plus the core modules and parent parts it names). ``everything``:
    every module reachable by imports instead."""
    home = ROOT / "stages" / folder
    start = home / "engine.py"
    read, expanded, todo = {start}, set(), [start]
    while todo:
        path = todo.pop()
        if path in expanded:
            continue
        expanded.add(path)
        tree, bound = parse(path)
        parent = not (path.is_relative_to(home) or is_face(path) or everything)
        inherited = parents(tree, bound)
        for dep in inherited | (set() if parent and not parent_names else set(bound.values())):
            if counted(dep):
                read.add(dep)
        follow = set(bound.values()) if everything or is_face(path) else \
            {d for d in bound.values() if d.is_relative_to(home)} | inherited
        todo += [d for d in follow if counted(d) and d not in expanded and (everything or in_a_stage(d))]
    return sorted(read)


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def files_one_step_touches(folder: str) -> list[str]:
    """Repository files whose code runs in one step that prefills a request while two others decode (tiny model)."""
    import importlib

    from common.sampling import SamplingParams
    stage = importlib.import_module(f"stages.{folder}")
    llm = stage.LLM("tiny", dtype="bfloat16", max_num_seqs=4)
    step, calls, touched = type(llm.engine).step, [0], set()
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is step.__code__:
            calls[0] += 1
        if calls[0] == 3:  # the traced step
            name = frame.f_code.co_filename
            if name.startswith((str(ROOT / "common"), str(ROOT / "stages"))):
                touched.add(Path(name).relative_to(ROOT).as_posix())
        return tracer

    llm.generate([[5, 6, 7], [8, 9]], params)  # warm: one-time set-up (kernels, caches) is not the step
    seqs = [s for p in ([5, 6, 7], [8, 9], [10, 11, 12, 13]) for s in llm.make_samples(p, params)]
    for seq in seqs[:2]:
        llm.engine.add(seq)
    llm.engine.step(), llm.engine.step()
    llm.engine.add(seqs[2])  # the third request arrives: the traced step prefills it while the first two decode
    calls[0] = 2
    sys.settrace(tracer)
    try:
        llm.engine.step()
    finally:
        sys.settrace(None)
        llm.engine.release()
    return sorted(touched)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", action="store_true", help="also trace one engine step per stage (loads the tiny model)")
    ap.add_argument("--stage", action="append", help="only these stage folders (e.g. 06_speculative)")
    ap.add_argument("--files", action="store_true", help="list the files counted")
    args = ap.parse_args(argv)
    console = Console()
    table = Table(title="what a learner reads for one stage (the lesson; its support apart)")
    for col in ("stage", "files read", "lines read", "of them, parts named", "support, read apart",
                "lines reachable by imports", "files one step touches"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for folder in args.stage or STAGE_FOLDERS:
        read, reachable = read_set(folder), read_set(folder, everything=True)
        named, support = read_set(folder, parent_names=False), support_of(read_set(folder))
        apart = set().union(*support.values())
        parts = " + ".join(f"{root.split('/')[-2]} {sum(map(lines, fs)):,}" for root, fs in sorted(support.items()))
        touched = files_one_step_touches(folder) if args.steps else None
        beneath = [f for f in touched or [] if support_root(ROOT / f)]
        table.add_row(folder, str(len(read)), f"{sum(map(lines, read)):,}", f"{sum(map(lines, named)):,}",
                      f"{sum(map(lines, apart)):,} ({parts})" if apart else "-", f"{sum(map(lines, reachable)):,}",
                      f"{len(touched) - len(beneath)} (+{len(beneath)} support)" if touched else "-")
        if args.files:
            console.print(f"[bold]{folder}[/] reads: " + ", ".join(f"{p.relative_to(ROOT)} ({lines(p)})" for p in read))
            for root, files in sorted(support.items()):
                console.print(f"[bold]{folder}[/] reads apart, support {root}: "
                              + ", ".join(f"{p.relative_to(ROOT)} ({lines(p)})" for p in sorted(files)))
            if touched:
                console.print(f"[bold]{folder}[/] one step touches: " + ", ".join(touched))
    console.print(table)


if __name__ == "__main__":
    main()
