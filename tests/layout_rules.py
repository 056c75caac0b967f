"""The layout rules tests/test_layout.py holds the tree to, each an `ast` walk over source text, so that each can be
shown failing on a planted violation before it is trusted on the tree.

* `part_assignments`: no assignment into another object's part (``llm.engine.scheduler.max_forced = 0``,
  ``self.cache.fused_attention = True``): a part is configured through its constructor, once.
* `mutable_class_defaults`: no class attribute holding a list, dict, set or a mutable object (``forced =
  ForcedTokens()``): every instance would share it.
* `stage_inheritance`: a class of a stage inherits from another stage's class at most once along its chain
  (stage 07's scheduler may not be stage 06's, which is stage 03's): a stage adds parts.
* `numbered_imports`: a stage's module is imported by its plain name (``stages.paged_kv.scheduler``), never by its
  folder's (``stages.03_paged_kv.scheduler``), which would load the file a second time as another module; and the
  modules run under the folder's name (its ``__init__``, its ``__main__``) import nothing relatively.
* `long_files`: no Python file over 230 lines.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

MAX_LINES = 230
# Names of engine parts: an assignment whose target reaches through one of them configures a part from outside.
PARTS = {"engine", "scheduler", "cache", "runner", "block_manager", "prefix_cache", "proposer", "proposers",
         "model", "loop", "buffer"}
IMMUTABLE_CALLS = {"field", "frozenset", "tuple", "MappingProxyType", "staticmethod", "classmethod", "property",
                   "TypeVar", "re.compile", "Field", "ConfigDict"}  # pydantic copies its defaults per model
NUMBERED = re.compile(r"^stages\.\d\d_\w+\.")


def chain(node: ast.expr) -> list[str]:
    """The names along an attribute chain: ``self.engine.scheduler`` -> ['self', 'engine', 'scheduler']."""
    names = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value if not isinstance(node, ast.Call) else node.func
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def part_assignments(source: str) -> list[str]:
    """``X.attr = value`` where X is not ``self`` and reaches through an engine part."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in (t for tt in targets for t in (tt.elts if isinstance(tt, ast.Tuple) else [tt])):
            if isinstance(target, ast.Attribute):
                owner = chain(target.value)
                if owner != ["self"] and PARTS & set(owner):
                    found.append(f"line {target.lineno}: {ast.unparse(target)} = ...")
    return found


def frozen_dataclasses(sources: list[str]) -> set[str]:
    """Names of the classes declared ``@dataclass(frozen=True)``: an instance is immutable."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and any("frozen=True" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def mutable_literals(source: str) -> set[str]:
    """Module-level names bound to a list, dict or set."""
    kinds = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
    return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign) and isinstance(node.value, kinds)
            for t in node.targets if isinstance(t, ast.Name)}


def mutable_class_defaults(source: str, frozen: set[str] = frozenset(),
                           mutable_names: set[str] = frozenset()) -> list[str]:
    """Class attributes that hold something mutable: a literal list, dict or set, an object made by a call (a
    frozen dataclass's and the ``IMMUTABLE_CALLS`` aside), or a name bound to such a literal."""
    found, kinds = [], (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if value is None:
                continue
            callee = ".".join(chain(value.func)) if isinstance(value, ast.Call) else ""
            if isinstance(value, kinds) or (callee and callee not in IMMUTABLE_CALLS and callee not in frozen) or \
                    (isinstance(value, ast.Name) and value.id in mutable_names):
                found.append(f"{cls.name}, line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def numbered_imports(source: str, runs_numbered: bool = False) -> list[str]:
    """Imports of a stage module by its folder's name (a string naming ``stages.NN_name.module``), and, in a module
    run under the folder's name (``runs_numbered``), relative imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NUMBERED.match(node.value):
            found.append(f"line {node.lineno}: {node.value!r}")
        if runs_numbered and isinstance(node, ast.ImportFrom) and node.level:
            found.append(f"line {node.lineno}: {ast.unparse(node)} (runs as the numbered package)")
    return found


def long_files(root: Path, folders: tuple[str, ...], waived: dict[str, str]) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for folder in folders for p in sorted((root / folder).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
            and str(p.relative_to(root)) not in waived]


def stage_inheritance(classes: dict[str, tuple[str, list[str]]]) -> list[str]:
    """``classes``: qualified class name -> (its stage folder or '', its bases' qualified names). A chain that
    enters another stage's class twice (07 -> 06 -> 03) is refused; once (06's scheduler -> 03's) is one level."""
    found = []

    def crossings(name: str, seen: frozenset = frozenset()) -> int:
        stage, bases = classes.get(name, ("", []))
        most = 0
        for base in bases:
            if base in classes and base not in seen:
                step = int(bool(stage) and bool(classes[base][0]) and classes[base][0] != stage)
                most = max(most, step + crossings(base, seen | {name}))
        return most

    for name, (stage, _) in classes.items():
        if stage and crossings(name) > 1:
            found.append(f"{name} inherits across stages {crossings(name)} times")
    return found
