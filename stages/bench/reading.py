"""python -m stages.bench.reading [--steps]: what a learner reads to understand one stage, and what one step runs.

Two counts per stage, both measured from the code as it stands (no figure here is typed in):

* **lines read**: what the issue calls "its folder plus the core modules and parent parts it names". Start at
  the stage's ``engine.py``; read every module of the stage's folder it reaches, every module those name (import,
  module-level or inside a function), and, read the same way, each part of another stage that one of their
  classes inherits from (a learner reads a parent to know what its child does). A core module (``common/``) is
  read where it is named, not followed further. Left out: the numerics the core rests on (``common/numerics/``),
  the model loader every stage stands on (``common/loader.py``, ``prepare.py``, ``paths.py``,
  ``gguf_convert.py``, ``config.py``, ``tokenizer.py``) and the commands (``__main__.py``). An import through
  the old ``stages`` registry (``from stages import paged_kv``) names the stage package it maps to, whose
  ``__init__`` is read through (it only hands names on). "Of them, parts named" reads a parent part without what
  it names in turn (its own parents still): the stage's folder, the core modules and parent parts it names.
* **files one step touches** (``--steps``, loads the tiny model): the repository's Python files whose code runs
  during one ``engine.step()`` of the tiny model, a step that prefills one request while two others decode, traced
  with ``sys.settrace``: the core and the stages' files, and apart from them the numerics (``common/numerics/``).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
STAGE_FOLDERS = sorted(p.name for p in (ROOT / "stages").iterdir() if p.is_dir() and p.name[:2].isdigit())
GROUND = {"common/loader.py", "common/prepare.py", "common/paths.py", "common/gguf_convert.py", "common/config.py",
          "common/tokenizer.py"}
REGISTRY = {"static_batch": "01_static_batch", "continuous_batch": "02_continuous_batch", "paged_kv": "03_paged_kv",
            "kernels": "04_kernels", "streaming": "05_streaming", "speculative": "06_speculative",
            "structured": "07_structured"}


def module_file(dotted: str) -> Path | None:
    """The file of a dotted module name: its own file, else, for ``stages.<name>.x``, the stage folder's."""
    parts = dotted.split(".")
    for mapped in (parts, ["stages", REGISTRY[parts[1]], *parts[2:]] if parts[1:2] and parts[1] in REGISTRY
                   and parts[0] == "stages" else None):
        if mapped:
            base = ROOT.joinpath(*mapped)
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def is_face(path: Path) -> bool:
    """A module that only hands names on: a package's __init__, or a stage's door (stages/paged_kv.py)."""
    return path.name == "__init__.py" or (path.parent == ROOT / "stages" and path.stem in REGISTRY)


def through(path: Path, name: str, depth: int = 0) -> Path:
    """Where ``name``, imported from ``path``, is defined: a face's name is followed to the module it comes from."""
    if depth > 5 or not is_face(path):
        return path
    target = parse(path)[1].get(name)
    return through(target, name, depth + 1) if target is not None and target != path else path


def parse(path: Path) -> tuple[ast.Module, dict[str, Path]]:
    """The module's tree, and each name an import binds in it -> the repository module it stands for (a name taken
    from a face, the module that defines it)."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    tree, bound = ast.parse(path.read_text(encoding="utf-8")), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = module_file(a.name)
                if target is not None:
                    bound[a.asname or a.name.split(".")[0]] = target if a.asname else module_file(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            for a in node.names:
                target = module_file(f"{base}.{a.name}")
                if target is None and (target := module_file(base)) is not None and target != path:
                    target = through(target, a.name)
                if target is not None:
                    bound[a.asname or a.name] = target
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            target = module_file(node.args[0].value)
            if target is not None:
                bound[f"<import_module {node.args[0].value}>"] = target
    bound = {k: v for k, v in bound.items() if v is not None and v != path}
    return tree, bound


def parents(tree: ast.Module, bound: dict[str, Path]) -> set[Path]:
    """The modules the classes of a module inherit from (``class A(paged.Scheduler)``: the module defining
    paged's Scheduler): a learner reads a parent to know what its child does."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                names = []
                while isinstance(base, (ast.Attribute, ast.Call, ast.Subscript)):
                    names.append(base.attr) if isinstance(base, ast.Attribute) else None
                    base = base.value if not isinstance(base, ast.Call) else base.func
                if isinstance(base, ast.Name) and base.id in bound:
                    module = bound[base.id]
                    for name in names[::-1]:  # paged.Scheduler, streaming.engine.LLMEngine, previous.LLM.x
                        if (found_in := through(module, name)) != module:
                            module = found_in
                            break
                    found.add(module)
    return found


def counted(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    if rel in GROUND or rel.startswith("common/numerics/") or rel.endswith("__main__.py"):
        return False
    door = path.parent == ROOT / "stages" and path.stem in REGISTRY
    return door or rel.startswith("common/") or any(rel.startswith(f"stages/{folder}/") for folder in STAGE_FOLDERS)


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
    table = Table(title="what a learner reads for one stage")
    for col in ("stage", "files read", "lines read", "of them, parts named", "lines reachable by imports",
                "files one step touches"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for folder in args.stage or STAGE_FOLDERS:
        read, reachable = read_set(folder), read_set(folder, everything=True)
        named = read_set(folder, parent_names=False)
        touched = files_one_step_touches(folder) if args.steps else None
        numerics = [f for f in touched or [] if f.startswith("common/numerics/")]
        table.add_row(folder, str(len(read)), f"{sum(map(lines, read)):,}", f"{sum(map(lines, named)):,}",
                      f"{sum(map(lines, reachable)):,}",
                      f"{len(touched) - len(numerics)} (+{len(numerics)} numerics)" if touched else "-")
        if args.files:
            console.print(f"[bold]{folder}[/] reads: " + ", ".join(f"{p.relative_to(ROOT)} ({lines(p)})" for p in read))
            if touched:
                console.print(f"[bold]{folder}[/] one step touches: " + ", ".join(touched))
    console.print(table)


if __name__ == "__main__":
    main()
