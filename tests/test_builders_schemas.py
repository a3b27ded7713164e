"""Schema validation of every manifest pitlab emits, and its own tests.

``validate(obj)``: built-in kinds with kubernetes-validate (strict: unknown fields are errors) against the
oldest and newest Kubernetes versions pitlab supports; PyTorchJob against the Kubeflow CRD in
``../shared/k8s`` plus the rules its admission webhook enforces; TrainJob and ClusterTrainingRuntime (Kubeflow
Trainer v2.3.0) and JobSet (v0.12.0) against their vendored CRDs, CEL rules included, plus the pod and Job
templates inside them as Kubernetes validates a Job; pitlab's CRs against pitlab's generated CRDs, CEL rules
included (evaluated with the ``cel`` package). CRD schemas are made strict the way the API server's pruning is (an
unknown field would be dropped silently: here it is an error).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import cel
import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_K8S = REPO.parent / "shared" / "k8s"
KUBEFLOW_CRD = SHARED_K8S / "kubeflow-pytorchjob-crd-v1.9.4.yaml"
TRAINJOB_CRD = SHARED_K8S / "kubeflow-trainer-v2.3.0-trainjobs-crd.yaml"
RUNTIME_CRD = SHARED_K8S / "kubeflow-trainer-v2.3.0-clustertrainingruntimes-crd.yaml"
JOBSET_CRD = SHARED_K8S / "jobset-v0.12.0-crd.yaml"
K8S_VERSIONS = ("1.29.0", "1.37.0")  # native sidecars (init containers with restartPolicy) need 1.29
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _strict(node: Any) -> Any:
    """An openAPIV3Schema as JSON Schema that refuses unknown fields (what pruning would silently drop)."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k not in ("x-kubernetes-validations",)}
    if "properties" in node and "additionalProperties" not in node and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):  # OpenAPI 3.0 -> draft 7
        if node.get(key) is True:
            out[key] = out.pop(bound)
        elif node.get(key) is False:
            out.pop(key)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


@functools.cache
def crd_schema(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def pitlab_crd(kind: str) -> Path:
    return REPO / "crds" / f"pitlab.io_{ {'PitTraining': 'pittrainings', 'LeakageEval': 'leakageevals'}[kind] }.yaml"


def cel_errors(schema: dict[str, Any], obj: Any, old: Any = None, path: str = "") -> list[str]:
    """Evaluate the ``x-kubernetes-validations`` rules of ``schema`` over ``obj`` (recursively), as the API
    server does: a rule runs where its field is present; transition rules (``oldSelf``) only with ``old``."""
    errors: list[str] = []
    if obj is None:
        return errors
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"] and old is None:
            continue
        ctx = {"self": obj} if old is None else {"self": obj, "oldSelf": old}
        if not cel.evaluate(rule["rule"], ctx):
            errors.append(f"{path or '<root>'}: {rule['message']}")
    if isinstance(obj, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in obj:
                errors += cel_errors(sub, obj[k], (old or {}).get(k) if isinstance(old, dict) else None,
                                     f"{path}.{k}".lstrip("."))
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += cel_errors(schema["items"], item, None, f"{path}[{i}]")
    return errors


def _apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    if isinstance(obj, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k not in obj and "default" in sub:
                obj[k] = copy.deepcopy(sub["default"])
            if k in obj:
                obj[k] = _apply_defaults(sub, obj[k])
    if isinstance(obj, list) and "items" in schema:
        return [_apply_defaults(schema["items"], v) for v in obj]
    return obj


def validate_pitlab(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Errors of a PitTraining/LeakageEval against pitlab's CRD: structure (strict), then CEL rules on the
    defaulted object (the API server defaults before it runs the rules)."""
    schema = crd_schema(pitlab_crd(obj["kind"]))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(_strict(schema)).iter_errors(obj)]
    if errors:
        return errors
    return cel_errors(schema, _apply_defaults(schema, copy.deepcopy(obj)), old)


def validate_pytorchjob(obj: dict[str, Any]) -> list[str]:
    """Errors of a PyTorchJob against the Kubeflow CRD schema and its webhook's rules (SOURCE.txt)."""
    schema = _strict(crd_schema(KUBEFLOW_CRD))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    if not DNS1035.match(obj["metadata"]["name"]) or len(obj["metadata"]["name"]) > 63:
        errors.append("metadata.name: not a DNS-1035 label")
    for rtype, spec in obj["spec"]["pytorchReplicaSpecs"].items():
        names = [c["name"] for c in spec["template"]["spec"]["containers"]]
        if "pytorch" not in names:
            errors.append(f"{rtype}: no container named pytorch")
        # The replica template is a pod template: validate it as Kubernetes would.
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": spec["template"]}
        errors += validate_builtin(pod)
    if "Master" in obj["spec"]["pytorchReplicaSpecs"] and obj["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] != 1:
        errors.append("Master.replicas must be 1")
    if "Worker" in obj["spec"]["pytorchReplicaSpecs"] and obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] < 1:
        errors.append("Worker.replicas must be >= 1")
    return errors


def validate_against_crd(obj: dict[str, Any], crd: Path) -> list[str]:
    """Errors of a custom resource against a vendored CRD: structure (strict), then its CEL rules on the
    defaulted object."""
    schema = crd_schema(crd)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(_strict(schema)).iter_errors(obj)]
    if errors:
        return errors
    return cel_errors(schema, _apply_defaults(schema, copy.deepcopy(obj)))


def _name_rules(obj: dict[str, Any], room: int) -> list[str]:
    name = obj["metadata"]["name"]
    if not DNS1035.match(name) or len(name) > 63 - room:
        return [f"metadata.name: {name!r} is not a DNS-1035 label of at most {63 - room} characters"]
    return []


def _job_template_errors(rjob: dict[str, Any], where: str) -> list[str]:
    """A replicated job's Job template validated as a batch/v1 Job (strict), plus the Job controller's rules on a
    podFailurePolicy (restartPolicy Never, the containers it names exist)."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"}, "spec": rjob["template"]["spec"]}
    errors = [f"{where}: {e}" for e in validate_builtin(job)]
    pod = rjob["template"]["spec"]["template"]["spec"]
    names = {c["name"] for c in pod.get("containers", [])}
    rules = (rjob["template"]["spec"].get("podFailurePolicy") or {}).get("rules", [])
    if rules and pod.get("restartPolicy") != "Never":
        errors.append(f"{where}: a podFailurePolicy needs restartPolicy Never")
    for rule in rules:
        name = (rule.get("onExitCodes") or {}).get("containerName")
        if name and name not in names:
            errors.append(f"{where}: podFailurePolicy names container {name!r}, which the pod does not have")
    return errors


def validate_jobset(obj: dict[str, Any]) -> list[str]:
    """Errors of a JobSet: the CRD (CEL rules included), every replicated job's Job template as a batch/v1 Job,
    and its name short enough for the hostnames ``<name>-<rjob>-<job index>-<pod index>`` of its pods."""
    errors = validate_against_crd(obj, JOBSET_CRD)
    for rjob in obj["spec"]["replicatedJobs"]:
        completions = rjob["template"]["spec"].get("completions", 1)
        hostname = f"{obj['metadata']['name']}-{rjob['name']}-{rjob.get('replicas', 1) - 1}-{completions - 1}"
        if len(hostname) > 63:
            errors.append(f"replicatedJobs[{rjob['name']}]: pod hostname {hostname!r} is longer than 63 characters")
        errors += _job_template_errors(rjob, f"replicatedJobs[{rjob['name']}]")
    return errors + _name_rules(obj, 0)


def validate_trainjob(obj: dict[str, Any]) -> list[str]:
    """Errors of a TrainJob: the CRD (its CEL rules check the name), plus what Kubeflow Trainer's webhook refuses:
    ``PET_*`` variables in ``trainer.env`` (the torch plugin injects them) and two patches of one manager."""
    errors = validate_against_crd(obj, TRAINJOB_CRD)
    for env in (obj["spec"].get("trainer") or {}).get("env", []):
        if env["name"].startswith("PET_"):
            errors.append(f"spec.trainer.env: {env['name']} is set by the torch plugin, not by the TrainJob")
    managers = [p["manager"] for p in obj["spec"].get("runtimePatches", [])]
    if len(set(managers)) != len(managers):
        errors.append(f"spec.runtimePatches: duplicate managers {managers}")
    return errors


def validate_runtime(obj: dict[str, Any]) -> list[str]:
    """Errors of a ClusterTrainingRuntime: the CRD (CEL rules included) and its JobSet template's Job templates
    as batch/v1 Jobs."""
    errors = validate_against_crd(obj, RUNTIME_CRD)
    for rjob in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        errors += _job_template_errors(rjob, f"replicatedJobs[{rjob['name']}]")
    return errors


def validate_builtin(obj: dict[str, Any]) -> list[str]:
    """Errors of a built-in object (kubernetes-validate, strict) for each supported Kubernetes version."""
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"k8s {version}: {'.'.join(map(str, err.path))}: {err.message}")
    return errors


def validate(obj: dict[str, Any]) -> list[str]:
    """Every error of one manifest (empty: valid)."""
    if obj["apiVersion"] == "pitlab.io/v1alpha1":
        return validate_pitlab(obj)
    if obj["apiVersion"] == "kubeflow.org/v1":
        return validate_pytorchjob(obj)
    if obj["apiVersion"] == "trainer.kubeflow.org/v1alpha1":
        return {"TrainJob": validate_trainjob, "ClusterTrainingRuntime": validate_runtime}[obj["kind"]](obj)
    if obj["apiVersion"] == "jobset.x-k8s.io/v1alpha2":
        return validate_jobset(obj)
    if obj["kind"] == "CustomResourceDefinition":
        return validate_builtin(obj)
    return validate_builtin(obj)


# ---------------------------------------------------------------- tests of the validators themselves
def test_strict_validation_catches_unknown_fields() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i",
                                                                                   "comand": ["x"]}]}}}}
    assert any("comand" in e for e in validate(job))


def test_pytorchjob_webhook_rules_are_checked() -> None:
    tpl = {"spec": {"containers": [{"name": "main", "image": "i"}]}}
    bad = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "1job"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 2, "template": tpl}, "Worker": {"replicas": 0,
                                                                                               "template": tpl}}}}
    errors = validate(bad)
    assert "metadata.name: not a DNS-1035 label" in errors
    assert {"Master: no container named pytorch", "Worker: no container named pytorch",
            "Master.replicas must be 1", "Worker.replicas must be >= 1"} <= set(errors)


def test_cel_evaluation_follows_presence_and_transitions() -> None:
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.a > 0", "message": "a > 0"},
                                                             {"rule": "self == oldSelf", "message": "immutable"}],
              "properties": {"b": {"type": "object", "x-kubernetes-validations": [{"rule": "false", "message": "no b"}]}}}
    assert cel_errors(schema, {"a": 1}) == []
    assert cel_errors(schema, {"a": 0, "b": {}}) == ["<root>: a > 0", "b: no b"]
    assert cel_errors(schema, {"a": 1}, old={"a": 2}) == ["<root>: immutable"]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
