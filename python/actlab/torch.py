"""PyTorch adapter: every floating-point tensor a PyTorch model saves for backward goes through one of
actlab's activation-cache policies, by torch.autograd.graph.saved_tensors_hooks.

    import actlab.torch
    with actlab.torch.saved_tensors(policy="division:B=8,Q=2") as stats:
        loss = criterion(model(x), y)
    loss.backward()
    print(stats.raw_bytes, stats.packed_bytes)

Parameters (leaf tensors that require a gradient) are kept as they are, as actlab does for its own
networks; so are tensors that are not float32, not on the CPU, or have fewer than two dimensions.
A tensor saved twice (a block's input feeding two convolutions) is packed twice: PyTorch's hooks do not
say when two saves are the same storage. Each pack draws its stochastic rounding from its own Philox
stream (seed, counter), so a run is reproducible.
"""
import contextlib
import dataclasses

import torch

from . import _actlab


@dataclasses.dataclass
class SavedStats:
    """What the hooks saw in one `with` block: f32 bytes offered and bytes kept, over the packed tensors."""
    raw_bytes: int = 0
    packed_bytes: int = 0
    packs: int = 0
    kept_as_is: int = 0


class _Packed:
    __slots__ = ("packed", "requires_grad")

    def __init__(self, packed, requires_grad):
        self.packed, self.requires_grad = packed, requires_grad


@contextlib.contextmanager
def saved_tensors(policy="division:B=8,Q=2", seed=0):
    stats = SavedStats()
    counter = [0]

    def pack_hook(t):
        if (t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() < 2
                or (t.requires_grad and t.grad_fn is None)):  # a parameter
            stats.kept_as_is += 1
            return t
        counter[0] += 1
        p = _actlab.pack(t.detach().contiguous().numpy(), policy, seed, counter[0])
        stats.raw_bytes += t.numel() * 4
        stats.packed_bytes += p.nbytes
        stats.packs += 1
        return _Packed(p, t.requires_grad)

    def unpack_hook(saved):
        if not isinstance(saved, _Packed):
            return saved
        return torch.from_numpy(_actlab.unpack(saved.packed))

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        yield stats
