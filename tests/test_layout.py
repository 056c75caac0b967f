"""The layout the tools can see: the import graph of common/ and stages/ has no cycle, common/ never reaches up
into a stage, common/ holds no instrument and no stage reaches one, every command the READMEs and docs/ name
exists (its --help runs); and the rules of tests/layout_rules.py (parts configured through their constructors,
no mutable class attributes, one level of inheritance across stages, stage modules imported by their plain names,
no file over 230 lines), each shown failing on a planted violation first."""
import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import layout_rules as rules
import stages
from workloads import profile

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


# ---- the rules of tests/layout_rules.py ------------------------------------------------------------------------------
# The graders and the instruments reach into an engine from outside on purpose (a fault injected, a step counted).
TOOLS = ("stages/lab/", "stages/bench/")


def sources(tools: bool = False) -> dict[str, str]:
    """Repository path -> text, for every Python file of common/ and stages/ (with ``tools``: the labs' graders and
    the instruments too)."""
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for pkg in PACKAGES
            for p in sorted((ROOT / pkg).rglob("*.py")) if tools or not str(p.relative_to(ROOT)).startswith(TOOLS)}


def test_no_part_is_configured_from_outside():
    planted = "def run(llm):\n    llm.engine.scheduler.max_forced = 0\n\nclass A:\n    def __init__(self, cache):\n" \
              "        self.cache = cache\n        self.cache.fused_attention = True\n"
    assert len(rules.part_assignments(planted)) == 2  # the oracle: both assignments are seen
    assert rules.part_assignments("def f(seq, self):\n    seq.status = 1\n    self.cache = 2\n") == []
    found = {path: v for path, text in sources().items() if (v := rules.part_assignments(text))}
    assert found == {}


def test_no_class_attribute_is_mutable():
    planted = "class Scheduler:\n    forced = ForcedTokens()\n    oracle: dict = {}\n    k = 16\n" \
              "    defaults = STAGE_DEFAULT\n"
    assert len(rules.mutable_class_defaults(planted, mutable_names={"STAGE_DEFAULT"})) == 3
    texts = sources()
    frozen = rules.frozen_dataclasses(list(texts.values()))
    mutable = set().union(*(rules.mutable_literals(t) for t in texts.values()))
    assert "StructuredOutputsConfig" in frozen and "STAGE_DEFAULT" in mutable  # the oracle knows the tree's names
    found = {path: v for path, text in texts.items() if (v := rules.mutable_class_defaults(text, frozen, mutable))}
    assert found == {}


def class_table() -> dict[str, tuple[str, list[str]]]:
    """module:Class -> (its stage folder, or '' outside the stages; its bases as module:Class), bases resolved
    through the module's imports and the modules that hand a name on."""
    mods, trees = modules(), {}
    for name, paths in mods.items():
        trees[name] = [ast.parse(p.read_text(encoding="utf-8")) for p in paths]

    def bound(module: str) -> dict[str, str]:  # local name -> module or module:Class it stands for
        out, package = {}, module
        for tree, path in zip(trees.get(module, []), mods.get(module, [])):
            package = module if path.name == "__init__.py" or path.stem in stages.STAGES else module.rpartition(".")[0]
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] +
                                        ([node.module] if node.module else []))
                    for a in node.names:
                        full = numbered(f"{base}.{a.name}")
                        out[a.asname or a.name] = full if full in mods else f"{numbered(base)}:{a.name}"
                elif isinstance(node, ast.Import):
                    out.update({a.asname or a.name: numbered(a.name) for a in node.names})
        return out

    def resolve(target: str, depth: int = 0) -> str | None:
        module, _, cls = target.partition(":")
        if depth > 8 or module not in trees:
            return None
        if any(isinstance(n, ast.ClassDef) and n.name == cls for t in trees[module] for n in t.body):
            return target
        via = bound(module).get(cls)
        return resolve(via, depth + 1) if via and ":" in via else None

    table = {}
    for module, ts in trees.items():
        stage = next((f for f in stages.STAGES.values() if module == f or module.startswith(f + ".")), "")
        names = bound(module)
        for node in (n for t in ts for n in t.body if isinstance(n, ast.ClassDef)):
            bases = []
            for base in node.bases:
                parts = rules.chain(base)
                head = names.get(parts[0], f"{module}:{parts[0]}") if parts else None
                for part in parts[1:]:
                    head = f"{head}.{part}" if head and ":" not in head and f"{head}.{part}" in trees else \
                        (f"{head}:{part}" if head and ":" not in head else None)
                found = resolve(head) if head and ":" in head else None
                bases += [found] if found else []
            table[f"{module}:{node.name}"] = (stage, bases)
    return table


def test_a_stage_inherits_from_another_stage_once_at_most():
    planted = {"a:Scheduler": ("stages.03", []), "b:Scheduler": ("stages.06", ["a:Scheduler"]),
               "c:Scheduler": ("stages.07", ["b:Scheduler"]), "c:Helper": ("stages.07", ["c:Scheduler"])}
    assert sorted(rules.stage_inheritance(planted)) == ["c:Helper inherits across stages 2 times",
                                                        "c:Scheduler inherits across stages 2 times"]
    table = class_table()
    assert table["stages.06_speculative.scheduler:SpeculativeScheduler"][1] == \
        ["stages.03_paged_kv.scheduler:Scheduler"]  # the oracle: the tree's one level is seen
    assert rules.stage_inheritance(table) == []


def test_a_stage_module_is_imported_by_its_plain_name():
    assert rules.numbered_imports('m = importlib.import_module("stages.03_paged_kv.scheduler")\n') != []
    assert rules.numbered_imports("from .engine import LLM\n", runs_numbered=True) != []
    assert rules.numbered_imports('m = importlib.import_module("stages.03_paged_kv")\n') == []  # the package: one
    texts = sources(tools=True) | {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
                                   for p in (ROOT / "tests").glob("*.py")}
    runs_numbered = {f"stages/{m.removeprefix('stages.')}/{f}" for m in stages.STAGES.values()
                     for f in ("__init__.py", "__main__.py")}
    found = {path: v for path, text in texts.items() if path not in ("tests/test_layout.py", "tests/layout_rules.py")
             and (v := rules.numbered_imports(text, path in runs_numbered))}
    assert found == {}
    # And at run time: every stage and its command line loaded, no module of a stage folder under its number.
    loaded = subprocess.run([sys.executable, "-c", "import importlib, sys, stages\n"
                             "for m in stages.STAGES.values(): importlib.import_module(m)\n"
                             "import stages.cli, stages.lab.checks\n"
                             "print(sorted(n for n in sys.modules if n.startswith(tuple(m + '.' for m in "
                             "stages.STAGES.values()))))"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr[-800:] or loaded.stdout


WAIVED: dict[str, str] = {}  # a file allowed past the limit for now, with why (none: issue 56 split protocol.py)


def test_no_python_file_is_over_230_lines(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 231)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 230)
    assert rules.long_files(tmp_path, ("pkg",), {}) == ["pkg/long.py: 231 lines"]
    assert rules.long_files(ROOT, PACKAGES, WAIVED) == []


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


# Quick (`make test`) asks every command for its --help in ONE fresh process, each run as `python -m` runs it
# (runpy, as __main__, with its own argv, stages/ imported afresh), one after another: the 39 torch imports of a
# process each were most of this file's minute. Deep (`make test-deep`, CI) still starts a fresh process per
# command, as a user does.
HELP_ALL = """
import contextlib, io, json, runpy, shlex, sys, traceback, warnings
warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)  # runpy, a 2nd run
answers = {}
for module, sub in json.loads(sys.argv[1]):
    for name in [n for n in sys.modules if n == "stages" or n.startswith("stages.")]:
        del sys.modules[name]  # each command imports the stages afresh (a stage door aliases its numbered folder)
    sys.argv = [module, *shlex.split(sub), "--help"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        code, err = 1, io.StringIO(err.getvalue() + traceback.format_exc())
    answers[f"{module} {sub}"] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(answers))
"""


def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user runs it (conftest sets it)


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    """Quick: every documented command's (exit status, stdout, stderr) for --help, from one process."""
    commands = sorted(documented_commands())
    run = subprocess.run([sys.executable, "-c", HELP_ALL, json.dumps(commands)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120 + 10 * len(commands), env=user_env())
    assert run.returncode == 0, run.stderr[-1500:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module,sub", sorted(documented_commands()))
def test_a_documented_command_answers_help(module, sub, request):
    if profile() == "quick":
        code, stdout, stderr = request.getfixturevalue("helps")[f"{module} {sub}"]
    else:
        args = [sys.executable, "-m", module, *shlex.split(sub), "--help"]
        run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env())
        code, stdout, stderr = run.returncode, run.stdout, run.stderr
    assert code == 0, f"{module} {sub} --help: {stderr[-1500:]}"
    assert "usage" in stdout.lower()
