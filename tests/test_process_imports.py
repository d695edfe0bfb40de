"""Each long-running process imports only what it uses.

Every process is loaded in a fresh interpreter the way its command loads it (`sco <cmd>`:
the CLI's guard, the command's module, then the service's `run` from the registry;
`sco-agent`: its `main`, up to parsing arguments) and the top-level packages it then holds
are compared with what it must not hold: scipy and numpy (the exact planner's, loaded by
the region worker when a plan is improved), openstacksdk (loaded with the OpenStack
provider only), aiohttp (nats-py's WebSocket transport: contracts/lean_imports.py), rich
(the CLI's tables and colours, loaded when a command prints through them: never by a
process that only logs), and per process the clients of services it never talks to. A
heavy import that creeps in fails here, naming the process and the package.

`importlib.metadata` (with email, zipfile, csv: ~1 MB) is held by no process that needs
no version of a distribution at run time: nats-py's and psycopg's version lookups and
pydantic's plugin loader are answered without it (contracts/lean_imports.py, decision
0026), and the versions they see are still the installed ones.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.support.paths import REPO
from tests.test_layering import imported_modules

#: Never in a long-running process at start: loaded when configured or first used.
NOWHERE = frozenset(
    {
        "scipy",
        "numpy",
        "openstack",
        "keystoneauth1",
        "aiohttp",
        "torch",
        "pandas",
        "pyarrow",
        "rich",
        # Settings read their own sources (decision 0035).
        "pydantic_settings",
        "dotenv",
    }
)

#: process -> (the CLI module its `sco` command lives in, what else it must not import)
SERVICES: dict[str, tuple[str, frozenset[str]]] = {
    # Temporal never (the region worker tells it of notices: decision 0030). It signs
    # notices without the bundle's contract models (contracts/canonical.py). `sco
    # notice-relay` starts it without the CLI: no typer, no commands' plumbing, and its
    # settings read without pydantic-settings (decision 0035).
    "notice-relay": (
        "workers.cli.notice_relay",
        frozenset(
            {
                "typer",
                "click",
                "workers.cli.common",
                "workers.cli.main",
                "workers.cli.notices",
                "temporalio",
                "clickhouse_connect",
                "chdb",
                "confluent_kafka",
                "planning",
                "contracts.bundle",
                "contracts.model",
                "importlib.metadata",
            }
        ),
    ),
    # psycopg: refused reports are dead letters in the fleet DB (decision 0015).
    "drain-intake": ("workers.cli.ledger", frozenset({"temporalio", "confluent_kafka"})),
    "outbox-relay": (
        "workers.cli.fleet",
        frozenset({"temporalio", "nats", "clickhouse_connect", "importlib.metadata"}),
    ),
    "simulator": (
        "workers.cli.simulator",
        frozenset({"temporalio", "clickhouse_connect", "confluent_kafka", "importlib.metadata"}),
    ),
    "ledger-consumer": ("workers.cli.ledger", frozenset({"temporalio", "nats"})),
    "worker": ("workers.cli.control", frozenset({"confluent_kafka"})),
    "contract-sync": ("workers.cli.contracts", frozenset({"temporalio", "confluent_kafka"})),
}

#: The node agent: nothing of the control plane, no control-plane clients.
AGENT_FORBIDDEN = frozenset(
    {
        "workflows",
        "activities",
        "workers",
        "services",
        "planning",
        "temporalio",
        "psycopg",
        "psycopg_pool",
        "clickhouse_connect",
        "confluent_kafka",
        "typer",
        # Its TOML and environment are read by agent/config.py, not by a settings library.
        "pydantic_settings",
        "dotenv",
    }
)

#: Modules of packages the agent does use that it loads only when configured for them: the
#: Kubernetes scheduler's HTTP client (Slurm and plain nodes never load it) and
#: `--check`'s checks.
AGENT_NOT_AT_START = frozenset(
    {
        "urllib.request",
        "http.client",
        "agent.scheduler.kubernetes",
        "agent.check",
        "importlib.metadata",
        "contracts.region",
    }
)

_PRINT_MODULES = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print(json.dumps(sorted(m for m, v in "
    "sys.modules.items() if v is not None))))\n"
)


def _top_level_modules(code: str) -> set[str]:
    """Top-level packages a fresh interpreter holds after running `code`."""
    return {m.split(".")[0] for m in _modules(code)}


def _run_printing_modules(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that prints, at exit, every module it holds."""
    return subprocess.run(
        [sys.executable, "-c", _PRINT_MODULES + code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _modules(code: str) -> set[str]:
    """Every module a fresh interpreter holds after running `code`."""
    out = _run_printing_modules(code)
    lines = [x for x in out.stdout.splitlines() if x.startswith("[")]
    assert lines, f"no module list (exit {out.returncode}): {out.stderr[-2000:]}"
    return set(json.loads(lines[-1]))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_process_imports_only_what_it_uses(name: str) -> None:
    cli_module, forbidden = SERVICES[name]
    modules = _modules(
        "from contracts.lean_imports import no_websockets_for_nats\n"
        "no_websockets_for_nats()\n"  # what `sco`'s main does first
        f"import {cli_module}\n"
        "from services.registry import service\n"
        f"service({name!r}).load()\n"
    )
    # A dotted name is one module; a plain one a whole package.
    loaded = modules | {m.split(".")[0] for m in modules}
    assert sorted(loaded & (NOWHERE | forbidden)) == [], f"{name} imports them at start"


@pytest.mark.timeout(150)
def test_sco_notice_relay_starts_without_the_cli() -> None:
    """`sco notice-relay` (the console script's and `python -m workers.cli`'s entry) runs
    the relay without typer, rich or pydantic-settings, and refuses a bad option as the
    typer command does: one line naming it, exit 1."""
    code = (
        "sys.argv = ['sco', 'notice-relay', '--region', 'r1', '--hall', 'Z']\n"
        "from workers.cli.entry import main\n"
        "main()\n"
    )
    out = _run_printing_modules(code)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip() == "error: --hall 'Z': region r1 has halls A, B, C, D"
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    loaded = modules | {m.split(".")[0] for m in modules}
    assert "workers.settings" in modules  # the probe saw it read its settings
    heavy = {"typer", "click", "rich", "pydantic_settings", "dotenv", "workers.cli.common"}
    assert sorted(loaded & heavy) == []


@pytest.mark.timeout(150)
def test_the_node_agent_imports_only_what_it_uses() -> None:
    # `sco-agent --help`: main() installs the guard, imports the daemon, parses, exits.
    modules = _modules("sys.argv = ['sco-agent', '--help']\nfrom agent.cli import main\nmain()\n")
    loaded = {m.split(".")[0] for m in modules}
    assert "nats" in loaded and "agent.daemon" in modules  # the probe saw the daemon load
    assert sorted(loaded & (NOWHERE | AGENT_FORBIDDEN)) == []
    assert sorted(modules & AGENT_NOT_AT_START) == []


@pytest.mark.timeout(150)
def test_the_probe_sees_a_heavy_import() -> None:
    """Without the guard, importing nats brings aiohttp: the check above can fail."""
    assert "aiohttp" in _top_level_modules("import nats\n")


@pytest.mark.timeout(150)
def test_versions_read_without_importlib_metadata_are_the_installed_ones() -> None:
    """The lean finder answers nats-py's and psycopg's version lookups from the dist-info
    names and pydantic's plugin lookup with none: what they report is what
    importlib.metadata reports (read here after them, in the same process)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from contracts.lean_imports import no_websockets_for_nats\n"
            "no_websockets_for_nats()\n"
            "import sys, json, nats.aio.client, psycopg, psycopg_binary, psycopg_pool\n"
            "import pydantic\n"
            "class M(pydantic.BaseModel):\n    x: int\n"
            "from pydantic.plugin._loader import get_plugins\n"
            "held = 'importlib.metadata' in sys.modules\n"
            "import importlib.metadata as md\n"
            "print(json.dumps({'held': held, 'plugins': list(get_plugins()), 'got': ["
            "nats.aio.client.__version__, psycopg.__version__, psycopg_binary.__version__,"
            " psycopg_pool.__version__], 'want': [md.version('nats-py'), md.version('psycopg'),"
            " md.version('psycopg-binary'), md.version('psycopg-pool')],"
            " 'impl': psycopg.pq.__impl__, 'ok': M(x=1).x}))\n",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["held"] is False
    assert got["plugins"] == []
    assert got["got"] == got["want"]
    assert got["impl"] == "binary" and got["ok"] == 1


#: Lazy imports of Temporal that the relay's modules hold but its path never calls: a
#: provider error becomes a Temporal ApplicationError only inside an activity (worker).
RELAY_NEVER_CALLS = frozenset({"activities.provider.errors"})


def _reachable(start: str, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """Every module `start` can ever import, at its top or inside a function (statically,
    through this repository's modules; `if TYPE_CHECKING:` blocks aside): module -> the
    repository module importing it."""
    importer: dict[str, str] = {}
    todo, seen = [start], {start}
    while todo:
        module = todo.pop()
        path = REPO / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / module.replace(".", "/") / "__init__.py"
        if not path.exists() or module in skip:
            continue  # a library's module, or one whose lazy imports are vouched for
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # what only the type checker reads is never loaded
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                node.body = []
        for _, name in imported_modules(tree):
            parts = name.split(".")
            for sub in (".".join(parts[: i + 1]) for i in range(len(parts))):
                if sub not in seen:
                    seen.add(sub)
                    importer[sub] = module
                    todo.append(sub)
    return importer


def test_the_notice_relay_never_loads_temporal_not_even_for_a_notice() -> None:
    """Decision 0030: the region worker tells Temporal of notices from the notice stream,
    so no code path of the relay (lazy imports included) reaches temporalio or a
    workflow; a relay that has noticed stays at its start footprint (~30 MB less)."""
    reached = _reachable("services.notice_relay.service", RELAY_NEVER_CALLS)
    heavy = {"temporalio", "workflows", "scipy", "numpy"}
    found = {m: by for m, by in reached.items() if m.split(".")[0] in heavy}
    assert found == {}, f"the relay reaches them (module: imported by): {found}"


def test_the_reachability_probe_sees_a_lazy_temporal_import() -> None:
    """The region worker's notice hooks import Temporal: the check above can fail."""
    assert "temporalio" in _reachable("workers.notice_hooks")
    assert "temporalio" in _reachable("activities.provider.errors")  # inside a function
    assert "contracts.bundle" not in _reachable("contracts.notice_signing")  # type only


def test_a_nats_connect_loads_no_contract_models() -> None:
    """Every process's `nats_options` reads its identity's inbox prefix: not through the
    rendered users' module, which loads the bundle's and the contract models (~2 MB the
    relay held once connected)."""
    reached = _reachable("workers.client_security")
    assert (
        sorted({"contracts.bundle", "contracts.model", "workers.nats_permissions"} & set(reached))
        == []
    )


@pytest.mark.timeout(150)
def test_a_simulator_client_does_not_load_the_simulated_cloud() -> None:
    """The box's relays, worker and CLI reach the simulated cloud through `SimulatorClient`
    (what `open_provider` loads for `provider.kind = simulator`): the cloud's own code
    (~0.6 MB in each of them) is the simulator process's only."""
    modules = _modules("import workers.provider_factory, activities.provider.sim_service\n")
    assert "activities.provider.sim_service" in modules
    assert "activities.provider.simulator" not in modules
