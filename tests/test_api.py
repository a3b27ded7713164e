"""Resource models: the YAML a user applies, and the errors they see."""

import copy
import datetime as dt

import pytest
import yaml

from pitlab.api import SpecError, expand_uri, load_resource, parse_resource, set_condition, set_phase
from pitlab.api.status import ResourceStatus, get_condition

EXAMPLE = "examples/local-sp500-fomc.yaml"


@pytest.fixture()
def doc():
    with open(EXAMPLE) as f:
        return yaml.safe_load(f)


def test_example_loads(doc):
    r = parse_resource(doc)
    assert r.kind == "PitTraining" and r.metadata.name == "sp500-fomc-demo"
    assert r.spec.training.seq_len == 128 and r.spec.resources.gpus_per_node == 2
    ev = r.spec.evaluations[0].spec
    assert [m.name for m in ev.models] == ["base", "pit-2016", "minilm"]
    assert ev.protocol.embargo_days == 5 and ev.bootstrap.resamples == 200
    # camelCase round trip
    again = parse_resource(r.model_dump(by_alias=True, mode="json"))
    assert again == r


def test_unknown_field_names_the_path(doc):
    doc["spec"]["training"]["seqLength"] = 128
    with pytest.raises(SpecError) as e:
        parse_resource(doc, "x.yaml")
    assert str(e.value) == ("x.yaml: spec.training.seqLength: unknown field (check the spelling; fields are camelCase)"
                            "; did you mean 'seqLen'?")


@pytest.mark.parametrize("path, name, suggested", [
    (("spec",), "knowledge_cutoff", "knowledgeCutoff"),  # snake_case: its camelCase spelling
    (("spec", "training"), "learningrate", "learningRate"),
    (("spec", "evaluations", 0, "spec", "protocol"), "embargoDay", "embargoDays"),  # through a list
    (("spec",), "zzzz", None),  # nothing near: no guess
])
def test_unknown_field_suggests_the_nearest_known_one(doc, path, name, suggested):
    at = doc
    for k in path:
        at = at[k]
    at[name] = 1
    with pytest.raises(SpecError) as e:
        parse_resource(doc, "x.yaml")
    msg = str(e.value)
    assert f"{name}: unknown field" in msg
    assert msg.endswith(f"; did you mean {suggested!r}?" if suggested else "fields are camelCase)")


@pytest.mark.parametrize("path, value, message", [
    (("resources", "gpusPerNode"), "2", "spec.resources.gpusPerNode: Input should be a valid integer (got '2')"),
    (("training", "gradientSyncEveryMicrobatch"), "true",
     "spec.training.gradientSyncEveryMicrobatch: Input should be a valid boolean (got 'true')"),
    (("training", "activationCheckpointing"), "auto",
     "spec.training.activationCheckpointing: Input should be a valid boolean (got 'auto')"),
    (("resources", "nodeSelector"), {"gpu": True}, "spec.resources.nodeSelector.gpu: Input should be a valid string"),
    (("knowledgeCutoff",), "2016-13-01", "spec.knowledgeCutoff: expected a date as YYYY-MM-DD (month must be in 1..12) (got '2016-13-01')"),
])
def test_types_are_checked_as_the_api_server_does(doc, path, value, message):
    """No coercion, like the CRD schema under `kubectl apply`: a quoted "2" is not an integer."""
    target = doc["spec"]
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    with pytest.raises(SpecError) as err:
        parse_resource(doc)
    assert message in str(err.value)


@pytest.mark.parametrize("cutoff", ["2016-12-31", dt.date(2016, 12, 31)], ids=["quoted", "yaml-date"])
def test_numbers_widen_and_yaml_dates_parse_as_the_api_server_does(doc, cutoff):
    doc["spec"]["training"]["learningRate"] = 1  # an integer for a number field: valid JSON schema `number`
    doc["spec"]["knowledgeCutoff"] = cutoff  # quoted or not (YAML loads an unquoted date as a date), one date
    res = parse_resource(doc)
    assert res.spec.training.learning_rate == 1.0 and isinstance(res.spec.training.learning_rate, float)
    assert res.spec.knowledge_cutoff.isoformat() == "2016-12-31"


def test_exponent_floats_are_numbers_as_for_kubectl(doc, tmp_path):
    """``learningRate: 1e-5`` (YAML 1.1 would read a string) and a resolved spec's ``3e-05`` (``json.dumps``)."""
    from pitlab.trainer.launch import write_spec

    doc["spec"]["training"]["learningRate"] = 3e-05
    path = write_spec(parse_resource(doc), tmp_path / "resolved.json")
    assert '"learningRate": 3e-05' in path.read_text()
    assert load_resource(path).spec.training.learning_rate == 3e-05
    text = yaml.safe_dump(doc).replace("learningRate: 3.0e-05", "learningRate: 1e-5")
    assert "learningRate: 1e-5" in text
    (tmp_path / "x.yaml").write_text(text)
    assert load_resource(tmp_path / "x.yaml").spec.training.learning_rate == 1e-05


def test_wrong_type_names_the_path(doc):
    doc["spec"]["training"]["microBatchSize"] = "eight"
    with pytest.raises(SpecError, match=r"^x.yaml: spec.training.microBatchSize: Input should be a valid integer.*'eight'"):
        parse_resource(doc, "x.yaml")


def test_list_index_in_path(doc):
    doc["spec"]["evaluations"][0]["spec"]["models"][1]["knowledgeCutoff"] = "not-a-date"
    with pytest.raises(SpecError, match=r"spec.evaluations\[0\].spec.models\[1\].knowledgeCutoff"):
        parse_resource(doc)


def test_test_start_must_follow_train_end(doc):
    doc["spec"]["evaluations"][0]["spec"]["protocol"]["testStart"] = "2016-12-31"
    with pytest.raises(SpecError, match=r"spec.evaluations\[0\].spec.protocol: .*testStart \(2016-12-31\) must be after trainEnd \(2016-12-31\)"):
        parse_resource(doc)


def test_leakageeval_kind_and_errors(doc):
    ev = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": "e"},
          "spec": copy.deepcopy(doc["spec"]["evaluations"][0]["spec"])}
    assert parse_resource(ev).kind == "LeakageEval"
    ev["apiVersion"] = "pitlab.io/v1"
    with pytest.raises(SpecError, match=r"apiVersion: must be 'pitlab.io/v1alpha1'"):
        parse_resource(ev)
    ev["apiVersion"], ev["kind"] = "pitlab.io/v1alpha1", "Leakage"
    with pytest.raises(SpecError, match=r"kind: must be one of"):
        parse_resource(ev)


def test_yaml_syntax_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: YAML syntax error"):
        load_resource(bad)
    with pytest.raises(SpecError, match=r"nope.yaml: file not found"):
        load_resource(tmp_path / "nope.yaml")


def test_data_root_variable():
    assert expand_uri("${PITLAB_DATA_ROOT}/a.csv", "spec.corpus.uri", {"PITLAB_DATA_ROOT": "/d"}) == "/d/a.csv"
    with pytest.raises(SpecError, match=r"spec.corpus.uri: .*PITLAB_DATA_ROOT\}, which is not set"):
        expand_uri("${PITLAB_DATA_ROOT}/a.csv", "spec.corpus.uri", {})


def test_conditions_keep_transition_time_when_status_unchanged():
    s = ResourceStatus()
    set_condition(s, "Trained", "False", "Running", "step 1", 1, now="2026-01-01T00:00:00Z")
    set_condition(s, "Trained", "False", "Running", "step 2", 1, now="2026-01-01T00:01:00Z")
    c = get_condition(s, "Trained")
    assert c.last_transition_time == "2026-01-01T00:00:00Z" and c.message == "step 2"
    set_condition(s, "Trained", "True", "Completed", "", 1, now="2026-01-01T00:02:00Z")
    assert get_condition(s, "Trained").last_transition_time == "2026-01-01T00:02:00Z"
    set_phase(s, "Failed", "MergeFailed", "logits differ", 1, now="2026-01-01T00:03:00Z")
    assert (get_condition(s, "Stalled").status, get_condition(s, "Ready").status) == ("True", "False")
    assert get_condition(s, "Stalled").message == "logits differ" and s.phase == "Failed"


@pytest.mark.parametrize("value", [20161231, "20161231", "31/12/2016", "2016-12-31T00:00:00"])
def test_dates_must_be_iso(doc, value):
    doc["spec"]["knowledgeCutoff"] = value
    with pytest.raises(SpecError, match=r"^spec.knowledgeCutoff: expected a date as YYYY-MM-DD"):
        parse_resource(doc)


def test_unquoted_impossible_date_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(EXAMPLE).read().replace('knowledgeCutoff: "2016-12-31"', "knowledgeCutoff: 2016-13-01"))
    with pytest.raises(SpecError, match=r"bad.yaml: spec.knowledgeCutoff: expected a date as YYYY-MM-DD \(month "
                                        r"must be in 1..12\) \(got '2016-13-01'\)"):
        load_resource(bad)


def test_a_missing_data_file_names_the_nearest_file_or_the_missing_folder(tmp_path, monkeypatch):
    from pitlab.api.load import DATA_ROOT_ENV, resolve_local_path

    (tmp_path / "sp500").mkdir()
    (tmp_path / "sp500" / "ohlcv_long.csv.gz").write_bytes(b"")
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))
    with pytest.raises(SpecError) as e:
        resolve_local_path(f"${{{DATA_ROOT_ENV}}}/sp500/ohlcv_lnog.csv.gz", "spec.dataset.uri")
    assert str(e.value).endswith(f"{tmp_path / 'sp500'} holds no 'ohlcv_lnog.csv.gz'; did you mean "
                                 "'ohlcv_long.csv.gz'?)")
    with pytest.raises(SpecError) as e:
        resolve_local_path(f"${{{DATA_ROOT_ENV}}}/jpx/prices.csv", "spec.dataset.uri")
    assert str(e.value).endswith(f"{tmp_path} holds no 'jpx')")


@pytest.mark.parametrize("field, value, message", [
    ("cpu", "sixty", "spec.resources.cpu: not a Kubernetes quantity (a number with an optional suffix: 500m, 64, "
                     "256Gi, 900G; GB, MB and spaces are not suffixes) (got 'sixty')"),
    ("memory", "900GB", "spec.resources.memory: not a Kubernetes quantity"),
    ("queueName", "GPU Queue!", "spec.resources.queueName: cannot be a Kubernetes label value (the "
                                "kueue.x-k8s.io/queue-name label): at most 63 characters"),
    ("queueName", "q" * 64, "spec.resources.queueName: cannot be a Kubernetes label value"),
])
def test_resource_quantities_and_queue_names_are_checked_when_read(doc, field, value, message):
    """Refused with the spec, not by the API server after the run's first Jobs exist."""
    doc["spec"]["resources"][field] = value
    with pytest.raises(SpecError) as err:
        parse_resource(doc)
    assert message in str(err.value)


@pytest.mark.parametrize("field, value", [("cpu", "500m"), ("cpu", "64"), ("memory", "900Gi"), ("memory", "1e9"),
                                          ("memory", "512M"), ("queueName", "gpu-queue.team_a"), ("queueName", "q" * 63)])
def test_good_quantities_and_queue_names_pass(doc, field, value):
    doc["spec"]["resources"][field] = value
    assert getattr(parse_resource(doc).spec.resources, {"queueName": "queue_name"}.get(field, field)) == value


@pytest.mark.parametrize("toleration, message", [
    ({"key": "nvidia.com/gpu", "operater": "Exists"},
     "spec.resources.tolerations[0].operater: unknown field (check the spelling; fields are camelCase); did you "
     "mean 'operator'?"),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "efect": "NoSchedule"},
     "spec.resources.tolerations[0].efect: unknown field"),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "Noschedule"},
     "spec.resources.tolerations[0].effect: Input should be 'NoSchedule', 'PreferNoSchedule', 'NoExecute' or '' "
     "(got 'Noschedule')"),
    ({"key": "gpu", "operator": "Exists", "value": "yes"},
     "spec.resources.tolerations[0]: operator Exists takes no value (got value 'yes')"),
    ({"operator": "Equal", "value": "yes"}, "spec.resources.tolerations[0]: a toleration without a key needs "
                                            "operator: Exists"),
    ({"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30},
     "spec.resources.tolerations[0]: tolerationSeconds needs effect: NoExecute"),
    ({"key": "gpu type!", "operator": "Exists"}, "spec.resources.tolerations[0]: key 'gpu type!' is not a label key"),
    ({"key": "pool", "operator": "Equal", "value": "training nodes!"},
     "spec.resources.tolerations[0]: value 'training nodes!' is not a label value (at most 63 characters"),
])
def test_a_toleration_the_api_server_would_not_read_as_meant_is_refused(doc, toleration, message):
    """Found in a platform engineer's trial: `efect`/`operater` passed validate and the operator, and reached
    every pod, where the API server drops unknown fields and the pods wait on the tainted nodes."""
    doc["spec"]["resources"]["tolerations"] = [toleration]
    with pytest.raises(SpecError) as err:
        parse_resource(doc)
    assert message in str(err.value)


def test_tolerations_reach_the_pods_as_written(doc):
    from pitlab.operator import builders
    from pitlab.operator.config import OperatorConfig

    tols = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "pool", "operator": "Equal", "value": "a100", "effect": ""},
            {"operator": "Exists"}, {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                     "effect": "NoExecute", "tolerationSeconds": 300}]
    doc["spec"]["resources"]["tolerations"] = tols
    doc["metadata"].update(namespace="research", uid="u-1")
    pt = parse_resource(doc)
    job = builders.build_prepare_job(pt, OperatorConfig(), doc)
    assert job["spec"]["template"]["spec"]["tolerations"] == tols


@pytest.mark.parametrize("selector, message", [
    ({"pool": "train pool!"}, "spec.resources.nodeSelector: entry pool: 'train pool!' is not a label value"),
    ({"bad key": "x"}, "spec.resources.nodeSelector: entry bad key: 'bad key' is not a label key"),
    ({"Example.com/pool": "a"}, "'Example.com/pool' is not a label key (a label key is [prefix/]name"),
    ({"pool": "v" * 64}, "is not a label value (at most 63 characters"),
])
def test_a_node_selector_the_api_server_would_refuse_is_refused_with_the_spec(doc, selector, message):
    """Found in a platform engineer's trial: `pool: 'eval pool'` passed validate and render, and an evaluation's
    embedding Job carrying it would have been refused (422) only after training and merge."""
    doc["spec"]["resources"]["nodeSelector"] = selector
    with pytest.raises(SpecError) as err:
        parse_resource(doc)
    assert message in str(err.value)


def test_good_node_selectors_pass(doc):
    good = {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": "", "topology.kubernetes.io/zone": "us-east-1a"}
    doc["spec"]["resources"]["nodeSelector"] = good
    assert parse_resource(doc).spec.resources.node_selector == good
