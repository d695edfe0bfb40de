"""Slurm admission: a `job_submit.lua` rendered from the signed contract bundle.

slurmctld runs the script on every submission and update. The contracts are embedded as a
Lua table, so admission needs nothing from the control plane: a job bound for reclaimable
capacity is refused unless its comment names a contract (`sco-contract=<tag>`) whose Slurm
selector allows the job's account and partition.

The script targets Lua 5.1, the version Debian's and most distributions' Slurm links the
job_submit/lua plugin against; nothing in it needs a later Lua.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from contracts.model import SLURM_TAG_PREFIX, Contract

__all__ = ["lua_pattern", "lua_string", "render_job_submit_lua"]

# Bytes written into Lua string literals as themselves; every other byte becomes a
# three-digit decimal escape (Lua 5.1 has no \x escapes). No quote, backslash or control
# character ever reaches the script verbatim, whatever a contract's owner says.
_PLAIN = frozenset((string.ascii_letters + string.digits + " _.,:@/=+-<>()").encode())


def lua_string(text: str) -> str:
    """A Lua 5.1 string literal for `text` (UTF-8), safe for any input."""
    body = "".join(chr(b) if b in _PLAIN else f"\\{b:03d}" for b in text.encode())
    return f'"{body}"'


def lua_pattern(text: str) -> str:
    """`text` as a Lua pattern matching itself literally (every non-alphanumeric escaped)."""
    return "".join(ch if ch.isascii() and ch.isalnum() else f"%{ch}" for ch in text)


class _Allowance(NamedTuple):
    tag: str
    account: str
    partition: str
    contract: str
    owner: str


def _allowances(contracts: Iterable[Contract]) -> list[_Allowance]:
    # Slurm stores account names in lower case, so they are compared in lower case.
    found = {
        _Allowance(c.slurm_tag(s), s.account.lower(), s.partition, c.name, c.owner)
        for c in contracts
        for s in c.selectors.slurm
    }
    return sorted(found)


def _contracts_table(allowances: Sequence[_Allowance]) -> str:
    by_tag: dict[str, list[_Allowance]] = {}
    for allowance in allowances:
        by_tag.setdefault(allowance.tag, []).append(allowance)
    lines = []
    for tag, entries in by_tag.items():
        allowed = ", ".join(f"{e.account}@{e.partition}" for e in entries)
        lines.append(f"  [{lua_string(tag)}] = {{")
        lines.append(f"    allowed = {lua_string(allowed)},")
        lines.append("    entries = {")
        for e in entries:
            fields = (
                f"account = {lua_string(e.account)}, partition = {lua_string(e.partition)}, "
                f"contract = {lua_string(e.contract)}, owner = {lua_string(e.owner)}"
            )
            lines.append(f"      {{ {fields} }},")
        lines.append("    },")
        lines.append("  },")
    return "\n".join(lines)


def render_job_submit_lua(
    contracts: Sequence[Contract],
    *,
    serial: int,
    reclaimable_partitions: Sequence[str],
    default_partition: str | None = None,
) -> str:
    """The complete `job_submit.lua` for bundle `serial`; same input, same text.

    `default_partition` is the cluster's default partition, used for jobs that name none;
    None means such jobs are not bound for reclaimable capacity.
    """
    if isinstance(serial, bool) or not isinstance(serial, int) or serial < 0:
        raise ValueError(f"serial must be a non-negative integer, not {serial!r}")
    allowances = _allowances(contracts)
    tags = sorted({a.tag for a in allowances})
    reclaimable = "\n".join(
        f"  [{lua_string(p)}] = true," for p in sorted(set(reclaimable_partitions))
    )
    values = {
        "SERIAL": str(serial),
        "DEFAULT_PARTITION": "nil" if default_partition is None else lua_string(default_partition),
        "RECLAIMABLE": reclaimable,
        "CONTRACTS": _contracts_table(allowances),
        "KNOWN_TAGS": lua_string(", ".join(tags) or "none"),
        "TAG_PATTERN": lua_pattern(SLURM_TAG_PREFIX),
    }
    # One pass, so text from a contract is never itself searched for placeholders.
    return _PLACEHOLDER.sub(lambda m: values[m[1]], _TEMPLATE)


# Placeholders are @NAME@ rather than str.format fields because Lua is full of braces.
_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")
# Messages go through log_user("%s", msg): log_user formats its first argument, and a
# job's comment or account must never be read as a format string.
_TEMPLATE = """\
-- job_submit.lua: SCO contract admission for reclaimable capacity.
-- Generated from contract bundle serial @SERIAL@ by contracts/admission/slurm.py.
-- Do not edit: render it again from the bundle. It is self-contained on purpose, so
-- admission keeps working while the SCO control plane is down.

local SERIAL = @SERIAL@

-- The partition of jobs that name none (nil: such jobs are not bound for reclaimable capacity).
local DEFAULT_PARTITION = @DEFAULT_PARTITION@

-- Partitions backed by reclaimable capacity: jobs there need a contract.
local RECLAIMABLE = {
@RECLAIMABLE@
}

-- Contract tag (--comment=sco-contract=<tag>) -> the account/partition pairs it allows.
local CONTRACTS = {
@CONTRACTS@
}

local KNOWN_TAGS = @KNOWN_TAGS@

-- A job may name several partitions, comma-separated; it is bound for reclaimable capacity
-- if any of them is reclaimable, and each reclaimable one must be allowed.
local function reclaimable_partitions(partition)
  local names = {}
  if partition == nil or partition == "" then
    if DEFAULT_PARTITION ~= nil then names[1] = DEFAULT_PARTITION end
  else
    for name in string.gmatch(partition, "[^,]+") do names[#names + 1] = name end
  end
  local found = {}
  for _, name in ipairs(names) do
    if RECLAIMABLE[name] then found[#found + 1] = name end
  end
  return found
end

-- Same rule as contracts.model.contract_tag_in_comment: the prefix at the start of the
-- comment or after whitespace, ',' or ';'.
local function contract_tag(comment)
  if comment == nil then return nil end
  return string.match(" " .. comment, "[%s,;]@TAG_PATTERN@([a-z0-9%-]+)")
end

local function allowance(entries, account, partition)
  for _, entry in ipairs(entries) do
    if entry.account == account and entry.partition == partition then return entry end
  end
  return nil
end

-- Slurm (22.05 at least) discards log_user during job_modify, logging an error instead.
local function refuse(rc, what, msg, tell_user)
  if tell_user then slurm.log_user("%s", msg) end
  slurm.log_info("sco bundle %d: %s refused: %s", SERIAL, what, msg)
  return rc
end

-- The admission rule: slurm.SUCCESS, or an error code after logging why (and, on
-- submission, telling the user).
local function admit(what, partition, account, comment, uid, tell_user)
  local spot = reclaimable_partitions(partition)
  if #spot == 0 then return slurm.SUCCESS end
  -- Older Slurm releases lack some ESLURM_* constants; ERROR refuses just the same.
  local denied = slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
  local where = table.concat(spot, ",")
  local tag = contract_tag(comment)
  if tag == nil then
    return refuse(denied, what, string.format(
      "jobs on reclaimable partition '%s' need a contract: "
        .. "add --comment=sco-contract=<name> (SCO bundle %d)",
      where, SERIAL), tell_user)
  end
  local contract = CONTRACTS[tag]
  if contract == nil then
    return refuse(denied, what, string.format(
      "unknown contract '%s' for reclaimable partition '%s' (SCO bundle %d knows: %s)",
      tag, where, SERIAL, KNOWN_TAGS), tell_user)
  end
  if account == nil or account == "" then
    return refuse(slurm.ESLURM_INVALID_ACCOUNT or slurm.ERROR, what, string.format(
      "jobs on reclaimable partition '%s' need an account: pass --account=<account> "
        .. "(contract '%s' allows %s; SCO bundle %d)",
      where, tag, contract.allowed, SERIAL), tell_user)
  end
  account = string.lower(account)
  local chosen = nil
  for _, name in ipairs(spot) do
    local entry = allowance(contract.entries, account, name)
    if entry == nil then
      return refuse(denied, what, string.format(
        "contract '%s' does not allow account '%s' on partition '%s' (it allows %s; SCO bundle %d)",
        tag, account, name, contract.allowed, SERIAL), tell_user)
    end
    chosen = chosen or entry
  end
  slurm.log_info(
    "sco bundle %d: %s accepted: contract %s (owner %s), account %s, partition %s, uid %s",
    SERIAL, what, chosen.contract, chosen.owner, account, where, tostring(uid))
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  return admit("submission", job_desc.partition, job_desc.account, job_desc.comment,
    submit_uid, true)
end

-- job_desc holds only the fields being changed. Only a change of partition, account or
-- comment is checked again, so a job whose contract has since gone can still be held,
-- released or re-prioritised; it just cannot move or change its contract.
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if job_desc.partition == nil and job_desc.account == nil and job_desc.comment == nil then
    return slurm.SUCCESS
  end
  return admit("update of job " .. tostring(job_rec.job_id),
    job_desc.partition or job_rec.partition,
    job_desc.account or job_rec.account,
    job_desc.comment or job_rec.comment,
    modify_uid, false)
end

slurm.log_info("sco bundle %d: job_submit.lua loaded", SERIAL)

return slurm.SUCCESS
"""
