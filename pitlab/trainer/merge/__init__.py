"""Offline streaming merge: a DCP training checkpoint → a verified Hugging Face model directory.

A separate single process with no process group (so no collective watchdog can kill it)::

    pitlab merge --checkpoint CKPT --base BASE --out MODEL [--summary SUMMARY]
        [--max-shard-size 5GB] [--logits-probe auto|always|never] [--merge-adapter auto|yes|no] [--overwrite]

One module per job:

- ``reader``: the DCP checkpoint (which step, tensor metadata, a subset of tensors, ``train_state.json``)
- ``dcp_read``: the DCP ``StorageReader`` that reads stored chunks straight into place, several at once
- ``layout``: the output's safetensors shards (Hugging Face names, groups of at most ``max_shard_size`` bytes)
- ``full``: the full-weight merge (its read-ahead pipeline and the expert views)
- ``lora``: the LoRA merge (into the base, or an adapter folder)
- ``verify``: every written tensor compared bit for bit, parameter digests, the logits probe, memory
- ``folder``: :func:`merge_checkpoint`, local paths: written aside, reported, swapped into place
- ``publish``: :func:`merge_uris`, any path an ``s3://`` URI (inputs verified, output published ``_COMPLETE`` last)
- ``command``: ``pitlab merge``'s exit codes (its options are declared in :mod:`pitlab.cli.merge` only)

**Full-weight checkpoints.** The checkpoint's model tensors are read from the DCP files
(``torch.distributed.checkpoint`` ``FileSystemReader`` metadata, then ``dcp.load`` of a *subset* of keys into
preallocated tensors, no process group) one output shard at a time: groups of whole tensors, in natural name
order, of at most ``max_shard_size`` bytes (a tensor larger than that is a shard of its own). The reader
(``dcp_read.DirectReader``, a ``FileSystemReader``) reads each stored chunk's bytes straight into its place in
the group's buffer, several byte ranges of the shard files at once (chunks it cannot place, e.g. strided ones,
go through DCP's own path). Each group is renamed to the Hugging Face names ``save_pretrained`` would write (tied
duplicates dropped with ``transformers``' ``remove_tied_weights_from_state_dict``; fused MoE experts split back
per expert with ``revert_weight_conversion``, whose row-block outputs are taken as views of the fused tensors once
proven equal on layer 0, read for this before any buffer exists: ``full.ViewConversion``) and written as
``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json`` (``metadata.total_size`` in bytes +
``weight_map``), or as one ``model.safetensors`` when it fits one shard. When every output is such a view (or
an input unchanged), each shard's header is planned from shapes alone and the shard is streamed
(``stream_write``): its tensors are read in slices of about a quarter of the largest group (at least the largest
tensor) into three reused buffers (two when a tensor is nearly a group), each slice written while the next is
read and the one before is read back from the file and compared; host memory for tensor data is those buffers
(0.75 × the largest group) and one 4 MiB compare buffer per reading thread. Otherwise (transformers' copies)
each whole group is converted and written with ``safetensors``, from two buffers of the largest group's bytes
(``full.GroupPipeline``). Either way every written tensor is compared with the checkpoint's bytes, every file
opens in safetensors with exactly the planned names and is fsynced; no chunk is read through a temporary.

**LoRA checkpoints** (``train_state.json`` records ``lora``; the checkpoint holds only the adapter tensors):
with ``lora.mergeIntoBase`` (or ``--merge-adapter yes``) the base model's safetensors are streamed shard by
shard and every LoRA-targeted weight becomes ``W + ΔW`` (peft's ``get_delta_weight``: ``B @ A × alpha / r``,
computed in float32 and added in the base weight's dtype, as peft's ``merge(safe_merge=True)`` does);
otherwise the output is the adapter directory (``adapter_model.safetensors`` + ``adapter_config.json``
naming the base in ``base_model_name_or_path``), saved through :func:`pitlab.trainer.lora.save_adapter_verified`.

**Verification**, also bounded: every written file is read back (its names through ``safe_open``, its bytes
with ``pread``, by the reading threads, each into its own 4 MiB buffer) and each tensor compared with the
checkpoint's tensors as read, bit for bit
(dtype, shape, bytes); the index must name exactly the expected tensors; with the training summary, every
checkpoint tensor's sha256 (of the same bytes that were written) must equal its ``param_sha256``. The logits
probe (a fixed batch through the checkpoint-loaded model and through ``from_pretrained`` of the written folder)
needs whole models in memory, so ``--logits-probe auto`` runs it only when the model's bytes are at most
``max_shard_size`` (the memory the merge is allowed anyway).

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
