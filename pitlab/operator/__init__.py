"""pitlab's Kubernetes operator (kopf): PitTraining and LeakageEval reconciled into a prepare Job, a training child
(a Kubeflow Trainer v2 TrainJob, a JobSet or a Kubeflow PyTorchJob), a merge Job and evaluation Jobs, with
Kubernetes-style status.

Modules: ``naming`` (child names, labels), ``config`` (operator settings), ``builders`` (pure manifests),
``jobset_builders`` (the TrainJob and JobSet manifests), ``backends`` (which one runs the training),
``mirroring`` (child state), ``conditions`` (status conditions), ``validation`` (operator-side checks),
``context`` (one reconciliation: plan, children, status recorder), ``lifecycle`` (the state machines, walking the
stage modules of :mod:`pitlab.pipeline`), ``kube`` (API calls), ``rbac`` (the permissions those calls need),
``handlers`` (kopf), ``main`` (the process), ``workload`` and ``summary`` (run inside the pods).
Importing this package imports nothing heavy: the pods' helpers need only the standard library.
"""
