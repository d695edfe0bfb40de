"""Idempotent Temporal bootstrap: a namespace per region, our search attributes in it."""

from __future__ import annotations

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
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    wanted = {
        key.name: IndexedValueType.ValueType(int(_indexed(key.indexed_value_type)))
        for key in search_attributes.ALL
        if key.name not in existing.custom_attributes
    }
    if wanted:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
        )
        report.attributes_added = sorted(wanted)
    return report


def _indexed(value_type: SearchAttributeIndexedValueType) -> int:
    return int(value_type.value)
