"""Offline streaming merge: a DCP training checkpoint → a verified Hugging Face model directory.

A separate single process with no process group (so no collective watchdog can kill it)::

    pitlab merge --checkpoint CKPT --base BASE --out MODEL [--summary SUMMARY]
        [--max-shard-size 5GB] [--logits-probe auto|always|never] [--merge-adapter auto|yes|no] [--overwrite]

One module per job:

- ``reader``: the DCP checkpoint (which step, tensor metadata, a subset of tensors, ``train_state.json``)
- ``layout``: the output's safetensors shards (Hugging Face names, groups of at most ``max_shard_size`` bytes)
- ``full``: the full-weight merge; ``lora``: the LoRA merge (into the base, or an adapter folder)
- ``verify``: every written tensor compared bit for bit, parameter digests, the logits probe, memory
- ``folder``: :func:`merge_checkpoint`, local paths: written aside, reported, swapped into place
- ``publish``: :func:`merge_uris`, any path an ``s3://`` URI (inputs verified, output published ``_COMPLETE`` last)
- ``command``: ``pitlab merge``'s exit codes (its options are declared in :mod:`pitlab.cli.merge` only)

**Full-weight checkpoints.** The checkpoint's model tensors are read from the DCP files
(``torch.distributed.checkpoint`` ``FileSystemReader`` metadata, then ``dcp.load`` of a *subset* of keys into
preallocated tensors, no process group) one output shard at a time: groups of whole tensors, in natural name
order, of at most ``max_shard_size`` bytes (a tensor larger than that is a shard of its own). Each group is
renamed to the Hugging Face names ``save_pretrained`` would write (tied duplicates dropped with
``transformers``' ``remove_tied_weights_from_state_dict``; fused MoE experts split back per expert with
``revert_weight_conversion``) and written with ``safetensors`` as ``model-0000i-of-0000n.safetensors`` plus
``model.safetensors.index.json`` (``metadata.total_size`` in bytes + ``weight_map``), or as one
``model.safetensors`` when it fits one shard. Peak host memory above the libraries is about one shard plus
one tensor (the verification reopens the written file per tensor, so its memory map holds one tensor's pages),
not the model: 69 MB for a 328 MB checkpoint with 50 MB shards (tests/test_trainer_merge.py).

**LoRA checkpoints** (``train_state.json`` records ``lora``; the checkpoint holds only the adapter tensors):
with ``lora.mergeIntoBase`` (or ``--merge-adapter yes``) the base model's safetensors are streamed shard by
shard and every LoRA-targeted weight becomes ``W + ΔW`` (peft's ``get_delta_weight``: ``B @ A × alpha / r``,
computed in float32 and added in the base weight's dtype, as peft's ``merge(safe_merge=True)`` does);
otherwise the output is the adapter directory (``adapter_model.safetensors`` + ``adapter_config.json``
naming the base in ``base_model_name_or_path``), saved through :func:`pitlab.trainer.lora.save_adapter_verified`.

**Verification**, also bounded: a second pass reloads every group from the checkpoint (and the base) and
compares each written tensor with it bit for bit (dtype, shape, values), and checks that the index names
exactly the expected tensors; with the training summary, every checkpoint tensor's sha256 must equal its
``param_sha256``. The logits probe (a fixed batch through the checkpoint-loaded model and through
``from_pretrained`` of the written folder) needs whole models in memory, so ``--logits-probe auto`` runs it
only when the model's bytes are at most ``max_shard_size`` (the memory the merge is allowed anyway).

The output appears at ``MODEL_DIR`` only after verification passed: it is written to a hidden sibling and swapped
into place (:func:`pitlab.storage.outdir.swap_in`: an older ``MODEL_DIR`` is removed only then). On any mismatch
the sibling is deleted and :class:`MergeError` is raised. The report (``merge_report.json``, also printed)
carries bytes/s and the process's peak RSS.
"""

from pitlab.trainer.merge.command import MERGE_ADAPTER, run_merge_command
from pitlab.trainer.merge.errors import MergeError, MergeInputError
from pitlab.trainer.merge.folder import merge_checkpoint
from pitlab.trainer.merge.layout import (DEFAULT_MAX_SHARD_SIZE, INDEX, REPORT, SINGLE, natural_key, parse_size,
                                         plan_groups, shard_file_names)
from pitlab.trainer.merge.publish import merge_uris, merged_files
from pitlab.trainer.merge.reader import (checkpoint_tensors, load_checkpoint_model, load_tensors, read_train_state,
                                         resolve_checkpoint)
from pitlab.trainer.merge.verify import LORA_PROBE_ATOL, LORA_PROBE_RTOL, PROBE_SEED, PROBE_SHAPE, probe_logits

__all__ = ["DEFAULT_MAX_SHARD_SIZE", "INDEX", "LORA_PROBE_ATOL", "LORA_PROBE_RTOL", "MERGE_ADAPTER", "MergeError",
           "MergeInputError", "PROBE_SEED", "PROBE_SHAPE", "REPORT", "SINGLE", "checkpoint_tensors",
           "load_checkpoint_model", "load_tensors", "merge_checkpoint", "merge_uris", "merged_files", "natural_key",
           "parse_size", "plan_groups", "probe_logits", "read_train_state", "resolve_checkpoint", "run_merge_command",
           "shard_file_names"]
