"""docs/architecture.md's module list is the current truth: every module and
package of pipesearch has an entry, and each entry's arrow list (``-> a,
b``) names every module of pipesearch it imports at run time (those under
``if TYPE_CHECKING:`` are annotations only), but the basics most modules
import (:data:`BASICS`). A module moved, split or given a new import without
its entry fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipesearch"
#: imported by most modules, left out of the arrows (the doc says so)
BASICS = {"errors", "types", "units", "limits", "input_files", "output"}


def _entries() -> dict[str, str]:
    """``{name: text}`` of the module list: an entry starts at a line's
    first column (``name/`` for a package) and runs to the next."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Modules"):doc.index("## Data flow")]
    block = section.split("```")[1]
    entries: dict[str, str] = {}
    name = None
    for line in block.splitlines():
        found = re.match(r"([a-z_]+)/?\s", line)
        if found and not line.startswith(" "):
            name = found.group(1)
            entries[name] = ""
        if name is not None:
            entries[name] += " " + line
    return entries


def _runtime_imports(files: list[Path], package: str | None) -> set[str]:
    """The top-level modules of pipesearch that ``files`` import outside
    ``if TYPE_CHECKING:`` blocks (for a package's files, those outside it)."""
    out: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or id(node) in typing_only or node.level == 0:
                continue
            if package is not None and node.level == 1:  # a module of the same package
                continue
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            out.update(n for n in names if not n.startswith("__"))  # (the package's own __version__)
    return out


def _modules() -> dict[str, set[str]]:
    """Every module and package of pipesearch and the pipesearch modules it imports."""
    out = {}
    for path in sorted(PACKAGE.iterdir()):
        if path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
            out[path.stem] = _runtime_imports([path], None) - {path.stem}
        elif path.is_dir() and (path / "__init__.py").exists():
            out[path.name] = _runtime_imports(sorted(path.rglob("*.py")), path.name) - {path.name}
    return out


def test_every_module_has_an_entry():
    entries = _entries()
    assert sorted(set(_modules()) - set(entries)) == []


def test_every_entry_names_the_modules_it_imports():
    entries = _entries()
    missing = {}
    for name, imports in _modules().items():
        text = entries.get(name, "")
        listed = set(re.findall(r"[a-z_]+", text.split("->", 1)[1])) if "->" in text else set()
        if imports - BASICS - listed:
            missing[name] = sorted(imports - BASICS - listed)
    assert missing == {}


def test_no_entry_for_a_module_that_is_gone():
    assert sorted(set(_entries()) - set(_modules())) == []
