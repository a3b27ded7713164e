"""The results summary and the small JSON documents that travel from the pods to the operator (termination
messages, progress lines): written by :mod:`pitlab.operator.workload` and ``pitlab run``, read by
:mod:`pitlab.operator.mirroring`. Standard library only.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pitlab.api.progress import estimate_record

PROGRESS_PREFIX = "PITLAB_PROGRESS "
TERMINATION_LIMIT = 4096  # bytes: the kubelet truncates longer termination messages


def _num(x: Any, digits: int = 6) -> Any:
    """Round floats to ``digits`` significant digits (keeps termination messages small); others unchanged."""
    if isinstance(x, float) and math.isfinite(x) and x != 0:
        return float(f"{x:.{digits}g}")
    if isinstance(x, list):
        return [_num(v, digits) for v in x]
    return x


def _get(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    return None


def compact_results(results: dict[str, Any]) -> dict[str, Any]:
    """The status summary of an evaluator ``results.json`` (see :mod:`pitlab.evaluator.report`).

    Input: ``models`` a list of ``{"name", "r2_off", "r2_on", "premium", "premium_ci", "verdict", ...}`` in
    spec order, ``reductions`` a list of ``{"model_a", "model_b", "reduction", "ci", "verdict"}`` (premium(a)
    − premium(b)). Output (camelCase, for ``.status.results``): ``models`` name → r2Off, r2On, premium,
    premiumCI, premiumBias, verdict (significant | not significant | unreliable) and, when unreliable, reasons,
    and the decomposition when present: marketNeutralPremium / CI / Verdict (the headline), dateOnlyPremium,
    excessPremium / CI / Verdict;
    ``reductions`` (of the raw premium) list of from, to, reduction, ci, bias, verdict, reasons, and
    ``reductionsMarketNeutral`` (of the headline premium) the same, when the results hold them. Floats keep 6
    significant digits so the summary fits a termination message.
    """
    models = {}
    for r in results.get("models") or []:
        models[r["name"]] = {k: v for k, v in {
            "r2Off": _num(r.get("r2_off")), "r2On": _num(r.get("r2_on")), "premium": _num(r.get("premium")),
            "premiumCI": _num(r.get("premium_ci")), "premiumBias": _num(r.get("premium_bias")),
            "verdict": r.get("verdict"), "reasons": r.get("verdict_reasons") or None,
            "marketNeutralPremium": _num((r.get("market_neutral") or {}).get("premium")),
            "marketNeutralCI": _num((r.get("market_neutral") or {}).get("premium_ci")),
            "marketNeutralVerdict": (r.get("market_neutral") or {}).get("verdict"),
            "dateOnlyPremium": _num(r.get("date_only_premium")),
            "excessPremium": _num((r.get("excess") or {}).get("premium")),
            "excessCI": _num((r.get("excess") or {}).get("ci")),
            "excessVerdict": (r.get("excess") or {}).get("verdict")}.items() if v is not None}
    out = {"models": models, "reductions": _compact_reductions(results.get("reductions"))}
    if results.get("reductions_market_neutral"):
        out["reductionsMarketNeutral"] = _compact_reductions(results["reductions_market_neutral"])
    return out


def _compact_reductions(reductions: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Paired reductions (``model_a``, ``model_b``, ``reduction``, ``ci``, ``bias``, ``verdict``, ``reasons``) as
    the status's from, to, reduction, ci, bias, verdict, reasons."""
    return [{k: v for k, v in {
        "from": x.get("model_a"), "to": x.get("model_b"), "reduction": _num(x.get("reduction")),
        "ci": _num(x.get("ci")), "bias": _num(x.get("bias")), "verdict": x.get("verdict"),
        "reasons": x.get("reasons") or None}.items() if v is not None}
        for x in reductions or []]


def compact_audit(audit: dict[str, Any]) -> dict[str, Any]:
    """The status fields of a ``corpus_audit.json`` (camelCase, as ``status.corpusAudit``)."""
    return {k: v for k, v in {
        "included": _get(audit, "included"),
        "excludedByDate": _get(audit, "excludedByDate", "excluded_by_date"),
        "rejectedTimestamp": _get(audit, "rejectedTimestamp", "rejected_timestamp"),
        "rejectedEmptyText": _get(audit, "rejectedEmptyText", "rejected_empty_text"),
        "maxIncludedTimestamp": _get(audit, "maxIncludedTimestamp", "max_included_timestamp"),
        "includedIdsSha256": _get(audit, "includedIdsSha256", "included_ids_sha256"),
        "timestampFormat": _get(audit, "timestampFormat", "timestamp_format"),
        "warnings": [str(w)[:300] for w in _get(audit, "warnings") or []][:4] or None,
    }.items() if v is not None}


def progress_record(metrics: dict[str, Any]) -> dict[str, Any]:
    """``status.progress`` fields of one trainer metrics record (``step``, ``total_steps``, ``loss``,
    ``mean_tokens_per_second`` as ``tokensPerSecond``: the mean speed of the run so far, not the last step's, and
    ``etaSeconds`` from the attempt's pace, :func:`pitlab.api.progress.estimate_record`)."""
    return {k: v for k, v in {
        "step": metrics.get("step"), "totalSteps": metrics.get("total_steps"),
        "loss": _num(metrics.get("loss")), "tokensPerSecond": _num(metrics.get("mean_tokens_per_second"), 4),
        "etaSeconds": estimate_record(metrics).eta_seconds,
        "kernelWarning": metrics.get("kernel_warning"),  # the Trained condition's message shows it
    }.items() if v is not None}


def parse_progress_log(text: str) -> dict[str, Any] | None:
    """The newest ``PITLAB_PROGRESS {json}`` line of a log, as ``status.progress``; None if there is none."""
    for line in reversed(text.splitlines()):
        if line.startswith(PROGRESS_PREFIX):
            try:
                doc = json.loads(line[len(PROGRESS_PREFIX):])
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("step"), int):
                return doc
    return None


def premium_summary(results: dict[str, Any]) -> str:
    """One line for ``kubectl get leakageevals``: the headline, ``model neutral +0.002 [-0.001, +0.006]; ...``
    (the market-neutral premium; the raw ``model +0.130 [+0.070, +0.260]`` for results without it), with
    ``unreliable`` after an estimate whose verdict is."""
    parts = []
    for name, r in (results.get("models") or {}).items():
        neutral = r.get("marketNeutralPremium") is not None
        p = r.get("marketNeutralPremium") if neutral else r.get("premium")
        ci = r.get("marketNeutralCI") if neutral else r.get("premiumCI")
        if p is None:
            continue
        text = f"{name}{' neutral' if neutral else ''} {p:+.3f}"
        if ci and len(ci) == 2 and None not in ci:
            text += f" [{ci[0]:+.3f}, {ci[1]:+.3f}]"
        if r.get("marketNeutralVerdict" if neutral else "verdict") == "unreliable":
            text += " unreliable"
        parts.append(text)
    return "; ".join(parts)
