"""Leakage evaluation: embeddings, split protocols, ridge from sufficient statistics, clustered bootstrap,
reports (docs/design.md, "Evaluator"). Entry point: :func:`pitlab.evaluator.run.run_leakage_eval`.

Modules, one job each (imported on demand; ``import pitlab.evaluator`` loads nothing heavy):

- ``inputs``: the panel files, the sampled panel and the models, resolved once (preflight and the pods)
- ``embed``: prompt embeddings (a pooled hidden state), cached by model digest, settings and prompts
- ``protocols``: the splitters (chronological with embargo, GroupKFold by security, walk-forward, purged K-fold)
  and exchange calendars
- ``ridge``: ridge with an unpenalised intercept from sufficient statistics
- ``estimates``: penalty selection and the out-of-sample R² of every protocol for a batch of weightings
- ``linalg``: the numpy / torch (CUDA) backends of the statistics
- ``bootstrap``: clustered draws (two-way with stratified dates by default), interval rules (two-way, percentile),
  bias, paired reductions, verdicts, the cutoff control
- ``targets``: one model's statistics on one target (point estimates with grid widening, replicates, protocols)
- ``decompose``: the date-only baseline, the market-neutral target, the excess premium, the empty-check diagnostics
- ``run``: one evaluation: shared splits and draws, each model, the results document
- ``report``: results.json, report.md / report.html, plots
"""
