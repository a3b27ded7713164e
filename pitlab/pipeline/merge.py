"""The merge stage: the final checkpoint merged into a Hugging Face model (``pitlab merge`` in its own process;
the merge Job on a cluster). Its report says where the model is and, locally, what the merge verified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pitlab import storage
from pitlab.api import PitTraining, ResourceStatus, layout, stages
from pitlab.api.layout import TrainingLayout
from pitlab.api.stages import Stage
from pitlab.operator import builders
from pitlab.operator.context import Ctx, job_stage
from pitlab.pipeline.base import Report, StageStep, TrainingRun


class MergeReport(Report):
    """Where the merged model is; locally also the merge's own report (``merge_report.json``: kind, tensors,
    shards, bytes, logits probe)."""

    model_uri: str
    kind: str | None = None
    tensors: int | None = None
    shards: int | None = None
    bytes: int | None = None
    logits_probe: str | None = None


def to_status(report: MergeReport, status: ResourceStatus) -> str:
    """``status.modelURI``; returns the Merged message."""
    status.model_uri = report.model_uri
    return f"model written to {status.model_uri}"


def run_merge(checkpoint: Path | str, base_dir: Path | str, out_dir: Path | str, summary: Path | None = None) -> dict:
    """Run the merge as its own process (``pitlab merge``: :func:`pitlab.trainer.merge.merge_uris`), as the merge
    Job does.

    With ``summary`` (the trainer's summary.json) the merged weights must also match its ``param_sha256``.
    ``checkpoint``, ``base_dir`` and ``out_dir`` may be ``s3://`` URIs (an S3 output is published with
    its manifest and ``_COMPLETE``). Returns ``merge_report.json``.
    """
    cmd = [sys.executable, "-m", "pitlab.cli", *stages.MERGE.entry_point[1:], "--checkpoint", str(checkpoint),
           "--base", str(base_dir), "--out", str(out_dir)] + (["--summary", str(summary)] if summary else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"merge exited with code {proc.returncode}:\n{tail}")
    return json.loads(storage.read_text(storage.join(out_dir, layout.MERGE_REPORT)))


def run(run: TrainingRun, stage: Stage) -> None:
    """The merge as its own process, verified against the trainer's summary."""
    st = run.st
    st.running(stage, "single-process merge of the DCP checkpoint")
    run.reporter.stage("merge", "DCP → Hugging Face safetensors (separate process)")
    ckpt = st.status.checkpoint_uri
    paths = TrainingLayout(run.run_dir)
    merge = run_merge(ckpt if storage.is_s3(ckpt) else Path(ckpt), run.base_dir, paths.model, summary=paths.summary)
    st.done(stage, to_status(MergeReport(model_uri=str(paths.model)), st.status))
    probe = {"equal": "probe logits equal", "close": "probe logits within tolerance"}.get(
        merge.get("logits_probe"), "every tensor compared")
    run.reporter.done("merge", f"{merge.get('kind', 'full')}: {merge.get('tensors')} tensors in "
                               f"{merge.get('shards', 1)} shard(s), {merge.get('bytes', 0) / 1e6:.1f} MB, verified "
                               f"({probe})")


def reconcile(ctx: Ctx, stage: Stage, pt: PitTraining) -> bool:
    """The merge Job; the merged model's URI goes to ``status.modelURI``."""
    if ctx.is_done(stage):
        return True
    if job_stage(ctx, stage, builders.build_merge_job(pt, ctx.cfg, ctx.body), "mergeJob") is None:
        return False
    report = MergeReport(model_uri=TrainingLayout(builders.training_run_dir(pt, ctx.cfg)).model)
    ctx.done(stage, to_status(report, ctx.status))
    return True


STEP = StageStep(stages.MERGE, MergeReport, to_status, run, reconcile)
