"""The shape of the code itself: no module of opsynth's reaches back to itself through its
imports (a lazy import inside a function counts too), so each room can be read, tested and
moved on its own. `harness -> worker -> trace_batch -> harness` and `jail <-> redaction` were
the two circles; the grammar imports nothing of the sandbox. The rooms stand on floors: what a
task computes (filters/computation/) imports no other room of filters/, the checks
(filters/checks/) import of the jail (filters/sandbox/) only its count of GPU memory, and the
checks' verdicts import nothing that runs a task."""
import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("filters", "operators", "outputs", "pipeline")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules of opsynth's, wherever in it they are."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        # a module importing its own package's __init__ is no circle of modules
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))
    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def test_no_import_circles():
    assert _circles(_imports(_modules())) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_grammar_imports_nothing_of_the_sandbox():
    graph = _imports(_modules())
    grammar = [name for name in graph if name.startswith("filters.grammar")]
    assert grammar and not {target for name in grammar for target in graph[name] if target.startswith("filters.sandbox")}


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module of opsynth's that `start` imports, directly or through others."""
    seen, frontier = set(), [start]
    while frontier:
        for target in graph[frontier.pop()]:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    return seen


def test_what_a_task_computes_reaches_into_no_other_room():
    graph = _imports(_modules())
    computation = [name for name in graph if name.startswith("filters.computation")]
    assert computation and not {target for name in computation for target in graph[name]
                                if target.startswith("filters.") and not target.startswith("filters.computation")}


def test_the_checks_take_of_the_jail_only_its_count_of_gpu_memory():
    graph = _imports(_modules())
    checks = [name for name in graph if name.startswith("filters.checks")]
    reached = {target for name in checks for target in graph[name] if target.startswith("filters.sandbox")}
    assert checks and reached == {"filters.sandbox", "filters.sandbox.gpu_memory"}  # the package, and the module


def test_the_verdicts_import_nothing_that_runs_a_task():
    """The zygote decides every verdict (worker.confirm) with code that imports neither torch
    nor a module that loads or runs a task."""
    graph = _imports(_modules())
    for module in ("filters.checks.registry", "filters.checks.verdicts"):
        assert _reached(graph, module) <= {"filters.checks.verdicts", "filters.checks"}, module
        tree = ast.parse(_modules()[module].read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and node.module}
        assert imported <= {"__future__", "math", "filters"}, (module, imported)
