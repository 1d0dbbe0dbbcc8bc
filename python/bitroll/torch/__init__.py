"""bitroll.torch: the trainer's forward is the rollout's forward.

bitroll's CPU kernels as PyTorch autograd functions (bitroll.torch.ops) and Policy, an nn.Module
for the models the engine serves (llama2.c files; Hugging Face folders, MoE included, with
routing replay: HfPolicy) whose log-probabilities equal the service's bit for
bit, whatever the training batch size, packing, order or thread count. Forward passes of float32
tensors run the engine's own kernels (the compiled module bitroll_kernels_ext); float64 tensors
run the same function in plain PyTorch math (for gradcheck). Backward passes are ordinary
PyTorch math on the saved inputs (close to, not bitwise equal to, any other implementation).

Needs Debian's python3-torch (PyTorch 1.13) and the module built by CMake (pybind11-dev).
"""

from . import ops
from .ops import (attention, linear, log_softmax, rms_norm, rope, set_num_threads, num_threads,
                  swiglu)
from .policy import ModelConfig, Policy, pack, pad
from .hf_policy import HfPolicy, routes_equal
from . import moe_ops

__all__ = ["ops", "attention", "linear", "log_softmax", "rms_norm", "rope", "swiglu",
           "set_num_threads", "num_threads", "ModelConfig", "Policy", "pack", "pad",
           "HfPolicy", "routes_equal", "moe_ops"]
