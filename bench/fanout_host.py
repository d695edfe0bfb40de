"""Several node agents in one process, for bench/hall_fanout_bench.py: each is the real
`agent.daemon.Agent` of its own config (its own NATS connection and durable consumer,
bundle cache, dedupe store and journal), all on one event loop until SIGTERM. A node runs
one agent; the bench packs them so that 500 fit in this machine's memory (one agent
process is ~50 MB resident, most of it the interpreter and its libraries).

    python bench/fanout_host.py CONFIG.toml [CONFIG.toml ...]
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import load_config
from agent.daemon import Agent


async def host(configs: list[Path]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agents = [Agent(load_config(path, {})) for path in configs]
    await asyncio.gather(*(a.run(stop) for a in agents))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(host([Path(p) for p in sys.argv[1:]]))
