"""What a module names, read from its source (``ast``): the import reader behind stages/bench/reading.py.

Each name an import binds is followed to the repository module that defines it: a name taken from a package's
``__init__`` or a stage's door (``stages/paged_kv.py``), which only hand names on, to the module it comes from; an
import through a door (``from stages import paged_kv``) to the numbered stage folder it maps to; a string given to
``import_module`` too. So the counts see every import a learner follows, and no registry hides one.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
