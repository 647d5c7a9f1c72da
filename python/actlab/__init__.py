"""actlab from Python: the activation-cache policies' codecs on NumPy arrays, training runs, one-step
memory measurements, a model's logits for given weights (forward), state dicts read from safetensors files
(read_state_dict), and (actlab.torch) a PyTorch saved-tensor hook that stores what a PyTorch model
keeps for backward through actlab's codecs. The compiled part is _actlab (python/module.cpp)."""
from ._actlab import (Error, Packed, check_policy, empty_cache, expected_bytes, forward, memory_stats, pack,
                      policy_forms, read_state_dict, step_memory, train, unpack)

__all__ = ["Error", "Packed", "check_policy", "empty_cache", "expected_bytes", "forward", "memory_stats", "pack",
           "policy_forms", "read_state_dict", "step_memory", "train", "unpack"]
