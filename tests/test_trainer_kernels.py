"""The kernel report, the reference-kernel warning and the fused linear cross-entropy against the reference loss.

Tolerances: the softmax is computed in float32 whatever the input dtype (as the reference's ``.float()`` does),
so against a float64 truth the loss and gradients agree to 1e-6 relative (float32 rounding over a 1,000-entry
vocabulary, a few ulps, chunked or not); bf16 logits carry about
3 significant digits, so there the fused loss is held to the reference's own bf16 error against a float64 truth
(within a factor 1.5 of it, and below 1e-2 relative): the fast path may not be less exact than the path it
replaces. The GPU checks (fla kernels, compiled blocks) are recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from pitlab.trainer.kernels import BLOCKS, REFERENCE, reference_kernel_warning, select_kernels
from pitlab.trainer.loss import IGNORE_INDEX, chunked_linear_cross_entropy, install_loss
from pitlab.trainer.prepare import build_config

TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def loss_and_grads(fn, h0, w0, y, dtype):
    h = h0.detach().to(dtype).requires_grad_()
    w = w0.detach().to(dtype).requires_grad_()
    loss = fn(h, w, y)
    (2.5 * loss).backward()  # a non-unit incoming gradient: backward must scale the stored gradients
    return loss.detach(), h.grad, w.grad


def reference(h, w, y):
    return F.cross_entropy((h @ w.t()).float(), y, ignore_index=IGNORE_INDEX)


@pytest.fixture()
def problem():
    g = torch.Generator().manual_seed(11)
    h = torch.randn(300, 48, generator=g, dtype=torch.float64)
    w = torch.randn(1000, 48, generator=g, dtype=torch.float64) * 0.3
    y = torch.randint(0, 1000, (300,), generator=g)
    y[[3, 77, 150]] = IGNORE_INDEX  # ignored rows are left out of the mean
    return h, w, y


@pytest.mark.parametrize("chunk", [64, 299, 300, 4096])
def test_fused_loss_equals_the_reference_for_any_chunk(problem, chunk):
    h, w, y = problem
    want = loss_and_grads(lambda a, b, t: F.cross_entropy(a @ b.t(), t), h, w, y, torch.float64)  # float64 truth
    got = loss_and_grads(lambda a, b, t: chunked_linear_cross_entropy(a, b, t, chunk), h, w, y, torch.float64)
    assert abs(float(got[0]) - float(want[0])) < 1e-5
    assert rel(got[1], want[1]) < 1e-6 and rel(got[2], want[2]) < 1e-6
    ref = loss_and_grads(reference, h, w, y, torch.float64)  # the reference's own float32 softmax, same error
    assert rel(ref[1], want[1]) > 1e-9 and rel(got[1], ref[1]) < 1e-6
    assert float(want[0]) == pytest.approx(8.9502, abs=1e-4)  # a real loss of this seeded problem


def test_fused_loss_matches_in_float32_and_bf16(problem):
    h, w, y = problem
    truth = loss_and_grads(reference, h, w, y, torch.float64)
    f32 = loss_and_grads(lambda a, b, t: chunked_linear_cross_entropy(a, b, t, 128), h, w, y, torch.float32)
    assert abs(float(f32[0]) - float(truth[0])) / float(truth[0]) < 1e-6
    assert rel(f32[1], truth[1]) < 1e-6 and rel(f32[2], truth[2]) < 1e-6
    fused = loss_and_grads(lambda a, b, t: chunked_linear_cross_entropy(a, b, t, 128), h, w, y, torch.bfloat16)
    ref = loss_and_grads(reference, h, w, y, torch.bfloat16)
    for i in (1, 2):
        assert rel(fused[i], truth[i]) < 1e-2
        assert rel(fused[i], truth[i]) < 1.5 * rel(ref[i], truth[i])
    assert abs(float(fused[0]) - float(truth[0])) < 1.5 * abs(float(ref[0]) - float(truth[0])) + 1e-3
    assert fused[1].dtype == torch.bfloat16 and fused[2].dtype == torch.bfloat16


def test_fused_loss_refuses_mismatched_shapes(problem):
    h, w, y = problem
    with pytest.raises(ValueError, match=r"hidden \(300, 48\), weight \(1000, 47\)"):
        chunked_linear_cross_entropy(h, w[:, :47], y)
    with pytest.raises(ValueError, match="chunk: must be >= 1"):
        chunked_linear_cross_entropy(h, w, y, 0)


def tiny_model(model_type: str = "qwen3_5_moe_text"):
    cfg = TINY if model_type == "qwen3_5_moe_text" else dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, intermediate_size=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_config(model_type, cfg, vocab_size=512), dtype=torch.float32)
    model.config.use_cache = False
    return model


def test_install_loss_on_a_model_reference_is_the_old_trainer_loss_and_fused_matches_it():
    """``reference`` is bit-identical to the trainer's earlier loss (so resumes stay bit-exact); ``chunked``
    gives the same loss and parameter gradients to float32 rounding."""
    ids = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(3))
    x, y = ids[:, :-1], ids[:, 1:]
    model = tiny_model()
    old = F.cross_entropy(model(input_ids=x).logits.flatten(0, 1).float(), y.flatten())
    old.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    assert install_loss(model, "reference").startswith("reference")
    ref = model(input_ids=x, labels=y).loss
    assert torch.equal(ref, old)
    assert install_loss(model, "chunked").startswith("fused linear cross-entropy")
    out = model(input_ids=x, labels=y)
    assert out.logits is None and abs(float(out.loss) - float(old)) < 1e-5
    out.loss.backward()
    names = [n for n, _ in model.named_parameters()]
    got = {n: p.grad for n, p in model.named_parameters()}
    whole = rel(torch.cat([got[n].flatten() for n in names]), torch.cat([want[n].flatten() for n in names]))
    # all gradients together: float32 rounding of another summation order in the head; single parameters whose
    # gradient is a near-cancelling sum (dt_bias, A_log: norms about 1e-7) differ by up to 1e-3 relative
    assert whole < 1e-5
    assert rel(got["lm_head.weight"], want["lm_head.weight"]) < 1e-5
    with pytest.raises(ValueError, match="spec.training.loss: must be one of chunked, reference"):
        install_loss(model, "liger")


def test_kernel_report_on_cpu_names_every_block_and_the_gpu_warning():
    report = select_kernels(tiny_model(), torch.device("cpu"), "L")
    assert list(report) == list(BLOCKS)
    assert report["attention"] == "sdpa" and report["experts"] == "grouped_mm" and report["loss"] == "L"
    assert report["gated_delta_rule"] == f"{REFERENCE} (transformers torch_chunk_gated_delta_rule)"
    assert report["short_convolution"] == f"{REFERENCE} (transformers causal_conv1d_fn)"
    assert reference_kernel_warning(report, torch.device("cpu")) is None  # CPU ranks: expected, no warning
    warning = reference_kernel_warning(report, torch.device("cuda"))
    assert warning.startswith("reference PyTorch kernels on a GPU for gated_delta_rule and short_convolution")
    assert "pitlab[gpu]" in warning
    fast = dict(report, gated_delta_rule="fla 0.6.0 chunk_gated_delta_rule",
                short_convolution="fla 0.6.0 causal_conv1d (Triton)")
    assert reference_kernel_warning(fast, torch.device("cuda")) is None
    dense = select_kernels(tiny_model("qwen3_moe"), torch.device("cpu"), "L")
    assert dense["gated_delta_rule"] == dense["short_convolution"] == "not used"
    assert reference_kernel_warning(dense, torch.device("cuda")) is None


def test_compiled_layers_reach_fla_through_pitlabs_binding(monkeypatch):
    """torch < 2.14 answers ``torch.compiler.is_exporting()`` with True inside torch.compile (pytorch#176347),
    and transformers' kernel wrapper then calls its reference loop instead of fla: on the device (torch 2.11)
    the compiled layers ran 6,192 float32 matmuls per step of the reference while the report said fla.
    Here that torch is simulated (transformers' exporting check answers as ``is_compiling``), fla is stood in for by the reference
    itself under an ``fla`` module name (counting its calls), and ``select_kernels`` for a CUDA device must bind
    it so that compiled layers call it once per linear-attention layer and compute the same loss."""
    import importlib
    import sys
    import types

    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    from pitlab.trainer.kernels import KERNEL_CALLS, _reference_of, compile_blocks

    qm = importlib.import_module("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    reference = _reference_of(qm.torch_chunk_gated_delta_rule)
    calls = []

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        calls.append(q.shape)
        return reference(q, k, v, g=g, beta=beta, initial_state=initial_state,
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    fake = types.ModuleType("fla_standin")
    fake.chunk_gated_delta_rule = chunk_gated_delta_rule
    chunk_gated_delta_rule.__module__ = "fla.ops.gated_delta_rule.chunk"
    monkeypatch.setitem(sys.modules, "fla_standin", fake)
    wrapper = use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fla_standin")(reference)
    monkeypatch.setattr(qm, "torch_chunk_gated_delta_rule", wrapper)
    import transformers.integrations.hub_kernels as hub_kernels
    monkeypatch.setattr(hub_kernels, "is_torchdynamo_exporting", torch.compiler.is_compiling)  # torch < 2.14
    torch._dynamo.reset()

    def compiled_loss(bind: bool) -> tuple[float, int]:
        model = tiny_model().to(torch.bfloat16)  # the compute dtype (grouped_mm under compile is bf16-only)
        if bind:
            report = select_kernels(model, torch.device("cuda"), "L")
            assert report["gated_delta_rule"].endswith("chunk_gated_delta_rule") and \
                report["gated_delta_rule"].startswith("fla ")
        compile_blocks(model, backend="eager")
        x = torch.randint(2, 512, (1, 32), generator=torch.Generator().manual_seed(3))
        calls.clear()
        loss = model(input_ids=x, labels=x).loss
        return float(loss), len(calls)

    n_linear = sum(t == "linear_attention" for t in tiny_model().config.layer_types)
    assert n_linear == 3
    loss_wrapped, n_wrapped = compiled_loss(bind=False)
    assert n_wrapped == 0  # the failure: transformers' wrapper takes the reference under compile
    before = KERNEL_CALLS["fla_gated_delta_rule"]
    loss_bound, n_bound = compiled_loss(bind=True)
    assert n_bound == n_linear and KERNEL_CALLS["fla_gated_delta_rule"] - before == n_linear
    assert loss_bound == loss_wrapped  # the stand-in is the reference: same values either way
    assert _reference_of(qm.torch_chunk_gated_delta_rule) is reference
    report = select_kernels(tiny_model(), torch.device("cpu"), "L")  # a CPU rank puts the reference back
    assert qm.torch_chunk_gated_delta_rule is reference and report["gated_delta_rule"].startswith(REFERENCE)
    torch._dynamo.reset()


def test_the_compile_mode_knob_is_read_named_and_checked(monkeypatch):
    """``PITLAB_COMPILE_MODE``: unset is torch's default (no ``mode`` passed, the label as before); a mode is
    passed to every layer's ``torch.compile`` and named in the label; another value is refused naming the
    variable; a new CUDA-graph generation is marked only once layers were compiled with CUDA graphs."""
    import pitlab.trainer.kernels as kern

    monkeypatch.delenv("PITLAB_COMPILE_MODE", raising=False)
    assert kern.compile_mode() is None and kern.compile_mode({"PITLAB_COMPILE_MODE": ""}) is None
    assert kern.compile_mode({"PITLAB_COMPILE_MODE": "reduce-overhead"}) == "reduce-overhead"
    with pytest.raises(ValueError, match="PITLAB_COMPILE_MODE='fast': give one of default, reduce-overhead, "
                                         "max-autotune, max-autotune-no-cudagraphs"):
        kern.compile_mode({"PITLAB_COMPILE_MODE": "fast"})
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    monkeypatch.setattr(kern, "_CUDAGRAPHS", False)
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    with torch._dynamo.config.patch(recompile_limit=8):  # compile_blocks raises it
        assert kern.compile_blocks(None, layers=layers) == "torch.compile per decoder layer (2 layers)"
        mode = "max-autotune-no-cudagraphs"
        assert kern.compile_blocks(None, layers=layers, mode=mode) == (
            f"torch.compile per decoder layer (2 layers, mode {mode})")
        kern.cudagraph_step_begin()
        assert seen == [{"backend": "inductor"}] * 2 + [{"backend": "inductor", "mode": mode}] * 2 and marks == []
        kern.compile_blocks(None, layers=layers, mode="reduce-overhead")
        kern.cudagraph_step_begin()
    assert marks == [1]


def test_closing_a_run_frees_its_cuda_graphs_once(monkeypatch):
    """``release_cuda_graphs`` resets torch's CUDA-graph trees (which own the graphs' private memory pool) and drops
    torch.compile's cached code (bound to those trees: reused, it raised "Running CUDAGraph after shutdown" on a
    GPU) once after layers were compiled with CUDA graphs, then no longer marks generations; nothing when none
    were: the cached code is kept and not compiled again."""
    import torch._dynamo
    import torch._inductor.cudagraph_trees as trees

    import pitlab.trainer.kernels as kern

    resets, marks, compiles = [], [], []
    monkeypatch.setattr(trees, "reset_cudagraph_trees", lambda: resets.append(1))
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))

    def backend(gm, example_inputs):  # counts torch.compile's compilations of the layer's code
        compiles.append(1)
        return gm.forward

    def forward(x):
        return x * 2 + 1

    torch._dynamo.reset()
    layer = torch.compile(forward, backend=backend)
    x = torch.arange(3.0)
    monkeypatch.setattr(kern, "_CUDAGRAPHS", False)
    layer(x)
    kern.release_cuda_graphs()
    assert torch.equal(layer(x), torch.tensor([1.0, 3.0, 5.0])) and resets == [] and compiles == [1]
    monkeypatch.setattr(kern, "_CUDAGRAPHS", True)
    kern.cudagraph_step_begin()
    kern.release_cuda_graphs()
    kern.release_cuda_graphs()
    kern.cudagraph_step_begin()
    assert torch.equal(layer(x), torch.tensor([1.0, 3.0, 5.0])) and compiles == [1, 1]  # compiled anew
    assert resets == [1] and marks == [1] and kern._CUDAGRAPHS is False
    torch._dynamo.reset()


def test_every_microbatch_starts_a_cuda_graph_generation_when_layers_use_cuda_graphs(monkeypatch):
    """``Strategy.forward_backward`` marks a new CUDA-graph generation before each of its 3 microbatches once the
    layers were compiled with CUDA graphs, and none otherwise; the summed loss is the microbatches' (6.0)."""
    import pitlab.trainer.kernels as kern
    from pitlab.trainer.strategies.base import Strategy

    class Tiny(Strategy):
        def loss(self, input_ids, labels):
            return (self.w * input_ids.float()).sum()

    s = Tiny()
    s.device, s.w = torch.device("cpu"), torch.nn.Parameter(torch.ones(()))
    batches = [(torch.full((1, 2), k, dtype=torch.int64), None) for k in (1, 1, 1)]
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    for graphs, expected in ((False, []), (True, [1, 1, 1])):
        monkeypatch.setattr(kern, "_CUDAGRAPHS", graphs)
        marks.clear()
        assert float(s.forward_backward(batches, 3, True)) == 6.0 and marks == expected


def test_cuda_graphs_are_chosen_only_where_they_were_measured_to_fit(monkeypatch):
    """``auto_compile_mode``: off while CUDA graphs are not verified on a GPU; once they are (``reduce-overhead``) for the
    single-device path on CUDA, without
    activation checkpointing, with the plan at most 85 % of the GPU's memory (the reduced Qwen3.5 shape's 52.8 GB
    of an H100's 85.0 GB: 62 %); torch's default otherwise, each with its reason. ``compile_run_layers`` lets
    ``PITLAB_COMPILE_MODE`` win and names the choice in the label."""
    import pitlab.trainer.kernels as kern

    cuda, cpu, h100 = torch.device("cuda"), torch.device("cpu"), 85_017_755_648
    assert kern.CUDA_GRAPHS_VERIFIED is True  # bench/cuda_graphs_check.py: bit-identical steps, H100, 2026-12-05
    monkeypatch.setattr(kern, "CUDA_GRAPHS_VERIFIED", False)
    assert kern.auto_compile_mode(True, cuda, False, 52_843_931_392, h100) == (
        None, "off until checked bit for bit on a GPU (PITLAB_COMPILE_MODE=reduce-overhead turns them on)")
    monkeypatch.setattr(kern, "CUDA_GRAPHS_VERIFIED", True)
    assert kern.auto_compile_mode(True, cuda, False, 52_843_931_392, h100) == (
        "reduce-overhead", "auto: the plan takes 62.2% of the GPU's memory")
    assert kern.auto_compile_mode(True, cuda, False, 72_265_092_300, h100)[0] == "reduce-overhead"  # 85.0 %
    assert kern.auto_compile_mode(True, cuda, False, 72_265_092_301, h100) == (
        None, "off: the plan takes 85.0% of the GPU's memory (limit 85%)")
    assert kern.auto_compile_mode(True, cuda, True, 52_843_931_392, h100) == (
        None, "off with activation checkpointing")
    assert kern.auto_compile_mode(False, cuda, False, 52_843_931_392, h100) == (None, "only on the single-device path")
    assert kern.auto_compile_mode(True, cpu, False, 52_843_931_392, h100) == (None, "CUDA only")
    assert kern.auto_compile_mode(True, cuda, False, None, h100) == (None, "no memory plan")
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw.get("mode")) or fn)
    monkeypatch.setattr(kern, "_CUDAGRAPHS", False)
    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = layers
    with torch._dynamo.config.patch(recompile_limit=8):
        monkeypatch.delenv("PITLAB_COMPILE_MODE", raising=False)
        assert kern.compile_run_layers(model, True, None, cuda, True, False, 52_843_931_392, h100) == (
            "torch.compile per decoder layer (1 layers, mode reduce-overhead); CUDA graphs: auto: the plan takes "
            "62.2% of the GPU's memory")
        assert kern.compile_run_layers(model, True, None, cuda, True, True, 52_843_931_392, h100) == (
            "torch.compile per decoder layer (1 layers); CUDA graphs: off with activation checkpointing")
        monkeypatch.setenv("PITLAB_COMPILE_MODE", "default")
        assert kern.compile_run_layers(model, True, None, cuda, True, False, 52_843_931_392, h100) == (
            "torch.compile per decoder layer (1 layers, mode default); CUDA graphs: off, as PITLAB_COMPILE_MODE says")
        monkeypatch.setenv("PITLAB_COMPILE_MODE", "reduce-overhead")
        assert kern.compile_run_layers(model, True, None, cuda, False, True, None, None).endswith(
            "(1 layers, mode reduce-overhead); CUDA graphs: on, as PITLAB_COMPILE_MODE says (not this path's default: "
            "under FSDP2 they ran 0.13 x torch's default mode on an H100, bench/RESULTS.md 2026-12-06)")  # any path
        assert kern.compile_run_layers(model, True, None, cuda, True, True, None, None).endswith(
            "CUDA graphs: on, as PITLAB_COMPILE_MODE says")  # the single-device path: nothing added
        cpu_label = kern.compile_run_layers(model, True, None, cpu, True, False, None, None)
        assert cpu_label == "off (CPU; PITLAB_COMPILE_MODE applies on CUDA only)"
        monkeypatch.delenv("PITLAB_COMPILE_MODE")
        assert kern.compile_run_layers(model, True, None, cpu, True, False, None, None) == "off (CPU)"
        assert kern.compile_run_layers(model, False, False, cuda, True, False, None, None) == "off"
        assert kern.compile_run_layers(model, False, None, cuda, True, False, None, None) == (
            "off (auto: LoRA and layer streaming are not compiled)")
    assert seen == ["reduce-overhead", None, "default", "reduce-overhead", "reduce-overhead"]


def test_check_knobs_names_each_refused_setting_and_accepts_the_rest():
    """``check_knobs``: unset, empty and every accepted value pass; a refused value of each knob is named in one
    ``SpecError`` (exit 2), which every rank raises first in ``setup_run``."""
    from pitlab.errors import SpecError
    from pitlab.trainer.knobs import COMPILE_MODES, SHAPE_MODES, check_knobs

    check_knobs({})
    check_knobs({"PITLAB_COMPILE_MODE": "", "PITLAB_FUSED_STEP_SHAPES": ""})
    for mode, shapes in zip(COMPILE_MODES, SHAPE_MODES):
        check_knobs({"PITLAB_COMPILE_MODE": mode, "PITLAB_FUSED_STEP_SHAPES": shapes})
    with pytest.raises(SpecError) as err:
        check_knobs({"PITLAB_COMPILE_MODE": "Reduce-Overhead", "PITLAB_FUSED_STEP_SHAPES": "grouped"})
    assert err.value.problems == [("environment variable PITLAB_COMPILE_MODE", "'Reduce-Overhead': give one of "
                                   "default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")]
    assert err.value.exit_code == 2


def test_deterministic_algorithms_label_and_cublas_setting(monkeypatch):
    """``deterministic_algorithms``: off leaves torch as it is; on turns torch's deterministic algorithms on and,
    for a CUDA rank, sets ``CUBLAS_WORKSPACE_CONFIG`` unless the environment already has a value (kept)."""
    import os

    import pitlab.trainer.kernels as kern

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert kern.deterministic_algorithms(False, torch.device("cuda")) == "off"
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        assert kern.deterministic_algorithms(True, torch.device("cpu")) == "torch deterministic algorithms"
        assert torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        assert kern.deterministic_algorithms(True, torch.device("cuda")) == (
            "torch deterministic algorithms (CUBLAS_WORKSPACE_CONFIG=:4096:8)")
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        assert kern.deterministic_algorithms(True, torch.device("cuda")).endswith("(CUBLAS_WORKSPACE_CONFIG=:16:8)")
    finally:
        torch.use_deterministic_algorithms(False)


def test_own_positions_skips_only_the_packed_sequence_check_of_the_models_own_positions(monkeypatch):
    """The installed loss runs the model with its own position ids (0..T-1 per row: never packed), so Hugging
    Face's packed-sequence check, a host sync, is answered without looking (None, what it returns for them);
    outside that forward, and for packed positions a caller passes, the check is Hugging Face's own."""
    from transformers import masking_utils

    from pitlab.trainer.loss import _unpacked_when_own_positions, own_positions

    packed = torch.tensor([[0, 1, 2, 0, 1, 0]])
    with own_positions(True):
        assert masking_utils.find_packed_sequence_indices(packed) is None
        with own_positions(False):
            assert masking_utils.find_packed_sequence_indices(packed).tolist() == [[0, 0, 0, 1, 1, 2]]
    assert masking_utils.find_packed_sequence_indices(packed).tolist() == [[0, 0, 0, 1, 1, 2]]
    assert masking_utils.find_packed_sequence_indices(torch.arange(6)[None]) is None
    original = masking_utils.find_packed_sequence_indices.pitlab_original
    calls = []
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices",
                        _unpacked_when_own_positions(lambda p: calls.append(p) or original(p)))
    model = tiny_model()
    install_loss(model, "chunked")
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids[:, :-1], labels=ids[:, 1:])
    assert calls == []  # the installed forward: not looked at
    model.model(input_ids=ids[:, :-1])
    assert len(calls) == 1  # a plain forward of the model: Hugging Face's check as before
