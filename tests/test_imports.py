"""Every relative import in the package names something that exists, including the imports
inside functions that only GPU paths reach (CI has no GPU, so nothing else would run them)."""
import ast
import importlib
from pathlib import Path

import symmoe

PKG = Path(symmoe.__file__).parent


def _relative_imports():
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        package = ".".join(parts if path.name == "__init__.py" else parts[:-1])
        package = package.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield path, node.lineno, base + (f".{node.module}" if node.module else ""), [a.name for a in node.names]


def test_every_relative_import_in_the_package_resolves():
    missing = []
    for path, line, module, names in _relative_imports():
        mod = importlib.import_module(module)
        for name in names:
            if not hasattr(mod, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{path.relative_to(PKG.parent)}:{line}: {module}.{name}")
    assert not missing, "imports of names that do not exist:\n" + "\n".join(missing)
