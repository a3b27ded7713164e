"""pitlab's resources (``pitlab.io/v1alpha1``): the single source of truth for specs and status."""

from pitlab.api.base import API_GROUP, API_VERSION, GROUP_VERSION, SpecError, SpecModel
from pitlab.api.leakageeval import LeakageEval, LeakageEvalSpec, ModelRef
from pitlab.api.load import (DATA_ROOT_ENV, dump_resource, expand_uri, load_resource, parse_resource,
                             resolve_input, resolve_local_path)
from pitlab.api.meta import ObjectMeta
from pitlab.api.pittraining import PitTraining, PitTrainingSpec
from pitlab.api.status import Condition, ResourceStatus, get_condition, set_condition, set_phase

__all__ = [
    "API_GROUP", "API_VERSION", "GROUP_VERSION", "SpecError", "SpecModel", "LeakageEval", "LeakageEvalSpec",
    "ModelRef", "DATA_ROOT_ENV", "dump_resource", "expand_uri", "load_resource", "parse_resource",
    "resolve_local_path", "resolve_input",
    "ObjectMeta", "PitTraining", "PitTrainingSpec", "Condition", "ResourceStatus", "get_condition",
    "set_condition", "set_phase",
]
