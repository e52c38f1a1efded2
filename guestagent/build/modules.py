"""Which Python modules a program can import, read from the sources: the import closure.

It decides what of the agent and of the stdlib ships to a guest. Every import statement
counts, function-level and conditional ones too (a lazy import is still a dependency), so
the closure errs on the side of shipping a module the agent might never load. Extension
modules are followed by name only: what they import from C is the interpreter's own
start-up set or already imported by their Python package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Module:
    name: str
    path: Path  # The .py, the package's __init__.py, the extension's .so, or a namespace dir.
    is_package: bool

    @property
    def is_source(self) -> bool:
        return self.path.suffix == ".py"


def find_module(
    name: str, search: Iterable[Path], extension_suffixes: Iterable[str]
) -> Module | None:
    """Where `import name` would find the module, first match wins (as sys.path)."""
    parts = name.split(".")
    suffixes = tuple(extension_suffixes)
    namespace: Module | None = None
    for entry in search:
        base = entry.joinpath(*parts)
        if (base / "__init__.py").is_file():
            return Module(name, base / "__init__.py", True)
        source = base.parent / f"{parts[-1]}.py"
        if source.is_file():
            return Module(name, source, False)
        for suffix in suffixes:
            candidate = base.parent / f"{parts[-1]}{suffix}"
            if candidate.is_file():
                return Module(name, candidate, False)
        if namespace is None and base.is_dir():
            namespace = Module(name, base, True)
    return namespace


def is_main_block(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and any(
            isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators
        )
    )


def imports_in(source: str, module: Module) -> set[str]:
    """Every module name an import statement in source may load, absolute."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(source, str(module.path))
    # A module's `if __name__ == "__main__":` block runs only as a script, never on import.
    tree.body = [node for node in tree.body if not is_main_block(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            if not base:
                continue
            found.add(base)
            # `from package import name` loads package.name when that is a module.
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def closure(
    roots: Iterable[str],
    search: list[Path],
    extension_suffixes: Iterable[str],
    builtins: frozenset[str],
    never: frozenset[str] = frozenset(),
) -> tuple[dict[str, Module], set[str]]:
    """The modules roots import, directly or not, and the names found nowhere (optional
    imports of other platforms, `from x import function`...). Modules in never, and what
    only they import, are left out."""
    suffixes = tuple(extension_suffixes)
    found: dict[str, Module] = {}
    missing: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if (
            name in found
            or name in missing
            or name.split(".")[0] in builtins
            or any(name == n or name.startswith(n + ".") for n in never)
        ):
            continue
        # Importing a.b.c imports a and a.b first.
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        pending.extend(p for p in parents if p not in found)
        module = find_module(name, search, suffixes)
        if module is None:
            missing.add(name)
            continue
        found[name] = module
        if module.is_source:
            pending.extend(imports_in(module.path.read_text(encoding="utf-8"), module))
    return found, missing
