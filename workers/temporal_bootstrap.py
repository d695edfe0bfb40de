"""Idempotent Temporal bootstrap: a namespace per region, our search attributes in it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType
from temporalio.service import RPCError, RPCStatusCode

from workflows import search_attributes


@dataclass
class BootstrapReport:
    namespace: str
    namespace_created: bool = False
    attributes_added: list[str] = field(default_factory=list)


async def bootstrap_namespace(
    client: Client, namespace: str, retention: timedelta
) -> BootstrapReport:
    report = BootstrapReport(namespace)
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        try:
            await client.workflow_service.register_namespace(
                RegisterNamespaceRequest(
                    namespace=namespace,
                    workflow_execution_retention_period=Duration(
                        seconds=int(retention.total_seconds())
                    ),
                    description="SCO region control plane",
                )
            )
            report.namespace_created = True
        except RPCError as reg_exc:  # another bootstrap won the race
            if reg_exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
    if report.namespace_created:
        await _wait_until_usable(client, namespace)
    report.attributes_added = await ensure_search_attributes(client, namespace)
    return report


async def _wait_until_usable(client: Client, namespace: str, seconds: float = 30.0) -> None:
    """A registered namespace reaches every server component a moment later."""
    for _ in range(int(seconds / 0.2)):
        try:
            await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=namespace)
            )
            return
        except RPCError as exc:
            if exc.status == RPCStatusCode.UNIMPLEMENTED:
                return
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(0.2)


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register our search attributes that are missing; return the ones added."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        existing = set(listed.custom_attributes)
    except RPCError as exc:
        # Temporal's time-skipping test server cannot list, but can add.
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        existing = set()
    wanted = {
        key.name: IndexedValueType.ValueType(int(_indexed(key.indexed_value_type)))
        for key in search_attributes.ALL
        if key.name not in existing
    }
    if wanted:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
            )
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
            return []
    return sorted(wanted)


def _indexed(value_type: SearchAttributeIndexedValueType) -> int:
    return int(value_type.value)
