"""What would make a memory plan fit: the changes a refusal of :mod:`pitlab.trainer.plan` offers, in order."""

from __future__ import annotations

from pitlab.api import PitTrainingSpec

GiB = 2 ** 30


def remedies(spec: PitTrainingSpec, comp: dict[str, int], act_ckpt: bool, single: bool,
              short: int | None) -> list[str]:
    """What would make a plan fit, in the order a refusal offers them: activation checkpointing when off; then
    more GPUs and shorter sequences, the one whose components (weights, gradients and AdamW states; activations
    and logits; on the ``single``-device path also its whole-model bf16 copy and gradients) hold more bytes
    first; a LoRA adapter last (it changes what is trained). A change is left out when the components it shrinks
    hold no more than the ``short`` bytes missing (it cannot fit alone); when none is left, a larger GPU."""
    tokens = "a shorter spec.training.seqLen" + (" or a smaller microBatchSize"
                                                  if spec.training.micro_batch_size > 1 else "")
    per_token = comp["activations"] + comp["logits"]
    state = comp["parameters"] + comp["gradients"] + comp["optimizer"]
    whole_model = comp["unsharded_parameters"] + comp["gradient_buffers"] if single else 0  # FSDP2: one layer's
    options = [("spec.training.activationCheckpointing: true", 0 if act_ckpt else comp["activations"])]
    options += sorted([("more GPUs (spec.resources.nodes or gpusPerNode: FSDP2 shards weights, gradients and "
                        "AdamW states)", state + whole_model), (tokens, per_token)], key=lambda o: -o[1])
    # LoRA keeps the frozen weights sharded in bf16 (half the float32 master), no gradients or AdamW states of
    # them, and no whole-model copy
    options.append(("a LoRA adapter instead of full weights (spec.method: lora)",
                    state - comp["parameters"] // 2 + whole_model if spec.method == "full" else 0))
    out = [text for text, holds in options if holds > 0 and (short is None or holds > short)]
    if not out and short is not None:
        out = [f"a GPU with more memory: no one change to the spec saves the {short / GiB:.2f} GiB missing"]
    return out
