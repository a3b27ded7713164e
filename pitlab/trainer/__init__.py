"""Continued pretraining under torchrun + FSDP2, sharded checkpoints and the offline merge (docs/design.md,
"Trainer" and "Merge").

Modules, one job each (imported on demand; ``import pitlab.trainer`` loads nothing heavy):

- ``inputs``: the corpus filtered to the cutoff (read once, checked before a run) and the prepare stage's run folder
- ``tokenizer``: byte-level BPE tokenizer trained on the PIT-filtered corpus
- ``prepare``: base model directory (random init of a real architecture, or a given HF dir); token file
- ``data``: packed sequences, seeded per-epoch order, per-rank slices; token budget -> steps
- ``schedule``: learning-rate warmup and decay
- ``fsdp``: ``fully_shard`` per decoder layer and root, mixed-precision policy
- ``single_device``: world size 1 without FSDP2: float32 masters + a bf16 compute copy (bit-identical to FSDP2)
- ``fused_step``: its clipping, AdamW and bf16 cast in one pass per parameter (torch AdamW's arithmetic and state);
  under FSDP2 the clipping and AdamW over each rank's local shards
- ``loading``: meta-device build + per-rank shard reads from safetensors (about one model copy per node)
- ``checkpoint``: atomic DCP checkpoints on local disk, ``latest`` pointer, retention, bit-identical resume
- ``checkpoint_s3``: the same in object storage (builds on ``checkpoint``)
- ``checkpointer``: where a run's checkpoints go (folder or ``s3://``), its save schedule, resume
- ``knobs``: the trainer's settings of the environment (``PITLAB_COMPILE_MODE``, ``PITLAB_FUSED_STEP_SHAPES``), checked
- ``kernels``: the implementation of each block (fla's fast kernels where installed), reported; compiled layers
- ``loss``: the LM loss: fused linear cross-entropy without float32 logits (default), or the reference
- ``plan``: memory planner (per-GPU bytes by component), FLOPs per token for MFU
- ``strategies``: FSDP2, single device and layer streaming behind one protocol (build, forward-backward,
  optimizer step, memory plan, report)
- ``lora``: peft LoRA and verified adapter saves
- ``streaming``: single-GPU LoRA with the frozen decoder layers streamed from host memory
  (docs/design.md, "LoRA and layer streaming")
- ``layer_major``: layer-major streaming: each streamed layer runs for all microbatches of a step before the next
  is fetched (boundary activations on the GPU or in pinned host memory, as the streaming plan places them)
- ``plan_streaming``: the layer-streaming pre-flight plan and GPU budget (incl. the process's memory fraction)
- ``metrics``: JSON-lines progress (writer and tailer)
- ``report``: a run's metrics lines, summary, model card and parameter digests
- ``step``: one optimizer step launched without a host sync, its read, and the loop that reads each step while the
  next one runs (``run_steps``)
- ``gcpolicy``: Python's garbage collection in that loop: frozen after setup, collected after each launch
- ``train``: ``setup_run``, the loop and ``run_rank`` (one torchrun rank: ``pitlab train``)
- ``command``: the torchrun command of the train stage (one machine, or one PyTorchJob replica; every rank runs
  ``pitlab train``)
- ``torchrun``: torchrun for the cluster's pods, exiting 2 when a rank reported bad input (a podFailurePolicy reads it)
- ``launch``: runs the torchrun command, follows metrics, returns the summary
- ``merge``: DCP checkpoint -> verified Hugging Face model dir, local or ``s3://`` (``pitlab merge``); a package, one
  module per job (reader, layout, full, lora, verify, folder, publish, command)
- ``digest``, ``files``: tensor sha256; atomic file writes and the resolved-spec writer
"""
