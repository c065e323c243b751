"""The house rules a newcomer relies on, checked: no import cycles between modules, e-nodes read by name (only
``egfuse/egraph/enodes.py`` knows argument positions), and a README that lists exactly the modules that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "egfuse"


def _module_name(path: Path) -> str:
    if path.parent.name == "rules" and path.parent.parent == ROOT:
        return "egfuse.rules" if path.stem == "__init__" else f"egfuse.rules.{path.stem}"
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "rules").glob("*.py")])


def _imports() -> dict[str, set[str]]:
    """Module → the egfuse modules it imports at load time (not inside functions, not for type checking)."""
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("egfuse"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("egfuse."))
        # The package itself is where the public API is re-exported: importing a submodule runs it first, which
        # is not a dependency of the submodule's own code.
        graph[name] = {d for d in deps if d in modules and d != name and d != "egfuse"}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_no_import_cycle():
    graph = _imports()
    assert "egfuse.lowering.lower" in graph["egfuse.search"]  # the graph is read (an empty one has no cycles either)
    cycles = _cycles(graph)
    assert not cycles, " ; ".join(" → ".join(c) for c in cycles)


def test_the_import_check_finds_a_cycle():
    graph = {**_imports(), "egfuse.writing.raise_": {*_imports()["egfuse.writing.raise_"], "egfuse.search"}}
    assert ["egfuse.writing.raise_", "egfuse.search", "egfuse.writing.raise_"] in _cycles(graph) or any(
        "egfuse.search" in c and "egfuse.writing.raise_" in c for c in _cycles(graph)
    )


def test_enodes_are_read_by_name_outside_the_decoding_module():
    positional = re.compile(r"\b(?:node|n|e_node|enode|chosen)\.(?:args|children)\[")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _sources()
        if p.name != "enodes.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if positional.search(line)
    ]
    assert not offenders, offenders


def test_readme_lists_exactly_the_modules_that_exist():
    """Every module has a row (a folder of data or test helpers, one row for the folder), and every folder a row
    saying what its modules are for: a newcomer finds a stage by its folder."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## How it works") : readme.index("## Results")]
    listed = set(re.findall(r"`(egfuse/[\w/]+\.py|egfuse/[\w/]*/?|rules/)`", section))
    whole = {"egfuse/targets/", "egfuse/testing/"}  # listed as a whole: one row says what each module holds
    folders = {f"{p.parent.relative_to(ROOT)}/" for p in PACKAGE.rglob("__init__.py")}
    files = {
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and not any(str(p.relative_to(ROOT)).startswith(f) for f in whole)
    }
    expected = files | folders | {"rules/"}
    assert listed == expected, {"not listed": sorted(expected - listed), "listed, not there": sorted(listed - expected)}
    targets = {p.stem for p in (PACKAGE / "targets").glob("*.py") if p.stem != "__init__"}
    assert all(f"`{t}.py`" in section for t in targets)
    families = {p.stem for p in (ROOT / "rules").glob("*.py") if p.stem != "__init__"}
    assert all(f"`{f}`" in section for f in families), families


def test_every_package_is_installed():
    """A folder of egfuse/ missing from pyproject's package list would be missing from a wheel (an editable
    install finds it anyway, so nothing else here would notice)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    missing, extra = sorted(folders - listed), sorted(listed - folders - {"egfuse.rules"})
    assert folders | {"egfuse.rules"} == listed, {"missing": missing, "extra": extra}
