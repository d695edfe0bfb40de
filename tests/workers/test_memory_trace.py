"""Memory snapshots on demand: a process started with PYTHONTRACEMALLOC arms itself, writes a
snapshot on each SIGUSR2, and `sco dev memory-diff` names the traceback that grew; a
process started without it never arms (SIGUSR2 would end it); a file that is not a
snapshot is one line, never code run or a traceback."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.paths import REPO
from tests.support.wait import eventually
from workers.cli.main import app
from workers.memory_trace import SUFFIX

# A snapshot takes seconds alone, tens of seconds on a loaded machine.
pytestmark = pytest.mark.timeout(240)

runner = CliRunner()

# Arms like a service does, then grows by ~4 MB at a line of its own on each input line.
# Its main thread waits as a service's event loop does, waking every 0.1 s: Python runs a
# signal's handler only when the main thread runs bytecode, and a signal that lands between
# the last bytecode and a bare blocking read waits for the next input line (CI waited 90 s).
_PROCESS = textwrap.dedent(
    """
    import select
    import sys
    from pathlib import Path
    from workers.memory_trace import arm

    print(arm("probe", Path(sys.argv[1])), flush=True)
    kept = []
    while True:
        if not select.select([sys.stdin], [], [], 0.1)[0]:
            continue
        if not sys.stdin.readline():
            break
        kept.append([bytearray(4096) for _ in range(1000)])  # GROWS-HERE
        print("grown", flush=True)
    """
)


def _start(tmp_path: Path, traced: bool, diag: Path | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONTRACEMALLOC"}
    if traced:
        env["PYTHONTRACEMALLOC"] = "3"
    script = tmp_path / "probe.py"
    script.write_text(_PROCESS)
    return subprocess.Popen(
        [sys.executable, str(script), str(diag or tmp_path / "diag")],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _snapshot(proc: subprocess.Popen[str], tmp_path: Path, n: int) -> Path:
    path = tmp_path / "diag" / f"probe-{proc.pid}-{n}{SUFFIX}"
    os.kill(proc.pid, signal.SIGUSR2)
    eventually(path.is_file, timeout=90, what=f"snapshot {n} written")
    return path


def test_a_traced_process_writes_snapshots_and_the_diff_names_what_grew(tmp_path: Path) -> None:
    proc = _start(tmp_path, traced=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        armed = Path(proc.stdout.readline().strip())
        assert armed == tmp_path / "diag" / f"probe-{proc.pid}.armed"
        assert armed.read_text().strip() == "3"  # the frames kept
        first = _snapshot(proc, tmp_path, 1)
        proc.stdin.write("grow\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "grown"
        second = _snapshot(proc, tmp_path, 2)
    finally:
        proc.kill()
        proc.wait(10)
    result = runner.invoke(app, ["dev", "memory-diff", str(first), str(second), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    top = doc["grown"][0]
    # ~4 MB at the line that grows, found by its traceback.
    assert top["size_diff_kb"] > 3800, top
    grows = _PROCESS.splitlines().index(next(x for x in _PROCESS.splitlines() if "GROWS" in x))
    assert top["frames"][-1] == f"{tmp_path / 'probe.py'}:{grows + 1}", top
    assert doc["after_kb"] - doc["before_kb"] > 3800
    text = runner.invoke(app, ["dev", "memory-diff", str(first), str(second), "--top", "3"])
    assert text.exit_code == 0 and "KiB" in text.output and f"probe.py:{grows + 1}" in text.output


def test_a_process_started_untraced_does_not_arm(tmp_path: Path) -> None:
    proc = _start(tmp_path, traced=False)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "None"
        assert not (tmp_path / "diag").exists()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_traced_process_with_nowhere_to_write_runs_on_unarmed(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    proc = _start(tmp_path, traced=True, diag=tmp_path / "a-file" / "diag")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "None"
        proc.stdin.write("grow\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "grown"  # it runs on
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (pickle.dumps({"stats": []}), "not UTF-8"),  # never unpickled
        (b"[" * 100_000, "nest"),
        (b'{"stats": 5}', "not a memory snapshot (no stats list)"),
        (b'{"stats": [{"frames": ["a:1"], "size": -1, "count": 0}]}', "stats[0]: wants"),
        (b'{"stats": [{"frames": [1], "size": 1, "count": 1}]}', "stats[0]: wants"),
        (b'{"stats": [{"frames": ["a:1"], "size": 1e400, "count": 1}]}', ""),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_one_line(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    bad = tmp_path / f"bad{SUFFIX}"
    bad.write_bytes(content)
    good = tmp_path / f"good{SUFFIX}"
    good.write_text('{"stats": []}')
    result = runner.invoke(app, ["dev", "memory-diff", str(good), str(bad)])
    assert result.exit_code == 1, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert str(bad.name) in lines[0] and reason in lines[0], lines[0]
    missing = runner.invoke(app, ["dev", "memory-diff", str(good), str(tmp_path / "none")])
    assert missing.exit_code == 1 and "no such file" in missing.output


def test_the_memory_bench_snapshots_every_armed_process_and_compares_them(
    tmp_path: Path,
) -> None:
    """bench/memory_hour_bench.py --tracemalloc: SIGUSR2 goes to armed processes only, each
    one's two snapshots are compared (the untraced one, sent nothing, still runs)."""
    from bench.memory_hour_bench import compare_snapshots, take_snapshots

    traced, untraced = _start(tmp_path, traced=True), _start(tmp_path, traced=False)
    try:
        assert traced.stdout is not None and traced.stdin is not None
        assert untraced.stdout is not None
        assert traced.stdout.readline().strip().endswith(".armed")
        assert untraced.stdout.readline().strip() == "None"
        half = take_snapshots(tmp_path / "diag", 1, wait_s=90)
        traced.stdin.write("grow\n")
        traced.stdin.flush()
        assert traced.stdout.readline().strip() == "grown"
        end = take_snapshots(tmp_path / "diag", 2, wait_s=90)
        assert untraced.poll() is None  # never sent SIGUSR2
    finally:
        for proc in (traced, untraced):
            proc.kill()
            proc.wait(10)
    stem = f"probe-{traced.pid}"
    assert list(half) == list(end) == [stem]
    got = compare_snapshots(half, end)[stem]
    assert isinstance(got, dict)
    assert got["traced_mb_end"] - got["traced_mb_half"] > 3.5, got
    assert got["grown"][0]["frames"][-1].startswith(str(tmp_path / "probe.py")), got
