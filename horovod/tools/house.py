"""Measures the shape of the package: import circles, layering, module and function sizes, documentation, env reads.

Run ``python -m horovod.tools.house`` for a report (exit 1 when a rule is broken); ``tests/test_house.py`` holds the
package to the same rules. Everything here reads source files with ``ast``; nothing is imported.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Set, Tuple

from horovod.tools import floors

__all__ = ["Module", "load_package", "import_cycles", "layer_violations", "long_modules", "long_functions",
           "documentation", "environ_readers", "report", "main"]

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
MIN_DOCUMENTED = 0.90
# The floors and what each may import: horovod/tools/floors.py.
# Modules allowed to read os.environ: the config module, and the launch/test helpers that build a child's
# environment (they copy it, they do not read settings from it).
ENVIRON_READERS = {"horovod.common.config"}


@dataclass
class Module:
    """One source file: its dotted name, its syntax tree and what it imports (``imports``: anywhere, function-local
    imports included; ``top_imports``: what importing the module itself runs)."""
    name: str
    path: Path
    tree: ast.Module
    lines: int
    imports: Set[str] = field(default_factory=set)
    top_imports: Set[str] = field(default_factory=set)


def _module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: Module, node: ast.ImportFrom, known: Set[str]) -> Iterable[str]:
    if node.level:
        base = module.name.split(".")
        is_package = module.path.name == "__init__.py"
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    for alias in node.names:
        candidate = f"{prefix}.{alias.name}"
        yield candidate if candidate in known else prefix


def _import_nodes(tree: ast.AST) -> Iterator[Tuple[ast.stmt, bool]]:
    """Every import statement of ``tree`` with whether it sits inside a function (runs only when that is called)."""
    stack = [(tree, False)]
    while stack:
        node, local = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, local
            stack.append((child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))))


def _with_parents(targets: Set[str], module: Module, known: Set[str]) -> Set[str]:
    """``targets`` and their packages: importing a.b.c runs a/__init__ and a/b/__init__ first."""
    found = set(targets)
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in known and parent != module.name and not module.name.startswith(parent + "."):
                found.add(parent)
    return found


def load_package(root: Path) -> Dict[str, Module]:
    """Parse every ``.py`` file under ``root`` (a package folder) into a ``Module`` with its in-package imports."""
    modules: Dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = _module_name(root, path)
        modules[name] = Module(name, path, ast.parse(text), text.count("\n") + 1)
    known = set(modules)
    top = root.name
    for module in modules.values():
        every, top_level = set(), set()
        for node, local in _import_nodes(module.tree):
            targets: Iterable[str] = ()
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                targets = _resolve(module, node, known)
            for target in targets:
                while target and target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target.split(".")[0] == top and target != module.name:
                    every.add(target)
                    if not local:
                        top_level.add(target)
        module.imports = _with_parents(every, module, known)
        module.top_imports = _with_parents(top_level, module, known)
    return modules


def import_cycles(modules: Dict[str, Module]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in modules[v].imports:
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
                cycles.append(sorted(component))

    for name in sorted(modules):
        if name not in index:
            visit(name)
    return cycles


def layer_violations(modules: Dict[str, Module]) -> List[Tuple[str, str]]:
    """(importer, imported) pairs the floors' table (:mod:`horovod.tools.floors`) does not allow and no named
    exception excuses: an import of a floor the importer may not reach, or at the top level of one it may reach
    only inside a function, or from or of a package with no floor."""
    bad = []
    for module in modules.values():
        for target in module.imports:
            inside = target not in module.top_imports
            if not floors.allowed(module.name, target, inside) and not floors.excused(module.name, target):
                bad.append((module.name, target))
    return sorted(bad)


def long_modules(modules: Dict[str, Module], limit: int = MAX_MODULE_LINES) -> List[Tuple[str, int]]:
    """Modules with more than ``limit`` lines."""
    return sorted((m.name, m.lines) for m in modules.values() if m.lines > limit)


def long_functions(modules: Dict[str, Module], limit: int = MAX_FUNCTION_LINES) -> List[Tuple[str, int]]:
    """Functions (methods and nested functions included) longer than ``limit`` lines, docstring included."""
    found = []
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append((f"{module.name}:{node.lineno}:{node.name}", length))
    return sorted(found)


def _public_api(module: Module) -> Iterable[Tuple[str, ast.AST]]:
    if any(part.startswith("_") for part in module.name.split(".")[1:]):
        return
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield f"{module.name}.{node.name}", node
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                            not member.name.startswith("_"):
                        yield f"{module.name}.{node.name}.{member.name}", member


def documentation(modules: Dict[str, Module]) -> Tuple[int, int, List[str]]:
    """(documented, public, undocumented names) over public functions, classes and methods of public modules."""
    total, undocumented = 0, []
    for module in modules.values():
        if ".testing" in module.name or ".tools" in module.name:
            continue
        for name, node in _public_api(module):
            total += 1
            if not ast.get_docstring(node):
                undocumented.append(name)
    return total - len(undocumented), total, sorted(undocumented)


def environ_readers(modules: Dict[str, Module]) -> List[str]:
    """Modules other than the config module that mention ``os.environ`` or ``os.getenv``."""
    found = []
    for module in modules.values():
        if module.name in ENVIRON_READERS:
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{module.name}:{node.lineno}")
                break
    return sorted(found)


def report(root: Path) -> Tuple[bool, str]:
    """The whole check as (all rules hold, text)."""
    modules = load_package(root)
    lines, ok = [], True
    checks = [
        ("import circles", import_cycles(modules)),
        ("imports the floors do not allow", layer_violations(modules)),
        (f"modules over {MAX_MODULE_LINES} lines", long_modules(modules)),
        (f"functions over {MAX_FUNCTION_LINES} lines", long_functions(modules)),
        ("os.environ outside the config module", environ_readers(modules)),
    ]
    for title, found in checks:
        ok &= not found
        lines.append(f"{title}: {len(found)}")
        lines.extend(f"  {item}" for item in found)
    documented, total, missing = documentation(modules)
    share = documented / total if total else 1.0
    ok &= share >= MIN_DOCUMENTED
    lines.append(f"documented public functions and classes: {documented}/{total} ({share:.0%})")
    lines.extend(f"  undocumented: {name}" for name in missing)
    return ok, "\n".join(lines)


def main(argv: List[str] = None) -> int:
    """Print the report for the package given (default: the installed ``horovod``); exit 1 if a rule is broken."""
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    ok, text = report(root)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
