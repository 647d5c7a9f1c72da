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
- weights computed from parameters alone (weight_norm, weight standardization, a parametrization without
  buffers, a trainable base plus a low-rank update): a tensor of a parameter's shape whose autograd graph,
  explored whole within a few dozen nodes, ends at parameters only. Coded, such a weight would put its
  error into every input gradient of its layer. A weight computed with a tensor that needs no gradient
  (spectral_norm's u and v, a pruning mask, a frozen base: W0 + B @ A) looks like an activation to this
  rule, as does a constant factor (w * mask, where mul saves the mask): keep= keeps them, a function of
  the saved tensor, true to keep it;
- a normalization's statistics: tensors whose last dimension is 1 (LayerNorm's mean and rstd) and the
  outputs after the first of a norm node (GroupNorm's (N, G) mean and rstd);
- log-probabilities, the outputs of log_softmax (what cross_entropy saves): actlab's own loss keeps its
  probabilities exact;
- tensors that are not float32, not on the CPU, or not strided (sparse, MKL-DNN).
A broadcast view (stride 0 along a dimension: x.expand(...), an SE block's gate) is packed or kept at the
size of the tensor it repeats, as PyTorch keeps it, and expanded again at unpack.
A softmax output (and a product's save of it) is packed with codes of at least 8 bits (actlab.pack's
min_bits), as actlab's attention keeps its probabilities: softmax's backward scales each gradient by the
probability itself, so a 2-bit code of a small probability is off by about its own size.

Saves are checked as PyTorch checks them: PyTorch skips its in-place modification check under saved-tensor
hooks, so the unpack makes it instead, and a saved tensor changed in place after it was saved (while still
alive) raises the RuntimeError PyTorch would have raised, rather than giving a gradient of other values.
A channels_last tensor comes back channels_last, so the op's backward takes the path it takes without hooks.

A ReLU output keeps its sign exactly (actlab.pack's keep_sign: a 1-bit mask beside the code; the decoded
values are 0 where the output was 0 and positive where it was positive). ReLU's backward passes gradient
where its saved output is > 0,
so a code that moved a value across 0 would open or close the gradient there (actlab's own ReLU keeps
that mask exact). The mask is counted in packed_bytes.

A tensor saved twice in one block (a ReLU output that ReLU and the next convolution both save; the same
storage, shape, strides and version) is packed once and both saves share it; raw_bytes counts it once. So is a
view of a packed tensor (a flatten before a linear layer): the view is taken again of the decoded tensor. A
view whose windows overlap (x.unfold(...): more elements than the storage it reads) is packed as the tensor
it views, which is what PyTorch keeps, and taken again of its decode.
Every save of a ReLU output gets the mask's signs back, the next layer's too: a save does not say which op
reads it, and an op that tests the sign (relu6, abs, a power below 1) would lose or blow up its gradient
where a value decoded to 0 or below. The price is a bias: where the decode of a positive value was negative,
it is raised to the smallest positive float, so the weight gradient of a convolution after a ReLU came out
2.5 % high on average at 2 bits and 6 % at 1 bit (one measurement, a 3-to-8-channel 16x16 convolution).
actlab's own networks have no such bias: their ReLU keeps its mask apart from the next layer's codes.

Second-order gradients (torch.autograd.grad(..., create_graph=True), then a backward through the result)
would differentiate through decoded values: a lossy pack refuses to be read with gradients enabled, in one
RuntimeError; exact and swap packs, and saves kept as they are, give PyTorch's own double backward.

The packs and decoded tensors live in actlab's CPU block pool, which keeps freed blocks for the next step;
actlab.empty_cache() gives them back to the system.

Stochastic rounding: pack k of a block draws from Philox(seed, k). With seed=None (the default) every
`with` block takes the next value of a process-wide counter (0, 1, 2, ...), so successive steps draw
different numbers and their rounding noise averages out, and a program that runs the same blocks in the
same order is reproducible. Pass seed=step to choose it yourself.
"""
import contextlib
import dataclasses
import itertools
import operator
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
    __slots__ = ("packed", "source", "version", "memory_format", "shape", "__weakref__")

    def __init__(self, packed, source, memory_format, shape=None):
        self.packed = packed
        self.source = weakref.ref(source)  # for the in-place check; a weak reference keeps nothing alive
        self.version = source._version
        self.memory_format = memory_format
        self.shape = shape  # a broadcast save's shape, to expand the decoded source back to (or None)


class _Share:
    """A later save of a packed tensor, or a view of one (`view`: its size, strides and storage offset from the
    packed tensor's; None: the tensor itself)."""
    __slots__ = ("packed", "view")

    def __init__(self, packed, view=None):
        self.packed = packed
        self.view = view


class _Kept:
    """A save kept as it is, with the version it had, for the in-place check. Held detached: a save of an
    op's own output comes with its grad_fn, and holding that here would close a cycle through autograd's
    C++ nodes (tensor -> node -> saved variable -> this -> tensor) that Python's collector cannot break, so
    a graph dropped without a backward (a skipped step, an evaluation with grad on, retain_graph=True) was
    never freed. `shape`: the broadcast shape to expand back to (see _broadcast_source), or None."""
    __slots__ = ("tensor", "version", "shape")

    def __init__(self, t, shape=None, version_of=None):
        self.tensor = t.detach()
        self.version = (version_of if version_of is not None else t)._version if t.layout == torch.strided else None
        self.shape = shape

    def get(self):
        return self.tensor if self.shape is None else self.tensor.expand(self.shape)


def _check_version(t, saved_version):
    if t is not None and saved_version is not None and t._version != saved_version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace operation: "
            "[%s %s] is at version %d; expected version %d instead (actlab.torch makes the check PyTorch skips "
            "under saved-tensor hooks)" % (t.type(), list(t.shape), t._version, saved_version))


def _is_weight(t):
    # A parameter (trainable or frozen), or a leaf that requires a gradient (weights held as plain tensors).
    return t is not None and (isinstance(t, torch.nn.Parameter) or (t.requires_grad and t.grad_fn is None))


_NORM_NODES = ("NativeGroupNormBackward", "NativeLayerNormBackward", "NativeBatchNormBackward",
               "CudnnBatchNormBackward", "MiopenBatchNormBackward")


def _node(t):
    return type(t.grad_fn).__name__ if t.grad_fn is not None else ""


def _kept_as_is(t):
    if (t.layout != torch.strided or t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() < 2
            or t.shape[-1] == 1):
        return True
    if _is_weight(t) or _is_weight(t._base):
        return True
    node = _node(t)
    # A norm node's outputs after the first are its statistics (native_group_norm: y, mean, rstd).
    return (t.output_nr > 0 and node.startswith(_NORM_NODES)) or node.startswith("LogSoftmaxBackward")


_WEIGHT_WALK_NODES = 64  # a computed weight's graph back to its parameters is a handful of nodes


def _computed_weight(t):
    """True when t is computed from parameters alone and has the shape of one of them: every path back
    through its autograd graph, explored whole within _WEIGHT_WALK_NODES nodes, ends at a parameter's
    AccumulateGrad, and one of those parameters has t's shape. An activation's paths reach the data (an
    input that needs no gradient, a None in the graph, or a leaf that is no parameter) or run past the
    budget, so an MLP's hidden activation of its weight's shape (batch = width) stays an activation.
    The node wrappers are held in `alive` for the walk: PyTorch makes them on demand and frees them when
    unreferenced, so their id()s would otherwise be reused by other nodes mid-walk."""
    start = t.grad_fn
    if start is None:
        return False
    shape, matched = tuple(t.shape), False
    alive, seen, frontier = [start], {id(start)}, [start]
    while frontier:
        node = frontier.pop()
        for fn, _ in node.next_functions:
            if fn is None:  # an input that needs no gradient: the data, a buffer, a constant
                return False
            if id(fn) in seen:
                continue
            alive.append(fn)
            seen.add(id(fn))
            if len(seen) > _WEIGHT_WALK_NODES:
                return False
            if hasattr(fn, "variable"):  # an AccumulateGrad node: the leaf it accumulates into
                if not isinstance(fn.variable, torch.nn.Parameter):
                    return False
                matched = matched or tuple(fn.variable.shape) == shape
            else:
                frontier.append(fn)
    return matched


def _broadcast_source(t):
    """A broadcast view (stride 0 along a dimension of size > 1: an x.expand(...), an SE block's gate) as
    the tensor it repeats, with the shape to expand back to; (t, None) for any other tensor. PyTorch keeps
    such a save at its source's size, so the adapter packs or keeps the source, not the repeated values."""
    if t.layout != torch.strided:
        return t, None
    repeated = [d for d in range(t.dim()) if t.stride(d) == 0 and t.shape[d] > 1]
    if not repeated:
        return t, None
    return t.detach()[tuple(slice(0, 1) if d in repeated else slice(None) for d in range(t.dim()))], t.shape


def _is_relu_output(t):
    return _node(t).startswith("ReluBackward")


def _min_bits(t):
    return 8 if _node(t).startswith("SoftmaxBackward") else 0  # autograd/functions.h: kProbabilityBits


def _dense(t):
    # A tensor whose decode (contiguous, or channels_last through _memory_format) has its strides.
    return t.layout == torch.strided and (t.is_contiguous() or _memory_format(t) is not None)


def _view_of(t):
    """(base, (size, stride, offset)) when t is a view of a dense float32 tensor on the same device, else
    (None, None): the view to take again of the base's decode."""
    base = t._base
    if base is None or t.layout != torch.strided or base.dtype != t.dtype or base.device != t.device:
        return None, None
    if not _dense(base):
        return None, None
    return base, (tuple(t.shape), t.stride(), t.storage_offset() - base.storage_offset())


def _memory_format(t):
    # The layout to hand back: channels_last when the tensor has it (and is not also plainly contiguous).
    if t.is_contiguous():
        return None
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return None


@contextlib.contextmanager
def saved_tensors(policy="division:B=8,Q=2", seed=None, keep=None):
    if seed is not None:
        try:
            value = operator.index(seed)  # an int, or a NumPy integer
        except TypeError:
            value = -1
        if not 0 <= value < 2 ** 64:
            raise ValueError("saved_tensors: seed must be an integer in [0, 2**64), got %r" % (seed,))
        seed = value
    if keep is not None and not callable(keep):
        raise TypeError("saved_tensors: keep must be a function of the saved tensor (true: keep it as it is), got %r"
                        % (keep,))
    _actlab.check_policy(policy)  # a bad policy string fails here, not at the first save
    stats = SavedStats(seed=next(_block_seeds) if seed is None else seed)
    # (data_ptr, shape, strides, version) -> weak references to the tensor and its _Packed: weak, so that a
    # backward run inside the block frees each pack as autograd lets it go.
    packs = {}

    def pack_hook(t):
        source, shape = _broadcast_source(t)
        # A broadcast source too small to code (a last dimension of 1, an SE gate's (N, C, 1, 1)) is kept.
        if (_kept_as_is(t) or (shape is not None and (source.dim() < 2 or source.shape[-1] == 1))
                or _computed_weight(t if t._base is None else t._base)
                or (keep is not None and keep(t))):
            stats.kept_as_is += 1
            return _Kept(source, shape, version_of=t)
        shared = packed_earlier(t)
        if shared is not None:
            stats.shared += 1
            return _Share(shared)
        base, view = _view_of(t) if shape is None else (None, None)
        if base is not None:
            shared = packed_earlier(base)
            if shared is not None:  # a view of a packed tensor
                stats.shared += 1
                return _Share(shared, view)
            if t.numel() > base.numel():  # overlapping windows: pack the storage they read, as PyTorch keeps it
                return _Share(pack_new(base, base, None), view)
        return pack_new(t, source, shape)

    def packed_earlier(t):
        # The _Packed of t, when this block packed it and it is still alive (so its storage was not reused).
        earlier = packs.get((t.data_ptr(), tuple(t.shape), t.stride(), t._version))
        return earlier[1]() if earlier is not None and earlier[0]() is not None else None

    def pack_new(t, source, shape):
        stats.packs += 1
        saved = _Packed(_actlab.pack(source.detach().contiguous().numpy(), policy, stats.seed, stats.packs,
                                     keep_sign=_is_relu_output(t), min_bits=_min_bits(t)),
                        t, _memory_format(t) if shape is None else None, shape)
        stats.raw_bytes += source.numel() * 4
        stats.packed_bytes += saved.packed.nbytes
        packs[(t.data_ptr(), tuple(t.shape), t.stride(), t._version)] = (weakref.ref(t), weakref.ref(saved))
        return saved

    def unpack_hook(saved):
        if isinstance(saved, _Kept):
            _check_version(saved.tensor, saved.version)
            return saved.get()
        if isinstance(saved, _Share):
            t = decode(saved.packed)
            return t if saved.view is None else t.as_strided(saved.view[0], saved.view[1],
                                                             t.storage_offset() + saved.view[2])
        return decode(saved)

    def decode(saved):
        _check_version(saved.source(), saved.version)
        if torch.is_grad_enabled() and not saved.packed.lossless:
            raise RuntimeError(
                "actlab.torch: a backward with create_graph=True reads a save that %s coded lossily, so its "
                "second-order gradient would differentiate through decoded values; run that part outside "
                "saved_tensors, or under policy='exact'" % saved.packed.policy)
        t = torch.from_numpy(_actlab.unpack(saved.packed))
        if saved.shape is not None:
            return t.expand(saved.shape)
        return t if saved.memory_format is None else t.contiguous(memory_format=saved.memory_format)

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        yield stats
