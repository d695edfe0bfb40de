"""Imports run one way: (workers' CLI and box) → services → workflows → activities →
(contracts, planning); every service may use the workers' shared runtime (settings, logs,
endpoints, clients), which itself never imports a service.

The node plane (`agent`) and the contract layer never import the control plane or Temporal,
so drains and admission keep working when Temporal and every worker are down; `planning`
is pure (no I/O, no Temporal), so workflows replay it and activities may call it. Each rule
has a probe proving its check can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

#: package (or one module's folder) -> the modules it must never import, with their
#: submodules ("workers.cli" forbids workers.cli.main, not workers.settings).
FORBIDDEN: dict[str, frozenset[str]] = {
    "agent": frozenset(
        {"workflows", "activities", "workers", "services", "planning", "temporalio"}
    ),
    "contracts": frozenset(
        {"workflows", "activities", "workers", "services", "planning", "temporalio"}
    ),
    "planning": frozenset(
        {"workflows", "activities", "workers", "services", "agent", "temporalio"}
    ),
    # The estate simulator drives the pure policy code only, like planning is.
    "estate": frozenset({"workflows", "activities", "workers", "services", "agent", "temporalio"}),
    "activities": frozenset({"workflows", "workers", "services"}),
    "workflows": frozenset({"workers", "services"}),
    # A process's loop uses the shared runtime (workers.settings, workers.endpoints, ...),
    # activities and workflows, never the commands or the box that start it.
    "services": frozenset({"workers.cli", "workers.devbox"}),
    # The shared runtime is under every service: it never imports one.
    "workers": frozenset({"services"}),
}

#: Folders of a package the package's rule does not cover: the CLI and the box start the
#: services, so they import them.
EXEMPT: dict[str, frozenset[str]] = {"workers": frozenset({"cli", "devbox"})}


def forbids(forbidden: frozenset[str], name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every absolute import, static or by importlib/__import__."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(path: Path, forbidden: frozenset[str]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return [
        f"{shown}:{line}: imports {name}"
        for line, name in imported_modules(tree)
        if forbids(forbidden, name)
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    root = REPO / package
    exempt = EXEMPT.get(package, frozenset())
    files = sorted(f for f in root.rglob("*.py") if f.relative_to(root).parts[0] not in exempt)
    assert files, f"no files in {package}/: the check would pass vacuously"
    found = [v for f in files for v in violations(f, FORBIDDEN[package])]
    assert found == []


PROBES = {
    "agent": "import temporalio.client\nfrom workflows import search_attributes\n",
    "contracts": "from temporalio import workflow\nimport activities.fleet\n",
    "planning": "from activities.events import InstanceState\nimport temporalio\n",
    "estate": "from workflows.floor.plan import plan_floor\nimport temporalio.workflow\n",
    "activities": "from workflows.exclusion.models import ExclusionInput\n"
    "import importlib\nimportlib.import_module('workers.cli')\n",
    "workflows": "from workers.settings import Settings\n__import__('services.registry')\n",
    "services": "from workers.cli.common import settings\nimport workers.devbox.box\n"
    "from workers.settings import Settings\nimport workers.endpoints\n",
    "workers": "from services.registry import SERVICES\n"
    "import importlib\nimportlib.import_module('services.region_worker.service')\n",
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_each_rule_catches_a_violation(package: str, tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBES[package])
    assert len(violations(probe, FORBIDDEN[package])) == 2


@pytest.mark.parametrize("package", sorted(p for p in FORBIDDEN if "services" in FORBIDDEN[p]))
def test_no_layer_under_the_services_imports_one(package: str, tmp_path: Path) -> None:
    """workflows, activities, the node agent, contracts, planning, estate and the shared
    runtime: a service's loop is never theirs to call."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from services.notice_relay.service import run\nimport services\n"
        "import importlib\nimportlib.import_module('services.registry')\n"
    )
    assert len(violations(probe, FORBIDDEN[package])) == 3


def test_allowed_directions_pass(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from activities.events import InstanceState\nimport planning.costs\n")
    assert violations(probe, FORBIDDEN["workflows"]) == []
    probe.write_text(
        "from workers.settings import Settings\nimport workers.endpoints\n"
        "from activities.backoff import CappedBackoff\nfrom workflows.sync_pools import X\n"
        "import workers_cli_lookalike\n"
    )
    assert violations(probe, FORBIDDEN["services"]) == []


def test_the_cli_and_the_box_are_exempt_from_the_runtime_rule() -> None:
    """They start the services: the exemption is what lets them, and it is all it covers."""
    assert any(
        violations(f, FORBIDDEN["workers"]) for f in (REPO / "workers" / "cli").rglob("*.py")
    )
    assert EXEMPT["workers"] <= {p.name for p in (REPO / "workers").iterdir() if p.is_dir()}


#: What a node must never load (decision 0041): pydantic costs the agent ~9 MB of its
#: 35 MB budget (issue 33), and the .deb ships neither it nor PyYAML.
NODE_FORBIDDEN = frozenset({"pydantic", "pydantic_core", "pydantic_settings", "yaml"})


def module_file(name: str) -> Path | None:
    """The repository file of module `name` (a package's __init__), None outside it."""
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def node_imports(start: str) -> dict[str, str]:
    """Every module `start` imports, at any depth through the repository's own modules (a
    function's lazy import included) -> the chain that reaches it."""
    chains = {start: start}
    todo = [start]
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None:
            continue
        for _, imported in imported_modules(ast.parse(path.read_text(), filename=str(path))):
            parts = imported.split(".")
            # `from contracts import bounded` names the module contracts.bounded too.
            for found in {imported, *(".".join(parts[:n]) for n in range(1, len(parts)))}:
                if found not in chains:
                    chains[found] = f"{chains[name]} -> {found}"
                    todo.append(found)
    return chains


def node_violations(start: str) -> list[str]:
    return sorted(
        chain for name, chain in node_imports(start).items() if forbids(NODE_FORBIDDEN, name)
    )


def agent_modules() -> list[str]:
    root = REPO / "agent"
    return sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in root.rglob("*.py")
    )


def test_the_node_agent_imports_no_pydantic() -> None:
    """Every module of the agent, and every module of contracts/ it reaches."""
    modules = agent_modules()
    assert len(modules) > 20
    found = [v for m in modules for v in node_violations(m)]
    assert found == []


def test_the_node_rule_catches_a_chain() -> None:
    """contracts.bundle is the control plane's reading (pydantic): reached, it is named."""
    assert any(v.endswith("-> pydantic") for v in node_violations("contracts.bundle"))
    assert node_violations("contracts.node_bundle") == []
