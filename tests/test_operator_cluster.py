"""On a real cluster (kind or any kubeconfig): skipped unless ``PITLAB_E2E_KUBECONFIG`` names a kubeconfig.

    PITLAB_E2E_KUBECONFIG=~/.kube/config .venv/bin/python -m pytest tests/test_operator_cluster.py

It installs pitlab's CRDs, checks that the API server accepts every manifest the builders emit (server-side
dry run: schemas, CEL rules, and the TrainJob, JobSet and PyTorchJob CRDs and webhooks of the training
backends the cluster serves), that
it refuses what the CEL rules forbid, then runs the operator in process against the cluster and follows a
PitTraining to its prepare Job. Everything is created in a fresh namespace that is deleted afterwards.
"""

from __future__ import annotations

import copy
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

KUBECONFIG = os.environ.get("PITLAB_E2E_KUBECONFIG")
pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="set PITLAB_E2E_KUBECONFIG to run on a real cluster")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def api():
    import kubernetes

    client = kubernetes.config.new_client_from_config(config_file=os.path.expanduser(KUBECONFIG))
    ext = kubernetes.client.ApiextensionsV1Api(client)
    for f in sorted((REPO / "crds").glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        try:
            ext.create_custom_resource_definition(doc)
        except kubernetes.client.ApiException as err:
            if err.status != 409:
                raise
            existing = ext.read_custom_resource_definition(doc["metadata"]["name"])
            doc["metadata"]["resourceVersion"] = existing.metadata.resource_version
            ext.replace_custom_resource_definition(doc["metadata"]["name"], doc)
    time.sleep(2)  # CRDs become Established
    ns = f"pitlab-e2e-{uuid.uuid4().hex[:6]}"
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": ns}})
    yield client, ns
    core.delete_namespace(ns)


def _example(ns: str) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "pittraining.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    return doc


def test_server_accepts_every_built_manifest(api) -> None:
    import kubernetes

    from pitlab.api import parse_resource
    from pitlab.operator import backends, builders, naming
    from pitlab.operator.config import OperatorConfig
    from pitlab.operator.kube import Kube

    client, ns = api
    body = _example(ns)
    custom = kubernetes.client.CustomObjectsApi(client)
    created = custom.create_namespaced_custom_object("pitlab.io", "v1alpha1", ns, "pittrainings", body)
    pit = parse_resource(copy.deepcopy(body))
    cfg = OperatorConfig()
    manifests = [builders.build_training_configmap(pit, created), builders.build_prepare_job(pit, cfg, created),
                 builders.build_merge_job(pit, cfg, created), builders.build_evaluation(pit, pit.spec.evaluations[0],
                                                                                        created)]
    kube = Kube(client)
    for backend in backends.AUTO_ORDER:  # each training kind the cluster serves (a TrainJob: with the chart's runtime)
        if kube.serves(backend.resource):
            manifests.append(backend.build(pit, cfg, created))
    for m in manifests:
        kind = m["kind"]
        if kind == "ConfigMap":
            kube.core.create_namespaced_config_map(ns, m, dry_run="All")
        elif kind == "Job":
            kube.batch.create_namespaced_job(ns, m, dry_run="All")
        else:
            group, version, plural = naming.RESOURCE_OF_KIND[kind].split("/")
            custom.create_namespaced_custom_object(group, version, ns, plural, m, dry_run="All")


def test_server_enforces_the_cel_rules(api) -> None:
    import kubernetes

    client, ns = api
    body = _example(ns)
    body["metadata"]["name"] = "bad-protocol"
    body["spec"]["evaluations"][0]["spec"]["protocol"]["testStart"] = "2020-06-30"
    custom = kubernetes.client.CustomObjectsApi(client)
    with pytest.raises(kubernetes.client.ApiException) as err:
        custom.create_namespaced_custom_object("pitlab.io", "v1alpha1", ns, "pittrainings", body, dry_run="All")
    assert err.value.status == 422 and "testStart must be after trainEnd" in err.value.body


def test_operator_starts_a_run_on_the_cluster(api) -> None:
    import asyncio

    import kopf
    import kubernetes

    from pitlab.operator import handlers
    from pitlab.operator.config import OperatorConfig
    from pitlab.operator.kube import Kube

    client, ns = api
    registry = kopf.OperatorRegistry()
    # a named backend starts without asking the cluster (which may serve none: auto would wait for one)
    cfg = OperatorConfig(reconcile_interval=1.0, training_backend="jobset")
    handlers.register(registry, cfg)
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    stop = threading.Event()

    @kopf.on.login(registry=registry)
    def login(**kwargs):
        kubernetes.config.load_kube_config(config_file=os.path.expanduser(KUBECONFIG))
        return kopf.login_via_client(**kwargs)

    memo = kopf.Memo(kube=Kube(client), config=cfg)
    thread = threading.Thread(target=lambda: asyncio.run(kopf.operator(
        registry=registry, settings=settings, namespaces=[ns], standalone=True, memo=memo, stop_flag=stop)))
    thread.start()
    try:
        body = _example(ns)
        body["metadata"]["name"] = "run"
        custom = kubernetes.client.CustomObjectsApi(client)
        custom.create_namespaced_custom_object("pitlab.io", "v1alpha1", ns, "pittrainings", body)
        deadline = time.monotonic() + 60
        obj = {}
        while time.monotonic() < deadline:
            obj = custom.get_namespaced_custom_object("pitlab.io", "v1alpha1", ns, "pittrainings", "run")
            if (obj.get("status") or {}).get("phase") == "Preparing":
                break
            time.sleep(1)
        assert obj["status"]["phase"] == "Preparing", obj.get("status")
        job = kubernetes.client.BatchV1Api(client).read_namespaced_job("run-prepare", ns)
        assert job.metadata.owner_references[0].uid == obj["metadata"]["uid"]
    finally:
        stop.set()
        thread.join(60)
