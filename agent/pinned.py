"""The relays' notice keys pinned in the node's install (`notice_keys_dir`).

A node must verify a genuine notice from first boot: before its first bundle, and when a
bundle lists no notice keys for its region. The install ships the region's relay public
keys (`<key id>.pub`, with `revoked.txt` like any trust directory); they are read again at
every bundle refresh, so a revocation there takes effect without a restart. Pinned keys
are region-wide until the node holds a bundle whose policy scopes keys to halls: from then
on a pinned key signs only for the halls that bundle gives it (none if it names it not).
"""

from __future__ import annotations

from agent.config import AgentConfig
from contracts.keys import KeyFileError, TrustStore
from contracts.notice import NoticePolicy


def load_pinned(config: AgentConfig) -> tuple[NoticePolicy | None, frozenset[str], str]:
    """The relays' keys shipped with the install (`notice_keys_dir`) as a notice policy
    for this region, the key ids revoked there, and what went wrong ("" when fine)."""
    if config.notice_keys_dir is None:
        return None, frozenset(), ""
    try:
        store = TrustStore.load(config.notice_keys_dir)
    except KeyFileError as exc:
        return None, frozenset(), f"pinned notice keys: {exc}"
    keys = {kid: bytes(vk).hex() for kid, vk in store.keys.items() if kid not in store.revoked}
    if not keys:
        return None, store.revoked, f"pinned notice keys: none usable in {config.notice_keys_dir}"
    policy = NoticePolicy(region=config.region, lead_seconds=config.notice_lead_seconds, keys=keys)
    return policy, store.revoked, ""
