"""The import contract: the library is layered, lowest first, and nothing imports upward or in a cycle.

Every ``import`` counts, also those inside functions (a lazy import is still a dependency). A
module's layer is the longest prefix listed below; package ``cli`` modules (each package registers
its own commands) sit at the top with ``tidewater.cli``, which only assembles them and is imported
by no module of the library.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "include"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "utilities",
        (
            "tidewater",  # the package's __init__ only
            "tidewater.errors",
            "tidewater.config",
            "tidewater.times",
            "tidewater.paths",
            "tidewater.processes",
            "tidewater.class_data",
            "tidewater.worker_start",
            "tidewater.runner_forkserver",
            "tidewater.warm_daemon",
            "tidewater.faults",
            "tidewater.phase_clock",
            "tidewater.strict_json",
            "tidewater.json_columns",
            "tidewater.json_files",
            "tidewater.connectors.options",  # the data sources' option parser: the Kafka clients' too
            "tidewater.dedup",
            "tidewater.scd2",
            "tidewater.postgres",
            "tidewater.redis_server",
            "tidewater.spark_cluster",
        ),
    ),
    (
        "lake, Kafka clients",
        (
            "tidewater.lake",
            "tidewater.connectors.kafka_client",
            "tidewater.connectors.kafka_confluent",
            "tidewater.broker",
            "tidewater.s3server",
        ),
    ),
    ("connectors", ("tidewater.connectors", "tidewater.spark")),
    (
        "transforms, pipelines",
        ("tidewater.transforms", "tidewater.keyed_state", "tidewater.pipelines", "tidewater.generator"),
    ),
    ("streaming, batch", ("tidewater.streaming", "tidewater.batch")),
    ("quality, query", ("tidewater.quality", "tidewater.query")),
    ("orchestration, ui", ("tidewater.orchestration", "tidewater.ui")),
    ("cli", ("tidewater.cli",)),
)
TOP = len(LAYERS) - 1


def layer_of(module: str) -> int:
    if module.endswith(".cli"):
        return TOP
    best: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = module == prefix
            below = prefix != "tidewater" and module.startswith(prefix + ".")
            if (exact or below) and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best[0]


def library_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((PACKAGE_ROOT / "tidewater").rglob("*.py")):
        parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The library modules ``path`` imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("tidewater"):
                found.add(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = library_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_no_module_imports_a_higher_layer(graph):
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_command_modules_are_imported_only_by_the_assembler(graph):
    importers = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if target.endswith(".cli") and target != module and module != "tidewater.cli"
    )
    assert importers == []


def test_no_import_cycles(graph):
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            # a package's __init__ re-exporting its submodules is not a cycle through them
            if module.startswith(target + "."):
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_the_contract_sees_lazy_imports(tmp_path):
    """The checker itself: an import inside a function counts."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tidewater.cli import main\n    return main\n")
    assert imports_of(module, {"tidewater", "tidewater.cli"}) == {"tidewater.cli"}
    assert layer_of("tidewater.batch.cli") == TOP and layer_of("tidewater.lake.files") == 1
