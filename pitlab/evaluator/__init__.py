"""Leakage evaluation: embeddings, split protocols, ridge from sufficient statistics, clustered bootstrap,
reports (DESIGN section 4.7). Entry point: :func:`run_leakage_eval`."""

from pitlab.evaluator.bootstrap import (bootstrap_bias, bootstrap_p_value, cutoff_control, draw_cluster_weights,
                                       draw_weights, judge, paired_reductions, percentile_ci, replicate_folds,
                                       replicate_row_folds, row_weights, verdict)
from pitlab.evaluator.embed import EmbeddingError, detect_kind, embed_texts, model_digest, resolve_model_uri
from pitlab.evaluator.estimates import (AlphaSelection, Fold, FoldsR2, PanelStats, center, date_folds_r2,
                                       fit_selected, group_kfold_folds, leakage_off_r2, leakage_on_r2)
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import (ChronologicalSplit, ProtocolError, PurgedKFoldSplit, WalkForwardSplit,
                                        leakage_on_splitter, security_folds, trading_calendar)
from pitlab.evaluator.ridge import (RidgeFit, RidgePath, RowStats, SuffStats, fit_ridge_at, fit_ridge_gcv, out_of_sample_errors,
                                   path_test_sse, r2_score_oos, ridge_path, solve_ridge)
from pitlab.evaluator.run import EvaluationError, run_leakage_eval

__all__ = [
    "bootstrap_p_value", "cutoff_control", "FoldsR2", "center", "date_folds_r2", "PurgedKFoldSplit",
    "WalkForwardSplit",
    "draw_cluster_weights", "paired_reductions", "percentile_ci", "replicate_folds", "verdict", "EmbeddingError",
    "detect_kind", "embed_texts", "model_digest", "resolve_model_uri", "AlphaSelection", "PanelStats",
    "fit_selected", "leakage_off_r2", "leakage_on_r2", "ChronologicalSplit", "ProtocolError", "leakage_on_splitter",
    "security_folds", "RidgeFit", "RidgePath", "SuffStats", "fit_ridge_at", "fit_ridge_gcv", "out_of_sample_errors",
    "path_test_sse", "r2_score_oos", "ridge_path", "EvaluationError", "run_leakage_eval", "Backend", "Fold",
    "group_kfold_folds", "trading_calendar", "solve_ridge", "bootstrap_bias", "draw_weights", "judge",
    "replicate_row_folds", "row_weights", "RowStats",
]
