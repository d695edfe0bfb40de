"""`sco temporal bootstrap` against the real dev server, as the Kubernetes bootstrap Job runs
it: the first run creates the region's namespace and search attributes, a second run (a
re-applied Job, a retried pod) changes nothing."""

from __future__ import annotations

import os
import uuid

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.testing import WorkflowEnvironment

from tests.support import services
from tests.support.paths import REPO
from workflows import search_attributes


async def sco(env: dict[str, str], *args: str) -> tuple[int, str]:
    return await services.run_sco(env, *args, cwd=REPO)


async def test_bootstrap_twice_the_second_run_is_a_no_op(
    dev_server_env: WorkflowEnvironment,
) -> None:
    prefix = f"bs-{uuid.uuid4().hex[:6]}-"
    namespace = f"{prefix}r2"
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": dev_server_env.client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": prefix,
        "SCO_TEMPORAL__RETENTION_DAYS": "3",
        "COLUMNS": "200",
    }
    code, first = await sco(env, "temporal", "bootstrap", "--region", "r2")
    assert code == 0, first
    row = next(line for line in first.splitlines() if namespace in line)
    assert "created" in row
    assert all(key.name in first for key in search_attributes.ALL)

    client = dev_server_env.client
    described = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=namespace)
    )
    retention = described.config.workflow_execution_retention_ttl.seconds
    assert retention == 3 * 86400
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    wanted = {key.name for key in search_attributes.ALL}
    assert wanted <= set(listed.custom_attributes)

    code, second = await sco(env, "temporal", "bootstrap", "--region", "r2")
    assert code == 0, second
    row = next(line for line in second.splitlines() if namespace in line)
    assert "present" in row and "none" in row and "created" not in row
    again = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    assert dict(again.custom_attributes) == dict(listed.custom_attributes)
