"""PyTorch adapter: the tensors a PyTorch model saves for backward go through one of actlab's
activation-cache policies, by torch.autograd.graph.saved_tensors_hooks.

    import actlab.torch
    with actlab.torch.saved_tensors(policy="division:B=8,Q=2") as stats:
        loss = criterion(model(x), y)
    loss.backward()
    print(stats.raw_bytes, stats.packed_bytes)

What is packed: every float32 CPU tensor of two or more dimensions that autograd saves, except what
actlab's own networks keep as it is:
- parameters, trainable or frozen, leaf tensors that require a gradient (weights held as plain tensors),
  and views of either (nn.Linear saves weight.t());
- per-row statistics, tensors whose last dimension is 1 (LayerNorm's mean and rstd);
- tensors that are not float32 or not on the CPU.

A ReLU output keeps its sign exactly (actlab.pack's keep_sign: a 1-bit mask beside the code; the decoded
values are 0 where the output was and positive where it was not). ReLU's backward passes gradient where its saved output is > 0,
so a code that moved a value across 0 would open or close the gradient there (actlab's own ReLU keeps
that mask exact). The mask is counted in packed_bytes.

A tensor saved twice in one block (a ReLU output that ReLU and the next convolution both save; the same
storage, shape, strides and version) is packed once and both saves share it; raw_bytes counts it once.

Stochastic rounding: pack k of a block draws from Philox(seed, k). With seed=None (the default) every
`with` block takes the next value of a process-wide counter (0, 1, 2, ...), so successive steps draw
different numbers and their rounding noise averages out, and a program that runs the same blocks in the
same order is reproducible. Pass seed=step to choose it yourself.
"""
import contextlib
import dataclasses
import itertools
import weakref

import torch

from . import _actlab

_block_seeds = itertools.count()


@dataclasses.dataclass
class SavedStats:
    """What the hooks saw in one `with` block: f32 bytes of the distinct tensors packed, bytes kept for
    them (codes and ReLU masks), how many packs, saves that shared an earlier pack, and saves kept as they are."""
    raw_bytes: int = 0
    packed_bytes: int = 0
    packs: int = 0
    shared: int = 0
    kept_as_is: int = 0
    seed: int = 0


class _Packed:
    __slots__ = ("packed", "__weakref__")

    def __init__(self, packed):
        self.packed = packed


def _is_weight(t):
    # A parameter (trainable or frozen), or a leaf that requires a gradient (weights held as plain tensors).
    return t is not None and (isinstance(t, torch.nn.Parameter) or (t.requires_grad and t.grad_fn is None))


def _kept_as_is(t):
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() < 2 or t.shape[-1] == 1:
        return True
    return _is_weight(t) or _is_weight(t._base)


def _is_relu_output(t):
    return t.grad_fn is not None and type(t.grad_fn).__name__.startswith("ReluBackward")


@contextlib.contextmanager
def saved_tensors(policy="division:B=8,Q=2", seed=None):
    stats = SavedStats(seed=next(_block_seeds) if seed is None else seed)
    # (data_ptr, shape, strides, version) -> weak references to the tensor and its _Packed: weak, so that a
    # backward run inside the block frees each pack as autograd lets it go.
    packs = {}

    def pack_hook(t):
        if _kept_as_is(t):
            stats.kept_as_is += 1
            return t
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t._version)
        earlier = packs.get(key)
        shared = earlier[1]() if earlier is not None and earlier[0]() is not None else None
        if shared is not None:  # the tensor is alive, so its storage was not reused
            stats.shared += 1
            return shared
        stats.packs += 1
        saved = _Packed(_actlab.pack(t.detach().contiguous().numpy(), policy, stats.seed, stats.packs,
                                     keep_sign=_is_relu_output(t)))
        stats.raw_bytes += t.numel() * 4
        stats.packed_bytes += saved.packed.nbytes
        packs[key] = (weakref.ref(t), weakref.ref(saved))
        return saved

    def unpack_hook(saved):
        return torch.from_numpy(_actlab.unpack(saved.packed)) if isinstance(saved, _Packed) else saved

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        yield stats
