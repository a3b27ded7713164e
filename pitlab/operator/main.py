"""The operator process: ``kopf run --standalone -m pitlab.operator.main --all-namespaces`` (or
``--namespace NS`` per watched namespace). Settings come from ``PITLAB_*`` environment variables
(:class:`pitlab.operator.config.OperatorConfig`), set by the Helm chart from its values.
"""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes

from pitlab.operator.config import OperatorConfig
from pitlab.operator.handlers import configure, register
from pitlab.operator.kube import Kube

CONFIG = OperatorConfig.from_env()
register(kopf.get_default_registry(), CONFIG)


def load_kube_config() -> kubernetes.client.ApiClient:
    """An API client from the pod's service account, else from the local kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf and give the handlers their API client and settings."""
    configure(settings)
    memo.kube = Kube(load_kube_config())
    memo.config = CONFIG


@kopf.on.probe(id="config")
def probe(**_: Any) -> dict[str, str]:
    """Liveness/readiness probe payload (``/healthz``)."""
    return {"trainerImage": CONFIG.trainer_image, "pvc": CONFIG.pvc}
