"""The house's shape, read from the code's own imports: no import cycle, and the arrows point down
(the trial's code never reaches into the orchestrator, the data modules never into the config, the
formulas into no framework). Every import counts, lazy and type-only ones too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("trainables", "orchestrator", "bench")
PURE = (
    "trainables.algo.losses",
    "trainables.algo.advantages",
    "trainables.algo.logprobs",
    "trainables.rewards.oger",
    "trainables.rollout.ead",
    "trainables.algo.hybrid",
    "trainables.step_metrics",
    "trainables.metrics",
    "orchestrator.stats",
)
FRAMEWORKS = ("ray", "deepspeed", "vllm", "mlflow", "optuna")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(module: str) -> set[str]:
    """Every module `module` imports (project modules by their full name, others by their top name)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES}
    return {name if name in MODULES else name.split(".")[0] for name in found} - {module}


GRAPH = {module: {m for m in imports(module) if m in MODULES} for module in MODULES}


def cycle() -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(GRAPH[module]):
            if state.get(other) == 1:
                return path[path.index(other) :] + [other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[module] = 2
        return None

    return next((found for module in sorted(GRAPH) if module not in state and (found := visit(module))), None)


def test_the_project_has_modules_and_no_import_cycle():
    assert len(MODULES) > 60 and "trainables.trial" in MODULES
    assert cycle() is None, " -> ".join(cycle())


@pytest.mark.parametrize(
    "lower, upper",
    [
        ("trainables", "orchestrator"),  # a trial's code runs inside Ray Train workers
        ("trainables", "bench"),
        ("trainables.data", "trainables.config"),  # data functions take plain arguments
        ("trainables.data", "trainables.tasks"),
        ("trainables.rewards", "trainables.config"),
        ("trainables.rollout", "trainables.config"),
        ("trainables.rollout", "trainables.trial"),
        ("trainables.algo", "trainables.runtime"),  # the algorithm knows nothing of how a trial runs
        ("trainables.algo", "trainables.trial"),
        ("trainables.algo", "trainables.learner"),
        ("trainables.runtime", "trainables.algo"),  # the machinery knows nothing of the algorithm
        ("trainables.runtime", "trainables.config"),
        ("trainables.runtime", "trainables.trial"),
    ],
)
def test_arrows_point_down(lower, upper):
    up = {(m, i) for m in MODULES if m.startswith(lower) for i in GRAPH[m] if i.startswith(upper)}
    assert not up, up


@pytest.mark.parametrize("module", PURE)
def test_formulas_import_no_framework(module):
    assert not imports(module) & set(FRAMEWORKS), imports(module) & set(FRAMEWORKS)


def test_the_map_names_every_module():
    """docs/architecture.md (`How it fits together`: the pictures and the rooms) names each module of the
    trial and the orchestrator by its file name, so a newcomer finds every file on the map."""
    house = (ROOT / "docs" / "architecture.md").read_text()
    files = {
        p.name
        for package in ("trainables", "orchestrator")
        for p in (ROOT / package).rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }
    missing = sorted(f for f in files if not re.search(rf"(?<![\w.]){re.escape(f)}(?!\w)", house))
    assert not missing, f"name these modules in docs/architecture.md's map of the rooms: {missing}"


def test_the_readme_is_a_front_door():
    """README.md says what the product is and how to start; the rest lives in docs/ and is linked from it."""
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 15_000, f"README.md is {len(readme)} bytes (at most 15,000): move detail into docs/"
    lines = readme.decode().count("\n")
    assert lines <= 300, f"README.md is {lines} lines (at most 300): move detail into docs/"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a `#` in a code block is no heading
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_every_relative_link_points_to_a_file(page):
    """Links in README.md and docs/*.md reach an existing file (and heading, where they name one)."""
    source = ROOT / page if page == "README.md" else ROOT / "docs" / page
    text = re.sub(r"```.*?```", "", source.read_text(), flags=re.S)
    broken = []
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(link)
    assert not broken, f"{page}: links to no file or heading: {broken}"


SOURCES = {**MODULES, **{module_name(p): p for p in (ROOT / "infra").rglob("*.py")}}
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 60, 300


def definitions(kind: type, limit: int) -> list[str]:
    """Every function (or class) of the product's code longer than `limit` lines, decorators and
    docstring included, as `module:line name (lines)`."""
    long = []
    for module, path in sorted(SOURCES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind) and (size := node.end_lineno - node.lineno + 1) > limit:
                long.append(f"{module}:{node.lineno} {node.name} ({size})")
    return long


def test_no_function_over_60_lines_and_no_class_over_300():
    assert len(definitions(ast.ClassDef, 100)) > 3  # the walk reads the code: some classes pass 100 lines
    assert definitions((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES) == []
    assert definitions(ast.ClassDef, MAX_CLASS_LINES) == []


def test_no_two_modules_share_a_file_name_across_packages():
    """A name means one thing: `decisions.py` is the sweep's decisions, never also a bench's."""
    names: dict[str, list[str]] = {}
    for module in SOURCES:
        if not module.endswith(("__init__", "__main__")) and "." in module:
            names.setdefault(module.rsplit(".", 1)[1], []).append(module)
    assert len(names) > 50  # the walk found the product's modules
    assert {name: found for name, found in names.items() if len(found) > 1} == {}
