"""GitOps-safe rollouts, on the rendered manifests: while a worker ramp runs both builds'
worker Deployments are rendered (a pruning Argo CD or Flux keeps the old one until it has
drained), the Jobs need no hand deletion (a name per build, a TTL, Argo CD hook
annotations), and deploy/README.md's steps are the ones the manifests need."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_k8s_manifests import (
    K8S,
    KUBECTL,
    REGIONS,
    Doc,
    needs_kubectl,
    of_kind,
    pod_spec,
    render,
)
from tests.support.paths import REPO


def ramp_overlay(tmp_path: Path, region: str, build: str, previous: str) -> list[Doc]:
    """The region's overlay as the runbook's step 1 leaves it: `build` current,
    `previous` still rendered through components/previous-build."""
    overlay = tmp_path / region
    shutil.copytree(K8S / "overlays" / region, overlay)
    up = Path(os.path.relpath(K8S, overlay))
    kustomization = (overlay / "kustomization.yaml").read_text()
    kustomization = kustomization.replace("../../", f"{up}/")
    kustomization = kustomization.replace(
        f"  # - {up}/components/previous-build", f"  - {up}/components/previous-build"
    )
    (overlay / "kustomization.yaml").write_text(kustomization)
    values = (overlay / "values.yaml").read_text()
    values = re.sub(r"(?m)^  build: .*$", f"  build: {build}", values)
    values = values.replace("  # previous_build: 0.1.0", f"  previous_build: {previous}")
    (overlay / "values.yaml").write_text(values)
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(overlay)], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def workers(docs: list[Doc] | tuple[Doc, ...]) -> dict[str, Doc]:
    return {
        d["metadata"]["name"]: d
        for d in of_kind(tuple(docs), "Deployment")
        if d["metadata"]["name"].startswith("sco-worker-")
    }


def build_of(doc: Doc) -> set[str]:
    """Every place a worker Deployment names its build: they must agree."""
    spec = pod_spec(doc)
    images = {c["image"].rsplit(":", 1)[1] for c in [*spec["initContainers"], *spec["containers"]]}
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    return {
        doc["metadata"]["name"].removeprefix("sco-worker-"),
        doc["spec"]["selector"]["matchLabels"]["sco.io/build-id"],
        doc["spec"]["template"]["metadata"]["labels"]["sco.io/build-id"],
        str(env["SCO_WORKER__BUILD_ID"]),
        *images,
    }


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_a_ramp_renders_both_worker_builds(region: str, tmp_path: Path) -> None:
    docs = ramp_overlay(tmp_path, region, build="0.2.0", previous="0.1.0")
    text = yaml.safe_dump_all(docs)
    assert not re.search(r"\bREGION\b|\bBUILD\b|\bPREVIOUS\b", text)
    both = workers(docs)
    assert sorted(both) == ["sco-worker-0.1.0", "sco-worker-0.2.0"]
    for build, doc in ((b, both[f"sco-worker-{b}"]) for b in ("0.1.0", "0.2.0")):
        assert build_of(doc) == {build}, doc["metadata"]["name"]
        assert pod_spec(doc)["containers"][0]["args"] == ["worker", "--region", region]
        assert doc["metadata"]["namespace"] == f"sco-{region}"
        assert doc["metadata"]["labels"]["sco.io/region"] == region
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "sco"
        # The same mounted config as the rest of the region (a hashed ConfigMap name).
        config = {v["name"]: v for v in pod_spec(doc)["volumes"]}["config"]
        assert config["configMap"]["name"].startswith("sco-config-")
    # Everything else runs the new build; the Jobs are the new build's.
    for doc in of_kind(tuple(docs), "Deployment") + of_kind(tuple(docs), "Job"):
        if doc["metadata"]["name"] in both:
            continue
        for c in pod_spec(doc)["containers"]:
            assert c["image"].endswith(":0.2.0"), doc["metadata"]["name"]
    # The old build's workers are still two-of-three protected by the one PDB.
    (pdb,) = of_kind(tuple(docs), "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "sco-worker"}
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    for doc in both.values():
        kv.validate(doc, "1.32", strict=True)


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_outside_a_ramp_one_worker_build_is_rendered(region: str) -> None:
    docs = render(region)
    values = yaml.safe_load((K8S / "overlays" / region / "values.yaml").read_text())["data"]
    assert list(workers(docs)) == [f"sco-worker-{values['build']}"]
    assert "previous_build" not in values  # commented out: the runbook's step 1 sets it


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_jobs_need_no_hand_deletion(region: str) -> None:
    docs = render(region)
    values = yaml.safe_load((K8S / "overlays" / region / "values.yaml").read_text())["data"]
    jobs = of_kind(docs, "Job")
    assert {j["metadata"]["name"] for j in jobs} == {
        f"sco-db-migrate-{values['build']}",
        f"sco-temporal-bootstrap-{values['build']}",
    }
    for job in jobs:
        assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 86400
        annotations = job["metadata"]["annotations"]
        assert annotations["argocd.argoproj.io/hook"] == "Sync"
        assert annotations["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation"


def test_readme_steps_match_what_is_rendered() -> None:
    text = (REPO / "deploy" / "README.md").read_text()
    assert "kubectl -n sco-r1 delete job" not in text
    assert "delete deployment sco-worker" not in text
    assert "../../components/previous-build" in text and "previous_build:" in text
    for region in REGIONS:
        overlay = (K8S / "overlays" / region / "kustomization.yaml").read_text()
        assert "# - ../../components/previous-build" in overlay
        assert "# previous_build:" in (K8S / "overlays" / region / "values.yaml").read_text()
    for job in ("sco-db-migrate-0.1.0", "sco-temporal-bootstrap-0.1.0"):
        assert f"--for=condition=complete job/{job}" in text
