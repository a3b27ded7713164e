"""The error taxonomy (:mod:`pitlab.errors`): every exception class of pitlab is a PitlabError on exactly one
branch, with an int exit code and a CamelCase reason; boundaries report a stray ValueError as a bug."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import pitlab
from pitlab import errors
from pitlab.errors import InputError, PitlabError, StageError

SKIPPED: set[str] = set()
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)*$")


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(pitlab.__path__, "pitlab.")
                  if m.name not in SKIPPED and not m.name.endswith("__main__"))


def exception_classes() -> dict[str, type]:
    """Every exception class defined in a pitlab module (by its defining module), keyed by dotted name."""
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


CLASSES = exception_classes()
TAXONOMY = {errors.PitlabError, errors.InputError, errors.StageError}
KEYBOARD = {"pitlab.local.Interrupted"}  # SIGINT/SIGTERM: a KeyboardInterrupt, exit 130, not an error


def test_the_walk_finds_the_classes_it_must() -> None:
    for name in ("pitlab.errors.SpecError", "pitlab.errors.StorageError", "pitlab.data.timestamps.TimestampError",
                 "pitlab.operator.context.NameConflict", "pitlab.local.RunError", "pitlab.storage.errors.NotPublished"):
        assert name in CLASSES
    assert len(CLASSES) >= 25


@pytest.mark.parametrize("name", sorted(set(CLASSES) - KEYBOARD))
def test_every_exception_class_is_a_pitlab_error_on_exactly_one_branch(name: str) -> None:
    cls = CLASSES[name]
    assert issubclass(cls, PitlabError)
    if cls in TAXONOMY:
        return
    assert issubclass(cls, InputError) != issubclass(cls, StageError), name
    assert isinstance(cls.exit_code, int) and cls.exit_code in (1, 2), name
    assert CAMEL.match(cls.reason), (name, cls.reason)
    if issubclass(cls, InputError):  # compatibility: callers and pydantic validators catch ValueError
        assert cls.exit_code == 2 and cls.reason == "InvalidSpec"
        assert issubclass(cls, ValueError) or name == "pitlab.api.load.DuplicateKeyError", name
    else:
        assert cls.exit_code == 1 and issubclass(cls, RuntimeError), name


def test_interrupted_stays_a_keyboard_interrupt() -> None:
    assert issubclass(CLASSES["pitlab.local.Interrupted"], KeyboardInterrupt)


def test_branch_and_category_values() -> None:
    """The numbers and reasons pitlab already used (cli.EXIT_CODES, api.stages)."""
    from pitlab.api import stages

    table = {errors.SpecError: (2, stages.VALIDATE.failed), errors.CorpusError: (2, "InvalidSpec"),
             errors.PanelError: (2, "InvalidSpec"), errors.ProtocolError: (2, "InvalidSpec"),
             errors.TrainingError: (1, stages.TRAIN.failed), errors.MergeError: (1, stages.MERGE.failed),
             errors.CheckpointError: (1, "TrainingFailed"), errors.WeightLoadError: (1, "TrainingFailed"),
             errors.StorageError: (1, "StorageFailed")}
    for cls, (code, reason) in table.items():
        assert (cls.exit_code, cls.reason) == (code, reason), cls
    assert issubclass(errors.SpecError, InputError) and issubclass(errors.StorageError, StageError)
    from pitlab.evaluator.embed import EmbeddingError
    from pitlab.operator.lifecycle import NameConflict
    assert (EmbeddingError.reason, NameConflict.reason) == (stages.EMBED.failed, "NameConflict")


def test_old_import_paths_name_the_same_classes() -> None:
    from pitlab import storage
    from pitlab.api import SpecError
    from pitlab.data import CorpusError, PanelError
    from pitlab.evaluator.protocols import ProtocolError
    from pitlab.trainer.checkpoint import CheckpointError
    from pitlab.trainer.launch import TrainingError
    from pitlab.trainer.loading import WeightLoadError

    assert (SpecError, CorpusError, PanelError, ProtocolError) == (
        errors.SpecError, errors.CorpusError, errors.PanelError, errors.ProtocolError)
    assert (TrainingError, CheckpointError, WeightLoadError, storage.StorageError) == (
        errors.TrainingError, errors.CheckpointError, errors.WeightLoadError, errors.StorageError)


def test_errors_module_imports_nothing_of_pitlab() -> None:
    import ast
    tree = ast.parse(inspect.getsource(errors))
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n and n.startswith("pitlab")]


# ---------------------------------------------------------------- boundaries
BODY = {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining",
        "metadata": {"name": "t", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"baseModel": {"uri": "models/base"}, "corpus": {"uri": "c.csv", "format": "csv"},
                 "knowledgeCutoff": "2020-12-31", "tokens": 100, "resources": {"nodes": 1, "gpusPerNode": 1}}}


def _reconcile_raising(err: Exception, monkeypatch) -> list[tuple[str, str, str]]:
    """The conditions ``handlers.run_plan`` writes when the reconcile logic raises ``err``."""
    import copy

    import kopf

    from pitlab.operator import handlers
    from pitlab.operator.config import OperatorConfig

    monkeypatch.setattr(kopf, "warn", lambda body, reason, message: None)

    def reconcile(body, world, cfg):
        raise err

    patch = kopf.Patch()
    handlers.run_plan("PitTraining", kopf.Body(copy.deepcopy(BODY)), kopf.Memo(kube=None, config=OperatorConfig()),
                      patch, reconcile)
    return [(c["type"], c["reason"], c["message"]) for c in patch["status"]["conditions"]]


def test_run_plan_reports_a_stray_value_error_as_a_bug_not_as_bad_input(monkeypatch, caplog) -> None:
    conds = _reconcile_raising(ValueError("bug"), monkeypatch)
    assert conds[0] == ("Validated", "ReconcileError", "ValueError: bug")
    assert "InvalidSpec" not in {reason for _, reason, _ in conds}
    assert "reconcile failed" in caplog.text and "ValueError: bug" in caplog.text  # logged with its traceback


def test_run_plan_reports_pitlab_errors_with_their_reason(monkeypatch) -> None:
    conds = _reconcile_raising(errors.SpecError([("spec.tokens", "must be > 0")]), monkeypatch)
    assert conds[0] == ("Validated", "InvalidSpec", "spec.tokens: must be > 0")
    conds = _reconcile_raising(errors.CorpusError("c.csv: row 3: no timestamp"), monkeypatch)
    assert conds[0] == ("Validated", "InvalidSpec", "CorpusError: c.csv: row 3: no timestamp")
    conds = _reconcile_raising(errors.StorageError("s3://b/p: access denied"), monkeypatch)
    assert conds[0] == ("Validated", "StorageFailed", "StorageError: s3://b/p: access denied")


def _rank(err: BaseException, monkeypatch, capsys) -> tuple[int | None, str]:
    """``run_rank``'s exit code (None when it raised) and stderr when training raises ``err``."""
    from pathlib import Path

    from pitlab.trainer import train as train_mod

    monkeypatch.setattr(train_mod.dist, "init_process_group", lambda backend: None)
    monkeypatch.setattr(train_mod.dist, "destroy_process_group", lambda: None)
    monkeypatch.setattr(train_mod.dist, "get_rank", lambda: 0)

    def train(spec_path, paths):
        raise err

    monkeypatch.setattr(train_mod, "train", train)
    try:
        rc = train_mod.run_rank.__wrapped__(Path("spec.json"), Path("run"))
    except ValueError:
        rc = None
    return rc, capsys.readouterr().err


def test_run_rank_exits_2_on_a_pitlab_error_and_lets_a_stray_value_error_propagate(monkeypatch, capsys) -> None:
    rc, err = _rank(errors.CheckpointError("checkpoint/latest names step-9, which does not exist"), monkeypatch, capsys)
    assert rc == 2 and "pitlab.trainer.train: error (rank 0): checkpoint/latest names step-9" in err
    rc, err = _rank(errors.SpecError([("spec.lora.targetModules", "none of ['qkv']")]), monkeypatch, capsys)
    assert rc == 2 and err == "pitlab.trainer.train: error (rank 0): spec.lora.targetModules: none of ['qkv']\n"
    rc, err = _rank(ValueError("bug"), monkeypatch, capsys)
    assert rc is None and "error (rank" not in err  # torch elastic's record reports it, with its traceback
