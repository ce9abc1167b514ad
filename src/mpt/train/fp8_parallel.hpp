// Chapter 07 — FP8 training under data parallelism: every rank's delayed
// scaling state kept equal by reducing the step's amaxes across the ranks.
// Depends on: the fp8 tier (Fp8Training's pending amaxes), the dist tier
// (Communicator's all-reduce). The fp8 tier knows no communicator; this is
// where the two meet.
//
// Transformer Engine (NVIDIA/TransformerEngine) at commit
// d0067d0da6cb01811b8072a7d304f0e00344ce2b:
//  - transformer_engine/common/recipe/__init__.py: DelayedScaling's
//    reduce_amax (default True): the amaxes are reduced across the
//    amax_reduction_group so that every rank keeps the same amaxes and
//    scales (False: each rank keeps its own, and every rank must checkpoint);
//  - transformer_engine/pytorch/quantization.py, FP8GlobalStateManager:
//    add_fp8_tensors_to_global_buffer collects each FP8 tensor's
//    amax_history[0] (the step's amax); reduce_and_update_fp8_tensors
//    concatenates them (torch.cat) into one buffer, all-reduces it with
//    ReduceOp.MAX (reduce_tensor_across_group_op_max) when the group has
//    more than one rank, then runs the fused update
//    (tex.fused_amax_and_scale_update_after_reduction) from it.
// TE keeps one buffer for the forward tensors, reduced after the forward
// pass, and one for the backward's; here every state updates once, after
// the backward (Fp8Training::update), so one buffer holds them all — the
// same values, since a max is taken element by element. Its order is fixed
// by the model: layers in visit() order, roles input, weight, grad_output
// (Fp8Training::pending_amaxes()). A max is exact whatever order the ranks
// combine in, so every rank gets the same bits, and every rank's update then
// gives the same history and scale.
#pragma once

namespace mpt::dist {
class Communicator;
}
namespace mpt::fp8 {
class Fp8Training;
}

namespace mpt::train {

/// Every delayed state's pending amax replaced by its max over the ranks of
/// `comm`: one all-reduce (max, f32) of Fp8Training::pending_amaxes(),
/// written back with set_pending_amaxes(). Call it on every rank after the
/// backward and before Fp8Training::update(). Collective; nothing (and no
/// collective) under current scaling or MX, which keep no state.
///
/// NaN: the communicator's max propagates a NaN, while Transformer Engine's
/// fused update takes its maxima with fmaxf, which ignores one. A pending
/// amax is never NaN (DelayedScaling::record_amax takes fmaxf into the slot,
/// as TE's cast kernels do), so here the two agree: the reduced value is
/// fmaxf over the ranks' amaxes — the amax one rank would have recorded had
/// it quantized every rank's tensors — and an infinite amax stays infinite
/// (the update then keeps the previous scale, as on one rank).
void reduce_fp8_amaxes(fp8::Fp8Training& fp8, dist::Communicator& comm);

}  // namespace mpt::train
