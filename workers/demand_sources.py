"""The region's scheduler demand sources, from settings (`slurm.*`, `kubernetes.*`)."""

from __future__ import annotations

import os

from activities.demand.slurm import SlurmPendingJobs, SlurmRestPendingJobs
from activities.demand.source import DemandSource
from workers.client_security import read_secret
from workers.settings import Settings


def sources_for(settings: Settings) -> list[DemandSource]:
    """Every source turned on: `slurm.pending_demand` (squeue, or slurmrestd when
    `slurm.rest_url` is set), `kubernetes.pending_demand`."""
    sources: list[DemandSource] = []
    slurm = settings.slurm
    if slurm.pending_demand and slurm.rest_url:
        sources.append(
            SlurmRestPendingJobs(
                slurm.rest_url,
                user=slurm.rest_user,
                token=(
                    read_secret(slurm.rest_token_file, "slurm.rest_token_file")
                    if slurm.rest_token_file
                    else slurm.rest_token.get_secret_value()
                ),
                api_version=slurm.rest_api_version,
                partitions=slurm.partitions,
            )
        )
    elif slurm.pending_demand:
        sources.append(
            SlurmPendingJobs(
                squeue=os.path.join(slurm.bin_dir, "squeue") if slurm.bin_dir else "squeue",
                env={"SLURM_CONF": str(slurm.slurm_conf)} if slurm.slurm_conf else None,
                partitions=slurm.partitions,
            )
        )
    if settings.kubernetes.pending_demand:
        # Imported only when used: the client is large and most regions run one scheduler.
        from activities.demand.kubernetes import KubernetesPendingPods, api_client_from_kubeconfig

        k8s = settings.kubernetes
        api = api_client_from_kubeconfig(
            str(k8s.kubeconfig) if k8s.kubeconfig else None, k8s.context
        )
        sources.append(KubernetesPendingPods(api, namespaces=k8s.namespaces or None))
    return sources
