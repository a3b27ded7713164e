"""The Helm chart, with the real helm binary (`make install` puts it in .venv/bin): lint is clean, every
rendered object validates, the RBAC is exactly what the operator calls, the Deployment is locked down."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_builders_schemas import REPO, validate

from pitlab.operator import rbac
from pitlab.operator.config import OperatorConfig

CHART = REPO / "charts" / "pitlab"


@functools.cache
def helm() -> str:
    for cand in (REPO / ".venv" / "bin" / "helm", Path(shutil.which("helm") or "/nonexistent")):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    pytest.fail("helm not found: run `make install` (scripts/install_helm.py puts it in .venv/bin/helm)")


def render(*args: str) -> list[dict]:
    out = subprocess.run([helm(), "template", "pitlab", str(CHART), "--namespace", "pitlab-system",
                          "--include-crds", *args], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


BACKENDS = ("auto", "trainjob", "jobset", "pytorchjob")


def test_helm_lint_is_clean() -> None:
    for extra in ([], ["--set", "watchNamespaces={research,prod}"],
                  *(["--set", f"trainingBackend={b}"] for b in BACKENDS), ["--set", "trainingRuntime.install=true"]):
        out = subprocess.run([helm(), "lint", "--strict", str(CHART), *extra], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout
        assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("args", [[], ["--set", "watchNamespaces={research,prod}"],
                                  *(["--set", f"trainingBackend={b}"] for b in BACKENDS),
                                  ["--api-versions", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"]])
def test_every_rendered_object_validates(args: list[str]) -> None:
    objs = render(*args)
    assert {o["kind"] for o in objs} >= {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                                         "Deployment", "ServiceAccount"}
    for o in objs:
        assert validate(o) == [], (o["kind"], o["metadata"]["name"])
    env = _operator_env(objs)
    assert env["PITLAB_TRAINING_BACKEND"] == next((a.split("=")[1] for a in args if "trainingBackend" in a), "auto")


@pytest.mark.parametrize("args, runtimes", [
    ([], 0),  # auto, and the cluster (helm template: none) does not serve ClusterTrainingRuntimes
    (["--api-versions", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"], 1),  # helm install on Trainer v2
    (["--set", "trainingBackend=trainjob"], 1),
    (["--set", "trainingBackend=jobset"], 0),
    (["--set", "trainingBackend=trainjob", "--set", "trainingRuntime.install=false"], 0),
    (["--set", "trainingRuntime.install=true", "--set", "trainingRuntime.name=team-torch"], 1),
])
def test_the_training_runtime_is_rendered_where_trainjobs_need_it(args: list[str], runtimes: int) -> None:
    objs = render(*args)
    found = of_kind(objs, "ClusterTrainingRuntime")
    assert len(found) == runtimes
    if found:
        assert found[0]["metadata"]["name"] == _operator_env(objs)["PITLAB_TRAINING_RUNTIME"]


@pytest.mark.parametrize("value, message", [
    ("trainingBackend=trainjobs",
     'trainingBackend: must be one of auto, trainjob, jobset, pytorchjob (got "trainjobs")'),
    ("trainingRuntime.install=maybe", 'trainingRuntime.install: must be one of auto, true, false (got "maybe")'),
])
def test_bad_backend_values_are_refused_naming_the_value(value: str, message: str) -> None:
    out = subprocess.run([helm(), "template", "pitlab", str(CHART), "--set", value], capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr, out.stderr


def _operator_env(objs: list[dict]) -> dict[str, str]:
    (dep,) = of_kind(objs, "Deployment")
    return {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_chart_crds_are_the_generated_ones() -> None:
    crds = {o["metadata"]["name"]: o for o in of_kind(render(), "CustomResourceDefinition")}
    for f in (REPO / "crds").glob("*.yaml"):
        doc = yaml.safe_load(f.read_text())
        assert crds[doc["metadata"]["name"]] == doc


def _rules(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_cluster_wide_rbac_is_exactly_the_operators_calls() -> None:
    objs = render()
    (role,) = of_kind(objs, "ClusterRole")
    assert _rules(role) == rbac.triples(rbac.NAMESPACED_RULES + rbac.CLUSTER_RULES)
    assert of_kind(objs, "Role") == []
    (binding,) = of_kind(objs, "ClusterRoleBinding")
    (sa,) = of_kind(objs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "pitlab-system"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_namespaced_rbac_grants_only_the_watched_namespaces() -> None:
    objs = render("--set", "watchNamespaces={research,prod}")
    (cluster_role,) = of_kind(objs, "ClusterRole")
    assert _rules(cluster_role) == rbac.triples(rbac.CLUSTER_RULES)
    roles = of_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["prod", "research"]
    for r in roles:
        assert _rules(r) == rbac.triples(rbac.NAMESPACED_RULES)
    assert sorted(b["metadata"]["namespace"] for b in of_kind(objs, "RoleBinding")) == ["prod", "research"]
    args = of_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=research" in args and "--namespace=prod" in args and "--all-namespaces" not in args


def test_deployment_is_locked_down_and_probed() -> None:
    (dep,) = of_kind(render(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    assert c["args"] == ["run", "--standalone", "--liveness=http://0.0.0.0:8080/healthz", "--all-namespaces",
                         "-m", "pitlab.operator.main"]
    assert c["image"] == "ghcr.io/pitlab/pitlab-operator:0.1.0"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}


def test_values_reach_the_operator_config() -> None:
    (dep,) = of_kind(render("--set", "storage.pvc=team-a-data", "--set", "defaults.mergeGpus=1",
                            "--set", "workloads.trainerImage=reg.example/trainer:9"), "Deployment")
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    cfg = OperatorConfig.from_env(env)
    assert (cfg.pvc, cfg.merge_gpus, cfg.trainer_image) == ("team-a-data", 1, "reg.example/trainer:9")
    # every operator setting is set by the chart
    assert {k.removeprefix("PITLAB_").lower() for k in env} == {f for f in OperatorConfig.__dataclass_fields__}


def test_the_kernel_cache_value_reaches_the_operator_config() -> None:
    """``storage.kernelCache`` (default ``.cache/kernels`` under the mount; ``none`` turns it off)."""
    for args, want in (((), "/pitlab/.cache/kernels/triton"), (("--set", "storage.kernelCache=none"), None)):
        (dep,) = of_kind(render(*args), "Deployment")
        env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert OperatorConfig.from_env(env).kernel_cache_env().get("TRITON_CACHE_DIR") == want


@pytest.mark.parametrize("value, message", [
    ("defaults.backoffLimit=two", "at '/defaults/backoffLimit': got string, want integer"),  # the operator's int()
    ("storage.pvcc=typo", "at '/storage': additional properties 'pvcc' not allowed"),
    ("defaults.backofLimit=5", "at '/defaults': additional properties 'backofLimit' not allowed"),
    ("defaults.mergeMemory=900GB", "at '/defaults/mergeMemory': '900GB' does not match pattern"),
    ("kueue.queueName=gpu", "additional properties 'kueue' not allowed"),  # queues are per run: spec.resources
])
def test_values_schema_refuses_typos_and_wrong_types(value: str, message: str) -> None:
    """charts/pitlab/values.schema.json: a misspelt or mistyped value fails at helm template/install instead of
    being ignored or crash-looping the operator."""
    out = subprocess.run([helm(), "template", "pitlab", str(CHART), "--set", value], capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr, out.stderr


def test_every_default_value_is_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"])
    for key, sub in values.items():
        props = schema["properties"][key].get("properties")
        if isinstance(sub, dict) and props is not None:
            assert set(sub) <= set(props), key


def test_an_existing_service_account_must_be_named() -> None:
    out = subprocess.run([helm(), "template", "pitlab", str(CHART), "--set", "serviceAccount.create=false"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "serviceAccount.name: with serviceAccount.create=false, name the existing" in \
        out.stderr, out.stderr
    objs = render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops-pitlab")
    (binding,) = of_kind(objs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "ops-pitlab" and of_kind(objs, "ServiceAccount") == []


# ---------------------------------------------------------------- two releases side by side
SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def render_release(release: str, namespace: str, *args: str) -> list[dict]:
    out = subprocess.run([helm(), "template", release, str(CHART), "--namespace", namespace, *args],
                         capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _outside_release_namespace(objs: list[dict], namespace: str) -> dict[tuple[str, str | None, str], dict]:
    """The objects another release could also create: cluster-scoped ones (no namespace) and those in a namespace
    other than the release's, by (kind, namespace, name)."""
    return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objs
            if o["metadata"].get("namespace") in (None, "") or o["metadata"]["namespace"] != namespace}


def _check_own_references(objs: list[dict], namespace: str) -> None:
    """Every binding grants its own release's role to its own release's ServiceAccount; the operator names its own
    release's ClusterTrainingRuntime."""
    (sa,) = of_kind(objs, "ServiceAccount")
    (cluster_role,) = of_kind(objs, "ClusterRole")
    (cluster_binding,) = of_kind(objs, "ClusterRoleBinding")
    own_subject = [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": namespace}]
    assert cluster_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                          "name": cluster_role["metadata"]["name"]}
    assert cluster_binding["subjects"] == own_subject
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in of_kind(objs, "Role")}
    for b in of_kind(objs, "RoleBinding"):
        assert b["roleRef"]["kind"] == "Role" and (b["metadata"]["namespace"], b["roleRef"]["name"]) in roles
        assert b["subjects"] == own_subject
    (runtime,) = of_kind(objs, "ClusterTrainingRuntime")
    assert _operator_env(objs)["PITLAB_TRAINING_RUNTIME"] == runtime["metadata"]["name"]


@pytest.mark.parametrize("a, b", [
    (("pitlab", "team-a"), ("pitlab", "team-b")),            # the docs' release name, in two namespaces
    (("pitlab", "pitlab-system"), ("pitlab-canary", "pitlab-system")),  # two releases in one namespace
    (("pitlab-team", "a"), ("pitlab", "team-a")),            # "<release>-<namespace>" would be the same
    (("p" * 53, "n" * 63), ("p" * 53, "n" * 62 + "m")),       # the longest names: cut, with a hash
])
@pytest.mark.parametrize("watch", [[], ["--set", "watchNamespaces={research,prod}"]])
def test_two_releases_create_no_object_of_the_same_name(a: tuple[str, str], b: tuple[str, str],
                                                        watch: list[str]) -> None:
    """Two releases (a team's namespaced operator beside another, both watching `research`) install side by side:
    no cluster-scoped object (CRDs aside: they are shared) and no Role in a watched namespace has the same name
    in both, so neither install fails on the other's objects nor takes them over; each binding references its own
    role."""
    args = ["--set", "trainingBackend=trainjob", *watch]
    objs_a, objs_b = render_release(*a, *args), render_release(*b, *args)
    out_a, out_b = _outside_release_namespace(objs_a, a[1]), _outside_release_namespace(objs_b, b[1])
    kinds = {"ClusterRole", "ClusterRoleBinding", "ClusterTrainingRuntime"}
    kinds |= {"Role", "RoleBinding"} if watch else set()
    assert {k for k, _, _ in out_a} == {k for k, _, _ in out_b} == kinds
    assert set(out_a).isdisjoint(out_b), set(out_a) & set(out_b)
    for (kind, _, name) in (*out_a, *out_b):
        assert len(name) <= 63 and re.match(SUBDOMAIN, name), (kind, name)
    for objs, (_, namespace) in ((objs_a, a), (objs_b, b)):
        _check_own_references(objs, namespace)
        for o in objs:
            assert validate(o) == [], (o["kind"], o["metadata"]["name"])


def test_cluster_scoped_names_are_release_dot_namespace() -> None:
    objs = render("--set", "trainingBackend=trainjob", "--set", "watchNamespaces={research}")
    names = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] != "CustomResourceDefinition"
             and o["metadata"].get("namespace") in (None, "research")}
    assert names == {("ClusterRole", "pitlab.pitlab-system"), ("ClusterRoleBinding", "pitlab.pitlab-system"),
                     ("Role", "pitlab.pitlab-system"), ("RoleBinding", "pitlab.pitlab-system"),
                     ("ClusterTrainingRuntime", "pitlab-torch.pitlab-system")}
    (dep,) = of_kind(objs, "Deployment")
    assert dep["metadata"]["name"] == "pitlab"  # objects in the release's namespace keep their names
    # an explicit trainingRuntime.name is kept (a runtime brought or shared on purpose)
    objs = render("--set", "trainingRuntime.install=true", "--set", "trainingRuntime.name=team-torch")
    assert of_kind(objs, "ClusterTrainingRuntime")[0]["metadata"]["name"] == "team-torch"
    assert _operator_env(objs)["PITLAB_TRAINING_RUNTIME"] == "team-torch"
    # the operator's RBAC rules name no object, so they hold for any release's names
    assert not any("resourceNames" in rule for o in of_kind(objs, "ClusterRole") for rule in o["rules"])


def test_watch_namespaces_must_be_namespace_names() -> None:
    """Found in a review: `{!team-a}` rendered `namespace: !team-a` (a YAML tag: the manifest did not parse) and
    `{Research_NS}` rendered without a word; the schema refuses both, and a name given twice."""
    for bad in ("{!team-a}", "{Research_NS}", "{research,research}"):
        r = subprocess.run([helm(), "template", "pitlab", str(CHART), "--set", f"watchNamespaces={bad}"],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "watchNamespaces" in r.stderr, (bad, r.stderr)
    assert render("--set", "watchNamespaces={research,prod-2}")  # valid names render


def test_notes_name_the_pull_secrets_the_runtime_and_the_namespace_to_apply_in() -> None:
    r = subprocess.run([helm(), "install", "--dry-run=client", "pitlab", str(CHART), "--namespace", "team-a",
                        "--set", "imagePullSecrets[0].name=regcred", "--set", "imagePullSecrets[1].name=mirror",
                        "--set", "watchNamespaces={research,prod}"], capture_output=True, text=True, check=True)
    notes = r.stdout[r.stdout.index("NOTES:"):]
    assert '- the image pull Secret(s) "regcred", "mirror" (every workload pod names them);' in notes
    # helm install --dry-run sees no Trainer API here: the runtime is not rendered, and the notes say so
    assert ('- TrainJobs name the ClusterTrainingRuntime "pitlab-torch.team-a", which this release did\n'
            '    not install') in notes and "set trainingRuntime.install=true to install it" in notes
    assert "kubectl apply -f examples/pittraining.yaml -n research" in notes
    r = subprocess.run([helm(), "install", "--dry-run=client", "pitlab", str(CHART), "--namespace", "team-a",
                        "--set", "trainingRuntime.install=true"], capture_output=True, text=True, check=True)
    notes = r.stdout[r.stdout.index("NOTES:"):]
    assert '- TrainJobs run on the ClusterTrainingRuntime "pitlab-torch.team-a", installed by this release.' in notes
    assert "kind: ClusterTrainingRuntime" in r.stdout
    # the backend line names only what the chosen backend needs (found in a trial: jobset listed all three)
    for backend, line in (("trainjob", "the cluster must serve Kubeflow Trainer v2's TrainJob (trainingBackend: "
                                       "trainjob), installed before this\n    chart"),
                          ("jobset", "the cluster must serve JobSet (trainingBackend: jobset); a run waits "
                                     "(NoTrainingBackend) until it does;")):
        r = subprocess.run([helm(), "install", "--dry-run=client", "pitlab", str(CHART), "--namespace", "team-a",
                            "--set", f"trainingBackend={backend}"], capture_output=True, text=True, check=True)
        notes = r.stdout[r.stdout.index("NOTES:"):]
        assert line in notes and "JobSet, or the Kubeflow training operator" not in notes, backend
        assert ("ClusterTrainingRuntime" in notes) is (backend == "trainjob"), backend
