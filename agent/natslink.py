"""The agent's one NATS connection: connected in the background, never required.

The agent starts and drains without NATS (the metadata source and the journal need none);
whoever needs the connection waits on `connected` or checks `client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

import nats
from nats.aio.client import Client

from agent.config import AgentConfig
from contracts.redact import mask_credentials

log = logging.getLogger(__name__)


class NatsOptionsError(ValueError):
    """A NATS credential or TLS file cannot be used; the message names it."""


def nats_options(config: AgentConfig) -> dict[str, Any]:
    """The node's NATS identity as `nats.connect` options: credentials, TLS, and an inbox
    prefix of its own (the permissions let a node read only `_INBOX_<node>.>`, so no node
    sees another's JetStream deliveries or replies)."""
    options: dict[str, Any] = {"inbox_prefix": f"_INBOX_{config.node_id}"}
    if config.nats_user is not None and config.nats_password_file is not None:
        try:
            password = config.nats_password_file.read_text().strip()
        except OSError as exc:
            raise NatsOptionsError(
                f"nats_password_file {config.nats_password_file}: {exc.strerror}"
            ) from exc
        options.update(user=config.nats_user, password=password)
    if config.nats_creds_file is not None:
        options["user_credentials"] = str(config.nats_creds_file)
    if config.nats_nkey_seed_file is not None:
        options["nkeys_seed"] = str(config.nats_nkey_seed_file)
    if config.nats_tls_ca is not None or config.nats_tls_cert is not None:
        try:
            context = ssl.create_default_context(
                cafile=str(config.nats_tls_ca) if config.nats_tls_ca else None
            )
            if config.nats_tls_cert is not None and config.nats_tls_key is not None:
                context.load_cert_chain(str(config.nats_tls_cert), str(config.nats_tls_key))
        except (OSError, ssl.SSLError) as exc:
            raise NatsOptionsError(f"NATS TLS files: {exc}") from exc
        options["tls"] = context
    return options


class NatsLink:
    def __init__(
        self,
        urls: list[str],
        options: dict[str, Any] | None = None,
        *,
        retry_seconds: float = 2.0,
    ) -> None:
        self._urls = urls
        self._options = options or {}
        self._retry = retry_seconds
        self.client: Client | None = None
        self.connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        """The context every (re)connect's handshake uses: reloaded in place when the
        node's certificate is renewed (contracts.cert_renewal.follow_files)."""
        ctx = self._options.get("tls")
        return ctx if isinstance(ctx, ssl.SSLContext) else None

    def start(self) -> None:
        if self._task is None and self._urls:
            self._task = asyncio.create_task(self._connect_forever(), name="nats-connect")

    async def _connect_forever(self) -> None:
        while True:
            try:
                # The client reconnects by itself once it has connected once.
                self.client = await nats.connect(
                    servers=self._urls,
                    connect_timeout=2,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    name="sco-agent",
                    **self._options,
                )
                self.connected.set()
                url = self.client.connected_url
                log.info("connected to NATS %s", mask_credentials(url.geturl() if url else ""))
                return
            except Exception as exc:  # any failure to connect: retry, drains go on
                log.warning(
                    "NATS %s unreachable, retrying: %s", mask_credentials(",".join(self._urls)), exc
                )
                await asyncio.sleep(self._retry)

    async def publish(self, subject: str, data: bytes, limit_seconds: float) -> bool:
        """Publish and flush within `limit_seconds`; False (logged) instead of raising."""
        client = self.client
        if client is None or not client.is_connected:
            log.warning("NATS not connected: %s not published", subject)
            return False
        try:
            await asyncio.wait_for(client.publish(subject, data), limit_seconds)
            await client.flush(timeout=max(1, round(limit_seconds)))
            return True
        except Exception as exc:  # reporting never fails a drain
            log.warning("publish to %s failed: %s", subject, exc)
            return False

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.close(), 2)
