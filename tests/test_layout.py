"""The layout the tools can see: the import graph of common/ and stages/ has no cycle, common/ never reaches up
into a stage, common/ holds no instrument and no stage reaches one, every command the READMEs and docs/ name
exists (its --help runs)."""
import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import stages

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "stages")
DOORS = {f"stages.{name}": package for name, package in stages.STAGES.items()}  # stages/paged_kv.py -> its folder


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return numbered(".".join(parts[:-1] if parts[-1] == "__init__" else parts))


def numbered(name: str) -> str:
    """A stage module's name in its folder: ``stages.paged_kv.scheduler`` -> ``stages.03_paged_kv.scheduler`` (the
    door stages/paged_kv.py stands for the folder's package)."""
    door = next((d for d in DOORS if name == d or name.startswith(d + ".")), None)
    return name if door is None else DOORS[door] + name[len(door):]


def modules() -> dict[str, list[Path]]:
    """Module name -> its files (a stage package: its __init__ and its door)."""
    found: dict[str, list[Path]] = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            found.setdefault(module_name(p), []).append(p)
    return found


def type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:`` (never executed)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for child in node.body for n in ast.walk(child) if hasattr(n, "lineno")}
    return lines


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``name`` imports, lazy (inside functions) ones included: ``from P import x`` counts as an import
    of ``P.x`` where that is a module, ``stages.paged_kv...`` as the stage folder's module it names (through the
    door), and ``importlib.import_module("...")`` with a literal name as an import of that module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {numbered(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                full = numbered(f"{base}.{alias.name}")
                found.add(full if full in known else numbered(base))
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(numbered(node.args[0].value))
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: set().union(*(imports_of(name, p, set(mods)) for p in paths)) for name, paths in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_imports_that_make_a_cycle():
    """The oracle first: a graph with the old paths -> prepare -> ... -> paths loop is reported, one without is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    graph = import_graph()
    assert "stages.03_paged_kv" in graph["stages.06_speculative.scheduler"]  # stage 03 through its door
    assert "stages.03_paged_kv.scheduler" in graph["stages.03_paged_kv"]  # which hands its parts on
    assert "stages.05_streaming" in graph["stages.06_speculative.engine"]
    assert "common.prepare" in graph["common.engine_config"]
    assert "common.numerics.native" in graph["common.numerics.invariant"]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_common_never_imports_a_stage():
    reaching_up = {name: sorted(m for m in deps if m.split(".")[0] == "stages")
                   for name, deps in import_graph().items() if name.split(".")[0] == "common"}
    assert {name: deps for name, deps in reaching_up.items() if deps} == {}


# The measuring instruments, by module name: they live in stages/bench/, never in the core.
INSTRUMENTS = {"roofline", "quality", "demo", "reference_demo", "ladder", "peers", "baselines", "edge", "invariance",
               "fusion_report", "gpu_check", "compile_check", "load", "load_args", "load_metrics", "aiperf",
               "proc_cpu", "report", "workloads"}


def test_common_holds_no_instrument():
    """common/ is the core and its numerics: no tools folder, no module named as an instrument, and nothing in it
    imports from stages.bench (the check above already keeps it from importing any stage)."""
    assert not (ROOT / "common" / "tools").exists()
    named = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "common").rglob("*.py") if p.stem in INSTRUMENTS)
    assert named == []
    assert (ROOT / "stages" / "bench" / "roofline.py").exists()  # the oracle: the list names real instruments


def test_no_stage_reaches_an_instrument():
    """The instruments measure the stages, never the other way round: no module of a stage's folder (its engine, its
    own measurement, its command line) imports from stages.bench, directly or through what it imports."""
    graph = import_graph()
    folders = tuple(f"{package}." for package in stages.STAGES.values())
    for name in graph:
        if name in stages.STAGES.values() or name.startswith(folders):
            seen, todo = set(), [name]
            while todo:
                for dep in graph[todo.pop()] - seen:
                    seen.add(dep)
                    todo.append(dep)
            assert sorted(m for m in seen if m.startswith("stages.bench")) == [], name
    assert "stages.bench.ladder" in graph["stages.__main__"]  # the oracle: the graph sees an import of bench
    assert "stages.03_paged_kv.capacity" in graph["stages.bench.roofline"]  # and bench reading a stage


def test_the_core_reaches_the_numerics_through_one_door():
    """common/model.py and kv_cache.py (the core a learner reads) import from common.numerics itself, never from a
    module inside it: the package's __init__ is the one marked door."""
    for core in ("model", "kv_cache"):
        tree = ast.parse((ROOT / "common" / f"{core}.py").read_text(encoding="utf-8"))
        sources = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        sources |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert "common.numerics" in sources, core
        assert sorted(s for s in sources if s.startswith("common.numerics.")) == [], core


def test_every_stage_has_a_python_name():
    """Each stage folder is the package path of its door, and its numbered name is the same module."""
    import importlib
    for name, module in stages.STAGES.items():
        door = importlib.import_module(f"stages.{name}")
        assert door.__path__ == [str(ROOT / "stages" / module.removeprefix("stages."))]
        assert importlib.import_module(module) is door
    with pytest.raises(AttributeError):
        stages.no_such_stage  # noqa: B018


# ---- every command the READMEs name exists ---------------------------------------------------------------------------
COMMAND = re.compile(r"python -m ((?:stages|common)[\w.]*)((?: [a-z][\w-]*)?)")


def documented_commands() -> set[tuple[str, str]]:
    """(module, subcommand or '') for every `python -m ...` in README.md, each stage's README and docs/."""
    texts = [ROOT / "README.md", *ROOT.glob("stages/*/README.md"), *ROOT.glob("docs/*.md")]
    found = set()
    for path in texts:
        for module, sub in COMMAND.findall(path.read_text(encoding="utf-8")):
            found.add((module.rstrip("."), sub.strip()))
    return found


def test_the_readmes_name_commands():
    commands = documented_commands()
    assert ("stages", "") in commands
    assert {m for m, _ in commands} >= {"stages.01_static_batch", "stages.02_continuous_batch", "stages.03_paged_kv",
                                        "stages.04_kernels", "stages.05_streaming"}


@pytest.mark.parametrize("module,sub", sorted(documented_commands()))
def test_a_documented_command_answers_help(module, sub):
    args = [sys.executable, "-m", module, *shlex.split(sub), "--help"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user runs it (conftest sets it)
    run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, f"{' '.join(args[1:])}: {run.stderr[-1500:]}"
    assert "usage" in run.stdout.lower()
