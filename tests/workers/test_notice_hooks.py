"""The region worker tells Temporal of the relays' notices from the notice stream
(decision 0030): a hard notice published while Temporal is away waits in the stream and
is told to the pool's exclusion workflow once Temporal answers; an early warning wakes the
controllers; what is not a notice is dropped. On a nats-server of the test's own, so the
region's stream and the worker's durable consumer are this test's alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nacl.signing import SigningKey
from nats.aio.client import Client as NATS
from temporalio.client import Client

from activities.backoff import CappedBackoff
from contracts.notice import NOTICE_HOOKS_CONSUMER, NoticeStage, ReclaimNotice, notice_stream
from contracts.notice_signing import sign
from services.notice_relay.service import hooks_pending
from tests.support import services
from tests.support.private_nats import nats_server_binary, running_nats_server
from tests.support.wait import checked, eventually_async
from workers.notice_hooks import NoticeHookConsumer
from workflows.exclusion.models import exclusion_workflow_id

KEY = SigningKey.generate()


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    port = services.free_port()
    config = tmp_path / "nats.conf"
    config.write_text(f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
    with running_nats_server(nats_server_binary(), config, port):
        yield f"nats://127.0.0.1:{port}"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_url)
    js = conn.jetstream()
    await js.add_stream(name=notice_stream("r1"), subjects=["sco.r1.notice.>"], max_age=86400)
    yield conn
    await conn.close()


def notice(node: str, stage: NoticeStage = NoticeStage.HARD) -> ReclaimNotice:
    now = datetime.now(UTC)
    return ReclaimNotice(
        notice_id=f"n-{node}",
        region="r1",
        hall="A",
        node=node,
        pool_id="r1.A.gp.m",
        issued_at=now,
        deadline=now + timedelta(seconds=120),
        reason="test",
        stage=stage,
    )


async def publish(nc: NATS, n: ReclaimNotice) -> None:
    await nc.jetstream().publish(n.subject, sign(n, KEY), headers={"Nats-Msg-Id": n.notice_id})


class FlakyClient:
    """Temporal away for the first `fail` calls, then the real client."""

    def __init__(self, real: Client, fail: int) -> None:
        self._real, self._fail = real, fail

    def __getattr__(self, name: str) -> object:
        if self._fail > 0:
            self._fail -= 1
            raise ConnectionError("temporal away")
        return getattr(self._real, name)


@contextlib.asynccontextmanager
async def consuming(nc: NATS, hooks: NoticeHookConsumer) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(hooks.run(nc.jetstream(), stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.mark.timeout(120)
async def test_a_notice_waits_in_the_stream_while_temporal_is_away_and_is_told_after(
    nc: NATS, region_client: Client
) -> None:
    await publish(nc, notice("sco-r1-x"))  # before any worker consumes: told all the same
    await nc.publish("sco.r1.notice.A.junk", b"not a notice")
    hooks = NoticeHookConsumer(
        FlakyClient(region_client, fail=2),  # type: ignore[arg-type]
        "r1",
        f"tq-{services.free_port()}",
        partitions=1,
        backoff=CappedBackoff(0.1, 0.2),
        fetch_seconds=0.5,
    )
    async with consuming(nc, hooks):
        await eventually_async(
            checked(lambda: hooks.counts.told), timeout=60, what="the exclusion workflow told"
        )
        await eventually_async(
            checked(lambda: hooks.counts.dropped), timeout=30, what="the junk dropped"
        )
        # The relay's answer reads the worker's backlog: nothing left once told (the
        # server takes an acknowledgement a moment after it is sent).
        backlog = hooks_pending(nc.jetstream(), "r1")
        await eventually_async(lambda: _nothing(backlog), timeout=30, what="the backlog told")
    assert hooks.counts.told == 1 and hooks.counts.failed_attempts == 2
    desc = await region_client.get_workflow_handle(exclusion_workflow_id("r1.A.gp.m")).describe()
    assert desc.workflow_type == "PoolExclusionWorkflow"


@pytest.mark.timeout(120)
async def test_the_backlog_is_counted_and_an_early_warning_wakes_the_controllers(
    nc: NATS, region_client: Client
) -> None:
    hooks = NoticeHookConsumer(region_client, "r1", "unused", partitions=2, fetch_seconds=0.5)
    async with consuming(nc, hooks):  # the durable consumer made, nothing to tell yet
        await eventually_async(lambda: _made(nc), timeout=30, what="the durable consumer")
    pending = hooks_pending(nc.jetstream(), "r1")
    await publish(nc, notice("sco-r1-y", NoticeStage.EARLY))
    await publish(nc, notice("sco-r1-z", NoticeStage.EARLY))
    assert await pending() == 2  # what the relay's answer to `sco reclaim` says
    async with consuming(nc, hooks):
        # No controller runs in this namespace: each partition is skipped, and the
        # warning counts as told (nothing to wake is not a failure).
        await eventually_async(
            checked(lambda: hooks.counts.told == 2), timeout=60, what="both warnings told"
        )
    assert hooks.counts.failed_attempts == 0
    await eventually_async(lambda: _nothing(pending), timeout=30, what="the backlog told")


async def _nothing(backlog: Callable[[], Awaitable[int]]) -> bool:
    return await backlog() == 0


@pytest.mark.timeout(120)
async def test_a_consumer_deleted_under_the_worker_is_made_again(
    nc: NATS, region_client: Client
) -> None:
    hooks = NoticeHookConsumer(region_client, "r1", "unused", partitions=1, fetch_seconds=0.5)
    async with consuming(nc, hooks):
        await eventually_async(lambda: _made(nc), timeout=30, what="the durable consumer")
        await nc.jetstream().delete_consumer(notice_stream("r1"), NOTICE_HOOKS_CONSUMER)
        await publish(nc, notice("sco-r1-w", NoticeStage.EARLY))
        await eventually_async(
            checked(lambda: hooks.counts.told), timeout=60, what="told by the consumer made again"
        )
        assert await _made(nc)


async def _made(nc: NATS) -> bool:
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await nc.jetstream().consumer_info(notice_stream("r1"), NOTICE_HOOKS_CONSUMER)
        return True
    return False
