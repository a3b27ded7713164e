"""Load a resource from the same YAML a user would ``kubectl apply``, with field-path errors."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Union

import yaml
from pydantic import ValidationError

from pitlab.api.base import GROUP_VERSION, SpecError
from pitlab.errors import MissingInputError
from pitlab.api.leakageeval import LeakageEval
from pitlab.api.pittraining import PitTraining
from pitlab.api.scheduling import INHERITED
from pitlab.errors import InputError

Resource = Union[PitTraining, LeakageEval]
KINDS: dict[str, type] = {"PitTraining": PitTraining, "LeakageEval": LeakageEval}
DATA_ROOT_ENV = "PITLAB_DATA_ROOT"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's exponent floats: ``1e-5`` is a number, as for ``kubectl`` (YAML 1.1
    reads it as a string), and so is the ``3e-05`` that ``json.dumps`` writes into a resolved spec."""


class DuplicateKeyError(InputError, yaml.YAMLError):
    """A YAML mapping gives one key twice (PyYAML would keep the last value silently). Exit code 2,
    ``InvalidSpec``."""


def _mapping(loader: _Loader, node: yaml.MappingNode):
    """PyYAML's safe mapping constructor, refusing a key given twice in one mapping (naming the key and both
    lines); ``<<`` merge keys may still be overridden, as YAML defines."""
    data: dict = {}
    yield data
    seen: dict[object, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: PyYAML refuses it itself
            continue
        line = key_node.start_mark.line + 1
        if first is not None:
            raise DuplicateKeyError(f"line {line}: key {key!r} given twice in one mapping (first at line {first}); "
                                    "YAML would keep the last value silently")
        seen[key] = line
    data.update(loader.construct_mapping(node))


_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)


def _timestamp(loader: _Loader, node: yaml.ScalarNode):
    """YAML's date constructor; an impossible date (``2016-02-30`` unquoted) stays the string it is written as,
    so that the schema refuses it naming its field, as it does the quoted one."""
    try:
        return yaml.SafeLoader.construct_yaml_timestamp(loader, node)
    except ValueError:
        return loader.construct_scalar(node)


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))


def _json_scalar(value: object) -> str:
    """YAML's dates and timestamps as the ISO strings the API server stores (JSON has no date type)."""
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def dump_resource(res: Resource) -> dict:
    """A resource as every stage reads it back with :func:`parse_resource`: camelCase, JSON values, every
    default filled in, no ``status``, unset (None) fields left out. An evaluation template's placement fields
    (:data:`pitlab.api.scheduling.INHERITED`) are written only where the template set them, so that the
    resource read back still inherits the training's (a filled-in ``nodeSelector: {}`` would opt out)."""
    doc = res.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"status"})
    if isinstance(res, PitTraining):
        for tpl, out in zip(res.spec.evaluations, doc["spec"].get("evaluations", [])):
            placement = tpl.spec.resources
            for name in INHERITED:
                if name not in placement.model_fields_set:
                    out["spec"].get("resources", {}).pop(type(placement).model_fields[name].alias, None)
    return doc


def parse_resource(doc: object, source: str | None = None) -> Resource:
    """Validate a parsed YAML document as a PitTraining or LeakageEval.

    Types are checked as the API server checks the CRD schema (JSON, no coercion): ``gpusPerNode: "8"`` is
    refused as it would be by ``kubectl apply``, and so is a field spelt in snake_case (``seq_len``).
    Raises :class:`SpecError` naming the field path
    (``spec.protocol.testStart``) for unknown fields, wrong types, missing fields and cross-field rules, or
    naming ``kind``/``apiVersion`` when those are wrong.
    """
    if not isinstance(doc, dict):
        raise SpecError([("", f"expected a YAML mapping (a Kubernetes resource), got {type(doc).__name__}")], source)
    kind = doc.get("kind")
    if kind not in KINDS:
        raise SpecError([("kind", f"must be one of {sorted(KINDS)} (got {kind!r})")], source)
    if doc.get("apiVersion") != GROUP_VERSION:
        raise SpecError([("apiVersion", f"must be {GROUP_VERSION!r} (got {doc.get('apiVersion')!r})")], source)
    try:  # as JSON, strictly: the API server's types (an integer field refuses "8", a string field refuses 8)
        # by alias only: `seq_len` is an unknown field, as the CRD schema (camelCase) makes it on a cluster
        return KINDS[kind].model_validate_json(json.dumps(doc, default=_json_scalar), strict=True, by_alias=True,
                                               by_name=False)
    except ValidationError as err:
        raise SpecError.from_validation_error(err, source, model=KINDS[kind]) from None


def load_resource(path: str | os.PathLike) -> Resource:
    """Read one resource from a YAML file. Raises :class:`SpecError` (file missing, YAML syntax, schema)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError([("", "file not found")], str(p))
    data = p.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise SpecError([("", f"line {line}, byte offset {err.start}: not UTF-8 ({err.reason}); a spec is UTF-8 "
                              "YAML")], str(p)) from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except DuplicateKeyError as err:
        raise SpecError([("", str(err))], str(p)) from None
    except yaml.YAMLError as err:
        where = str(err).replace('"<unicode string>"', str(p))  # PyYAML names a string it was given so
        raise SpecError([("", f"YAML syntax error: {where}")], str(p)) from None
    except ValueError as err:  # a scalar PyYAML cannot construct (dates are left to the schema: _timestamp)
        raise SpecError([("", f"invalid value in YAML ({err})")], str(p)) from None
    if len(docs) != 1:
        raise SpecError([("", f"expected exactly one YAML document, found {len(docs)}")], str(p))
    return parse_resource(docs[0], str(p))


def expand_uri(uri: str, field: str, env: dict[str, str] | None = None) -> str:
    """Expand ``${VAR}`` references in a spec URI from the environment.

    ``${PITLAB_DATA_ROOT}`` is the one configurable root of the shared data. Raises :class:`SpecError`
    naming ``field`` when a variable is unset.
    """
    env = os.environ if env is None else env

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in env or not env[name]:
            hint = (" (the folder holding the shared data sets, e.g. ../shared/data; `make demo` sets it)"
                    if name == DATA_ROOT_ENV else "")
            raise SpecError([(field, f"{uri!r} uses ${{{name}}}, which is not set{hint}")])
        return env[name]

    return _VAR.sub(sub, uri)


def _missing_file_hint(p: Path) -> str:
    """Where ``p`` is missing: the nearest name its folder holds (difflib), or the folder that is missing."""
    import difflib

    parent = next((a for a in p.parents if a.is_dir()), None)
    if parent is None:
        return f"{p.parent} does not exist"
    if parent != p.parent:
        return f"{parent} holds no {p.relative_to(parent).parts[0]!r}"
    close = difflib.get_close_matches(p.name, sorted(x.name for x in parent.iterdir()), n=1, cutoff=0.6)
    return (f"{parent} holds no {p.name!r}" + (f"; did you mean {close[0]!r}?" if close else
                                                "; a data set pitlab does not ship goes there as downloaded"))


def resolve_local_path(uri: str, field: str, must_exist: bool = True, env: dict[str, str] | None = None) -> Path:
    """Expand variables in ``uri`` and return it as a local path (a relative one as given: relative to the current
    directory); raises :class:`MissingInputError` naming ``field`` if it does not exist (when ``must_exist``; the error
    names the current directory for a relative path) or is an unsupported scheme."""
    s = expand_uri(uri, field, env)
    if s.startswith("file://"):
        s = s[len("file://"):]
    if "://" in s:
        raise SpecError([(field, f"{s!r}: give a local path" + ("" if s.startswith("s3://") else
                                                               " or s3://bucket/prefix"))])
    p = Path(s).expanduser()
    if must_exist and not p.exists():
        hint = ""
        if DATA_ROOT_ENV in uri:
            root = (env or os.environ).get(DATA_ROOT_ENV)
            if root and Path(root).expanduser().is_dir():  # the root is right; this data set is not in it
                hint = f" ({DATA_ROOT_ENV}={root!r} exists; {_missing_file_hint(p)})"
            else:
                hint = f" (is {DATA_ROOT_ENV}={root!r} the shared data folder?)"
        elif not p.is_absolute():  # a relative path is read from where the command runs, not beside the spec
            hint = f" (a relative path is read from the current directory, {Path.cwd()})"
        raise MissingInputError([(field, f"{s!r} does not exist{hint}")])
    return p


def resolve_input(uri: str, field: str, published: bool = False, must_exist: bool = True,
                  env: dict[str, str] | None = None) -> Path:
    """A local path with the content of the input ``uri``: :func:`resolve_local_path` for a local path; an
    ``s3://`` URI is downloaded once (every file verified by sha256) into the cache
    (``$PITLAB_CACHE_DIR``) and its local copy returned. ``published=True`` accepts only a directory with
    a ``_COMPLETE`` marker (models, checkpoints); data sets may also be a single object or a plain prefix.

    Raises :class:`SpecError` naming ``field`` with the storage problem (missing object or bucket, no
    credentials, unreachable endpoint, sha256 mismatch, unpublished directory).
    """
    from pitlab import storage

    s = expand_uri(uri, field, env)
    if storage.is_s3(s):
        try:
            return storage.localize(s, require_published=published)
        except storage.StorageError as err:
            raise SpecError([(field, str(err))]) from None
    return resolve_local_path(uri, field, must_exist, env)
