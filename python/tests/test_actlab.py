"""Tests of the Python module (python/module.cpp) and the PyTorch adapter (python/actlab/torch.py).
Run by CTest (python_module) with PYTHONPATH=<build>/python. Prints one line per case and a closing
'N passed, N failed'; a missing torch is a visible skip of the adapter cases only."""
import contextlib
import math
import sys
import traceback

import numpy as np

import actlab

CASES = []


def case(f):
    CASES.append(f)
    return f


def maps(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def expect_error(call, kind, *words):
    """call() must raise `kind` with every one of `words` in its message."""
    try:
        call()
    except kind as e:
        assert all(w in str(e) for w in words), e
    else:
        raise AssertionError("no %s from %r" % (kind.__name__, call))


@case
def exact_keeps_the_array():
    x = maps((2, 3, 8, 8))
    p = actlab.pack(x, "exact")
    assert p.nbytes == x.nbytes, p
    assert np.array_equal(actlab.unpack(p), x)


@case
def division_keeps_the_closed_form_and_reconstructs_closely():
    x = maps((4, 16, 32, 32), 1)
    p = actlab.pack(x, "division:B=8,Q=2", seed=3, stream=7)
    assert p.nbytes == actlab.expected_bytes("division:B=8,Q=2", list(x.shape))
    assert x.nbytes / p.nbytes > 12, x.nbytes / p.nbytes  # 2-bit codes + a bf16 LFC of 1/64 of the elements
    y = actlab.unpack(p)
    assert y.shape == x.shape and y.dtype == np.float32
    err = np.abs(y - x)
    # Each element is within one quantization step of its residual: (max - min of the plane residual) / 3.
    assert err.max() < 3.0, err.max()
    assert abs(float((y - x).mean())) < 0.01  # stochastic rounding is unbiased
    # The same seed and stream give the same bytes, another stream others.
    again = actlab.unpack(actlab.pack(x, "division:B=8,Q=2", seed=3, stream=7))
    other = actlab.unpack(actlab.pack(x, "division:B=8,Q=2", seed=3, stream=8))
    assert np.array_equal(again, y) and not np.array_equal(other, y)


@case
def every_policy_string_and_clear_errors():
    x = maps((2, 4, 16, 16), 2)
    for policy in ["quant:Q=2", "lfc:B=8", "hfc:B=8,Q=2", "pergroup:G=256,Q=2", "division:B=4,Q=4"]:
        p = actlab.pack(x, policy)
        assert p.nbytes == actlab.expected_bytes(policy, list(x.shape)), policy
        assert actlab.unpack(p).shape == x.shape
    expect_error(lambda: actlab.pack(x, "division:B=8,Q=3"), RuntimeError, "Q")
    expect_error(lambda: actlab.pack(x, "zip:Q=2"), RuntimeError, "policy")


@case
def pack_reads_the_array_without_copying_and_keeps_no_reference_to_it():
    x = maps((2, 4, 16, 16), 5)
    before = actlab.memory_stats()
    div = actlab.pack(x, "division:B=8,Q=2")
    kept = actlab.pack(x, "exact")  # exact keeps a copy, so writes to x cannot reach it
    want_div, want_exact = actlab.unpack(div), x.copy()
    x[:] = 0
    assert np.array_equal(actlab.unpack(div), want_div)
    assert np.array_equal(actlab.unpack(kept), want_exact)
    assert "activation_packed" in before


@case
def unpacked_arrays_outlive_their_pack():
    p = actlab.pack(maps((2, 2, 8, 8), 4), "quant:Q=8")
    y = actlab.unpack(p)
    del p
    assert np.isfinite(y).all()


@case
def train_returns_the_summary():
    s = actlab.train(model="mlp", dataset="synthetic", synthetic_size=256, batch_size=64, test_limit=64,
                     policy="division:B=8,Q=2", seed=1)
    assert s["epochs_done"] == 1 and s["steps"] == 4, s
    assert 0 <= s["final_test_acc"] <= 100
    assert s["config"]["policy"] == "division:B=8,Q=2"
    expect_error(lambda: actlab.train(frobnicate=1), RuntimeError, "unknown key 'frobnicate'")


@case
def step_memory_measures_as_the_memory_table():
    exact = actlab.step_memory("resnet20", batch=8, policy="exact", image_size=16, channels=1)
    div = actlab.step_memory("resnet20", batch=8, policy="division:B=4,Q=2", image_size=16, channels=1)
    assert div["saved_packed_bytes"] == div["saved_expected_bytes"]
    assert exact["activation_bytes"] > 3 * div["activation_bytes"], (exact, div)


@case
def hostile_inputs_are_clear_errors_not_crashes_or_casts():
    for bad in (np.arange(4.0).reshape(2, 2), None, np.ones((2, 2), np.complex64), np.ones((2, 2), bool)):
        expect_error(lambda: actlab.pack(bad, "exact"), TypeError, "float32 array is expected")
    empty = actlab.Packed.__new__(actlab.Packed)  # no pack() filled it
    for use in (lambda: actlab.unpack(empty), lambda: empty.nbytes, lambda: repr(empty)):
        expect_error(use, TypeError, "holds nothing")
    expect_error(lambda: actlab.expected_bytes("quant:Q=2", [-1, 4, 16, 16]), RuntimeError, "dimensions must be >= 0")
    # Past 2^57 elements the closed forms' bit counts would wrap (blpa's 8 bits of 2^60 elements did): the policy
    # refuses it, and up to there every policy's count grows with the shape; a zero extent anywhere is 0 elements.
    for policy in ("exact", "blpa:Q=8", "mesa:Q=8", "actnn:G=8,Q=8", "division:B=8,Q=8", "pergroup:G=8,Q=8"):
        expect_error(lambda: actlab.expected_bytes(policy, [8, 2 ** 57]), RuntimeError,
                     "policy %s: a float32 tensor of shape (8,%d) has more elements than" % (policy, 2 ** 57))
        assert actlab.expected_bytes(policy, [8, 2 ** 54]) > actlab.expected_bytes(policy, [8, 2 ** 53]) > 0, policy
    assert actlab.expected_bytes("exact", [3, 2 ** 62, 0, 2]) == actlab.expected_bytes("exact", [2 ** 40, 0, 3, 3]) == 0
    # A strided array whose C-ordered copy cannot be allocated: NumPy's MemoryError, not a crash.
    expect_error(lambda: actlab.pack(np.broadcast_to(np.float32(1), (1 << 20, 1 << 20)), "division:B=8,Q=2"),
                 MemoryError)
    expect_error(lambda: actlab.forward("resnet20", np.zeros((1, 3, 32, 16), np.float32)), RuntimeError, "must be square")
    try:  # an array NumPy cannot read at all (a bf16 torch tensor): still actlab's TypeError, with what to do
        import torch
        expect_error(lambda: actlab.pack(torch.ones(2, 2, dtype=torch.bfloat16)), TypeError, "float32 array is expected",
                     ".float()")
    except ImportError:
        pass


@case
def exact_unpack_is_a_new_array_and_a_positive_nan_survives_the_codecs():
    x = maps((2, 3, 4, 4), 7)
    p = actlab.pack(x, "exact")
    y = actlab.unpack(p)
    y[:] = 7
    assert np.array_equal(actlab.unpack(p), x)  # the write did not reach what exact keeps
    x[0, 0, 1, 1] = np.nan  # numpy's NaN has its sign bit clear
    for policy in ("quant:Q=2", "division:B=2,Q=2", "pergroup:G=16,Q=2"):
        assert np.isnan(actlab.unpack(actlab.pack(x, policy))[0, 0, 1, 1]), policy


@case
def keep_sign_restores_where_the_input_was_positive_at_one_bit_per_value():
    x = np.maximum(maps((4, 8, 16, 16), 3), 0)  # a ReLU output: half zeros, many values near 0
    x[1, 2, 3, 4] = np.nan
    plain = actlab.pack(x, "division:B=8,Q=2", 5, 1)
    signed = actlab.pack(x, "division:B=8,Q=2", 5, 1, keep_sign=True)
    assert signed.nbytes == plain.nbytes + 4 * ((x.size + 31) // 32)
    y, base = actlab.unpack(signed), actlab.unpack(plain)
    assert np.isnan(y[1, 2, 3, 4])
    ok = np.ones(x.shape, bool)
    ok[1, 2] = False  # the NaN's plane decodes to NaN (its range is NaN), kept so by keep_sign
    assert np.isnan(y[1, 2]).all()
    assert np.array_equal(y[ok] > 0, x[ok] > 0)  # the sign of every value, where the plain codes move many
    assert np.count_nonzero((base[ok] > 0) != (x[ok] > 0)) > x.size // 100
    keep = ok & (x > 0) & (base > np.finfo(np.float32).tiny)
    assert np.array_equal(y[keep], base[keep])  # the codes' values where they had the sign right
    for policy in ("exact", "division:B=8,Q=2"):  # exact keeps the values; a 1-D array is a copy
        a = x[0, 0, 0] if policy != "exact" else x
        assert actlab.pack(a, policy, keep_sign=True).nbytes == actlab.pack(a, policy).nbytes
    # positive=False: only the mask's zeros, the codes' own values where x was positive, negative ones included
    # (a layer that multiplies by them needs them unbiased).
    z = actlab.unpack(signed, positive=False)
    assert np.array_equal(z[ok & (x > 0)], base[ok & (x > 0)]) and (z[ok & (x > 0)] < 0).any()
    assert (z[ok & ~(x > 0)] == 0).all() and np.isnan(z[1, 2]).all()


@case
def read_state_dict_gives_the_exported_weights_as_numpy_arrays():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = d + "/w.safetensors"
        actlab.train(model="resnet20", dataset="synthetic", synthetic_size=64, batch_size=32, steps_per_epoch=1,
                     test_limit=32, export_weights=path)
        sd = actlab.read_state_dict(path)
        assert sd["conv1.weight"].dtype == np.float32 and sd["conv1.weight"].shape == (16, 1, 3, 3), sd["conv1.weight"].shape
        assert sd["bn1.num_batches_tracked"].dtype == np.int64 and int(sd["bn1.num_batches_tracked"]) == 1
        assert all(np.isfinite(v).all() for k, v in sd.items() if v.dtype == np.float32)
        # Any writer's file: the numpy-only one of this test (no checksum in it).
        want = {"a": maps((2, 3), 1), "b": maps((4,), 2)}
        write_safetensors(d + "/n.safetensors", {k: _NumpyTensor(v) for k, v in want.items()})
        got = actlab.read_state_dict(d + "/n.safetensors")
        assert sorted(got) == ["a", "b"] and all(np.array_equal(got[k], want[k]) for k in want)
        import pathlib  # any os.PathLike, as open() takes
        assert sorted(actlab.read_state_dict(pathlib.Path(d) / "n.safetensors")) == ["a", "b"]
        assert sorted(actlab.read_state_dict((d + "/n.safetensors").encode())) == ["a", "b"]
        with open(path, "r+b") as f:  # a cut file is one clear error
            f.truncate(100)
        expect_error(lambda: actlab.read_state_dict(path), RuntimeError, "w.safetensors")


class _NumpyTensor:
    """The two methods write_safetensors calls on a torch tensor, for a numpy array (no torch needed)."""
    def __init__(self, a):
        self.a = a

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.a


def os_threads():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


@case
def packs_of_one_policy_string_share_one_policy():
    before = os_threads()
    kept = [actlab.pack(maps((2, 2, 8, 8), i), "swap:P=2") for i in range(40)]  # swap runs a copy thread
    assert os_threads() - before <= 2, (before, os_threads())
    assert all(np.array_equal(actlab.unpack(p), maps((2, 2, 8, 8), i)) for i, p in enumerate(kept))
    # A sweep over many policy strings keeps a bounded number of copy threads once its packs are gone (the
    # cache keeps the last 16 strings' policies; each pack holds its own).
    for f in range(1, 41):
        actlab.unpack(actlab.pack(maps((2, 2, 8, 8), f), "swap:P=2,F=%d" % f))
    assert os_threads() - before <= 16 + 2, (before, os_threads())


@case
def runs_in_two_threads_do_not_change_each_other():
    import threading
    q = dict(model="mlp", dataset="synthetic", synthetic_size=256, batch_size=32, test_limit=32, threads=1, seed=3)
    images = np.zeros((2, 1, 28, 28), np.float32)
    alone_loss = actlab.train(**q)["epoch_rows"][0]["train_loss"]
    alone_logits = actlab.forward("mlp", images, seed=5)
    logits, stop = [], threading.Event()

    def other():
        while not stop.is_set():
            logits.append(actlab.forward("mlp", images, seed=5))

    t = threading.Thread(target=other)
    t.start()
    try:
        beside = [actlab.train(**q)["epoch_rows"][0]["train_loss"] for _ in range(2)]
    finally:
        stop.set()
        t.join()
    assert beside == [alone_loss, alone_loss], (alone_loss, beside)
    assert logits and all(np.array_equal(l, alone_logits) for l in logits)


# ---------------------------------------------------------------- the PyTorch adapter
def torch_or_skip():
    try:
        import torch  # noqa: F401
        import actlab.torch  # noqa: F401
        return True
    except ImportError as e:
        print("SKIPPED: missing prerequisite: torch (%s): the adapter cases do not run" % e)
        return False


def resnet20(torch, in_ch=1, classes=10):
    """CIFAR ResNet-20 (option A shortcuts) with actlab's parameter names (conv1, bn1, layer1.0.conv1, ..., fc)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.pad = cout - cin if stride != 1 or cin != cout else 0

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            sc = x
            if self.pad:  # option A: subsample and pad channels
                sc = nn.functional.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
            return torch.relu(out + sc)

    class ResNet20(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(in_ch, 16, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(16)
            cin = 16
            for li, (cout, stride) in enumerate([(16, 1), (32, 2), (64, 2)], 1):
                blocks = []
                for i in range(3):
                    blocks.append(Block(cin, cout, stride if i == 0 else 1))
                    cin = cout
                setattr(self, "layer%d" % li, nn.Sequential(*blocks))
            self.fc = nn.Linear(64, classes)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = self.layer3(self.layer2(self.layer1(x)))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet20()


@case
def a_pytorch_resnet20_trains_under_division_like_exact():
    if not torch_or_skip():
        return
    import torch
    import actlab.torch as at
    torch.manual_seed(0)
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    # A learnable problem: the class is which quadrant of the image holds a bright square.
    images = rng.standard_normal((24 * 32, 1, 28, 28)).astype(np.float32) * 0.3
    labels = rng.integers(0, 4, len(images))
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 2)
        images[i, 0, r * 14 + 3:r * 14 + 11, q * 14 + 3:q * 14 + 11] += 1.5
    x, y = torch.from_numpy(images), torch.from_numpy(labels)

    def run(policy):
        torch.manual_seed(0)
        model = resnet20(torch, 1, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses, stats = [], None
        for step in range(24):
            xb, yb = x[step * 32:(step + 1) * 32], y[step * 32:(step + 1) * 32]
            if policy is None:
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
            else:
                with at.saved_tensors(policy=policy, seed=step) as stats:
                    loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses, stats

    exact, _ = run(None)
    div, stats = run("division:B=8,Q=2")
    tail = lambda v: sum(v[-8:]) / 8
    print("  exact loss %.3f -> %.3f, division %.3f -> %.3f; hooks packed %d tensors, %.1f MiB -> %.2f MiB (%.1fx)"
          % (exact[0], tail(exact), div[0], tail(div), stats.packs, stats.raw_bytes / 2**20,
             stats.packed_bytes / 2**20, stats.raw_bytes / stats.packed_bytes))
    assert tail(exact) < 0.8 * exact[0] and tail(div) < 0.8 * div[0]  # both learn
    assert abs(tail(div) - tail(exact)) < 0.25 * tail(exact) + 0.1, (tail(div), tail(exact))
    assert stats.raw_bytes / stats.packed_bytes > 8
    assert all(math.isfinite(v) for v in div)


@case
def the_adapter_keeps_weights_statistics_and_relu_signs_and_packs_a_shared_save_once():
    if not torch_or_skip():
        return
    import torch
    import actlab.torch as at
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    # ReLU's backward passes gradient where its saved output is > 0: coded at 2 bits, values near 0 would move
    # across it. With the sign kept, the input gradient is exactly the upstream one masked by x > 0.
    x = torch.randn(8, 16, 12, 12, generator=g, requires_grad=True)
    up = torch.randn(8, 16, 12, 12, generator=g)
    with at.saved_tensors(policy="quant:Q=2", seed=3) as stats:
        y = torch.relu(x * 1.0)
    (y * up).sum().backward()
    assert torch.equal(x.grad, up * (x.detach() > 0))
    assert stats.packs == 1 and stats.packed_bytes > actlab.expected_bytes("quant:Q=2", list(x.shape))  # + mask
    # Weights (nn.Linear saves weight.t(), a view), frozen ones too, and LayerNorm's per-row mean and rstd
    # are kept as they are. The linear layers' input gradients read only their weights, so they are the
    # exact run's bit for bit.
    lin, frozen, norm = torch.nn.Linear(24, 24), torch.nn.Linear(24, 24), torch.nn.LayerNorm(24)
    frozen.weight.requires_grad_(False)
    a = torch.randn(4, 10, 24, generator=g)
    with at.saved_tensors(policy="division:B=8,Q=2") as st:
        frozen(lin(norm(a)))  # a data batch (a leaf that needs no gradient) is packed like any activation
    # A weight held as a plain tensor (functional code) is a leaf that requires a gradient: kept too.
    w_plain = torch.randn(24, 24, generator=g, requires_grad=True)
    with at.saved_tensors(policy="division:B=8,Q=2") as plain:
        # tanh saves its output, which linear saves again as its input (one pack), and linear saves w.
        torch.nn.functional.linear(torch.tanh(a[0].clone().requires_grad_(True)), w_plain)
    assert (plain.packs, plain.shared, plain.kept_as_is) == (1, 1, 1), plain
    # Packed: LayerNorm's input and lin's (the frozen layer needs no input: it has no weight gradient).
    # Kept: LayerNorm's weight, bias, mean and rstd, and both weights' transposes.
    assert (st.packs, st.kept_as_is) == (2, 6), st
    xb = [a.clone().requires_grad_(True) for _ in range(2)]
    with at.saved_tensors(policy="division:B=8,Q=2"):
        o1 = frozen(lin(xb[1]))
    o0 = frozen(lin(xb[0]))
    o0.sum().backward()
    o1.sum().backward()
    assert torch.equal(xb[0].grad, xb[1].grad)
    # A ReLU output that ReLU and the next convolution both save is packed once.
    conv1, conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
    img = torch.randn(2, 3, 16, 16, generator=g)
    with at.saved_tensors(policy="division:B=8,Q=2") as st:
        out = conv2(torch.relu(conv1(img)))
    out.sum().backward()
    assert st.shared == 1 and st.packs == 2, st  # the image and the ReLU output
    assert st.raw_bytes == 4 * (img.numel() + 2 * 8 * 16 * 16)
    # A later save of a ReLU output by an op that tests its sign (relu6 passes gradient where 0 < v < 6) gets
    # the mask's signs too: a decode of 0 or below where the output was positive would drop the gradient there.
    h = conv1(img).detach().requires_grad_(True)
    torch.nn.functional.relu6(torch.relu(h)).sum().backward()
    plain_h, h.grad = h.grad.clone(), None
    with at.saved_tensors("division:B=8,Q=2", seed=3):
        out = torch.nn.functional.relu6(torch.relu(h))
    out.sum().backward()
    assert torch.equal(h.grad, plain_h)
    # A view of a packed save (a flatten before a linear layer) shares its pack, and raw_bytes counts the
    # storage once: 2·3·8·8 image floats and 2·4·8·8 ReLU output floats.
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(256, 10))
    small = torch.randn(2, 3, 8, 8, generator=g)
    with at.saved_tensors("division:B=8,Q=2", seed=1) as st:
        out = net(small)
    (out * torch.randn(2, 10, generator=g)).sum().backward()
    assert (st.packs, st.shared, st.raw_bytes) == (2, 1, 4 * (2 * 3 * 8 * 8 + 2 * 4 * 8 * 8)), st
    # Overlapping windows (unfold) are packed as the tensor they view, the bytes PyTorch keeps, not 16x them.
    xs = torch.randn(4, 8, 256, generator=g)
    wv = torch.randn(16, requires_grad=True)
    (xs.unfold(2, 16, 1) * wv).sum().backward()
    plain_grad, wv.grad = wv.grad.clone(), None
    with at.saved_tensors("exact") as st:
        (xs.unfold(2, 16, 1) * wv).sum().backward()
    assert st.raw_bytes == st.packed_bytes == xs.numel() * 4 and torch.equal(wv.grad, plain_grad), st
    # Successive blocks draw different numbers unless a seed is given.
    s1, s2 = at.saved_tensors(), at.saved_tensors()
    with s1 as a1:
        pass
    with s2 as a2:
        pass
    assert a1.seed != a2.seed
    with at.saved_tensors(seed=7) as a3:
        pass
    assert a3.seed == 7


@case
def the_adapter_keeps_norm_statistics_and_log_probabilities_and_codes_probabilities_at_8_bits():
    if not torch_or_skip():
        return
    import torch
    import torch.nn.functional as F
    import actlab.torch as at
    g = torch.Generator().manual_seed(2)
    # GroupNorm saves its (N, G) mean and rstd: kept as they are, so with groups ~1000x apart in scale the
    # input gradient is still close to exact (coded at 2 bits, they made it 98x the exact one's norm away).
    scale = torch.logspace(-1.5, 1.5, 16).repeat_interleave(2).view(1, 32, 1, 1)
    x = (torch.randn(4, 32, 16, 16, generator=g) * scale).requires_grad_(True)
    up = torch.randn(4, 32, 16, 16, generator=g)
    gn = torch.nn.GroupNorm(16, 32)
    gn(x * 1.0).backward(up)
    exact = x.grad.clone()
    x.grad = None
    with at.saved_tensors("division:B=8,Q=2") as st:
        y = gn(x * 1.0)
    y.backward(up)
    assert st.packs == 1 and st.kept_as_is == 4, st  # the input packed; weight, bias, mean, rstd kept
    assert float((x.grad - exact).norm() / exact.norm()) < 0.5
    # cross_entropy saves log_softmax's output: kept, as actlab's own loss keeps its probabilities, so the
    # logits' gradient is PyTorch's bit for bit even with 1000 classes.
    z = (torch.randn(64, 1000, generator=g) * 3).requires_grad_(True)
    labels = torch.randint(0, 1000, (64,), generator=g)
    F.cross_entropy(z * 1.0, labels).backward()
    exact = z.grad.clone()
    z.grad = None
    with at.saved_tensors("division:B=8,Q=2") as st:
        loss = F.cross_entropy(z * 1.0, labels)
    loss.backward()
    assert torch.equal(z.grad, exact) and st.packs == 0, st
    # A softmax's output is coded with 8-bit codes (quant:Q=2's pack of it is the 8-bit closed form).
    s = torch.randn(8, 3, 16, 16, generator=g).requires_grad_(True)
    with at.saved_tensors("quant:Q=2") as st:
        p = torch.softmax(s * 1.0, -1)
    assert st.packs == 1 and st.packed_bytes == actlab.expected_bytes("quant:Q=8", [8, 3, 16, 16]), st
    q = actlab.pack(maps((8, 3, 16, 16)), "quant:Q=2", min_bits=8)
    assert q.nbytes == actlab.expected_bytes("quant:Q=8", [8, 3, 16, 16])
    expect_error(lambda: actlab.pack(maps((2, 2)), "quant:Q=2", min_bits=3), actlab.Error, "min_bits")


@case
def the_adapter_checks_in_place_changes_keeps_layouts_and_refuses_bad_arguments_at_once():
    if not torch_or_skip():
        return
    import torch
    import actlab.torch as at
    g = torch.Generator().manual_seed(3)
    # PyTorch skips its version check under saved-tensor hooks: the adapter makes it, for a save kept as it
    # is (a 1-D tensor) and for a packed one whose tensor is still alive.
    for shape, policy in (((5,), "exact"), ((4, 8), "division:B=8,Q=2")):
        a = torch.randn(*shape, generator=g, requires_grad=True)
        b = a * 2
        with at.saved_tensors(policy):
            c = b * b
        b.add_(1.0)
        expect_error(lambda: c.sum().backward(), RuntimeError, "modified by an inplace operation")
    # Sparse and MKL-DNN tensors are kept as they are (their storage has no data pointer to pack).
    sp = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [1, 0, 3]]), torch.tensor([1.0, 2.0, 3.0]), (3, 4))
    w = torch.randn(4, 5, generator=g, requires_grad=True)
    with at.saved_tensors("division:B=8,Q=2") as st:
        out = torch.sparse.mm(sp, w * 1.0)
    out.sum().backward()
    assert torch.equal(w.grad, torch.sparse.mm(sp.t(), torch.ones(3, 5))) and st.kept_as_is >= 1, st
    # A channels_last save comes back channels_last: batch norm's backward then takes its own path and the
    # exact policy's gradients are PyTorch's bit for bit.
    bn = torch.nn.BatchNorm2d(8)
    x = torch.randn(4, 8, 6, 6, generator=g).to(memory_format=torch.channels_last).requires_grad_(True)
    up = torch.randn(4, 8, 6, 6, generator=g).to(memory_format=torch.channels_last)
    bn(x * 1.0).backward(up)
    plain = x.grad.clone()
    x.grad = None
    with at.saved_tensors("exact"):
        y = bn(x * 1.0)
    y.backward(up)
    assert torch.equal(x.grad, plain)
    # A BatchNorm used twice in one block (two crops, a GAN's real and fake batches) trains as without hooks:
    # the running statistics it saves are updated by the second call, which PyTorch does not count as a
    # change of the first call's saves.
    bn2 = torch.nn.BatchNorm2d(8)
    a, b = torch.randn(4, 8, 6, 6, generator=g), torch.randn(4, 8, 6, 6, generator=g)
    w2 = torch.ones(1, 8, 1, 1, requires_grad=True)
    with at.saved_tensors("division:B=8,Q=2"):
        two = (bn2(a * w2) + bn2(b * w2)).sum()
    two.backward()
    assert w2.grad is not None and bool(torch.isfinite(w2.grad).all())
    # A NumPy integer is a seed like an int.
    import numpy
    with at.saved_tensors(seed=numpy.int64(5)) as st5:
        pass
    assert st5.seed == 5
    # A bad policy or seed fails when the block starts, not at its first save.
    expect_error(lambda: at.saved_tensors("divison:B=8").__enter__(), actlab.Error, "divison")
    expect_error(lambda: at.saved_tensors(seed=-1).__enter__(), ValueError, "seed")


@case
def the_adapter_keeps_computed_weights_codes_volumes_and_refuses_what_it_cannot_do_right():
    if not torch_or_skip():
        return
    import torch
    import actlab.torch as at
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 10, 24, generator=g)

    def input_grad(layer, policy, **kw):
        a = x.clone().requires_grad_(True)
        with at.saved_tensors(policy=policy, seed=1, **kw) as st:
            out = layer(a * 1.0)
        out.backward(torch.ones_like(out))
        return a.grad, st

    # A weight computed in forward from parameters alone (weight_norm: g * v / |v|; weight standardization)
    # is kept as it is: the input gradient reads only the weight, so it is exact's bit for bit, as for a plain
    # Linear. Before, the computed weight was coded at 2 bits and that gradient was about 56 % off.
    torch.manual_seed(0)

    class Standardized(torch.nn.Linear):
        def forward(self, v):
            w = (self.weight - self.weight.mean(1, keepdim=True)) / self.weight.std(1, keepdim=True)
            return torch.nn.functional.linear(v, w, self.bias)

    for layer in (torch.nn.utils.weight_norm(torch.nn.Linear(24, 24)), Standardized(24, 24)):
        want, _ = input_grad(layer, "exact")
        got, st = input_grad(layer, "division:B=8,Q=2")
        assert torch.equal(got, want), (layer, (got - want).abs().max())
        assert st.packs == 1, st  # only the input (a * 1.0) is packed
    # spectral_norm divides by sigma, computed with buffers (u, v) that need no gradient: to the rule that is
    # data, as an activation's input is. keep= names what the rule cannot tell.
    sn = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(24, 24)).eval()
    want, _ = input_grad(sn, "exact")
    got, st = input_grad(sn, "division:B=8,Q=2", keep=lambda t: t.shape == sn.weight.shape)
    assert torch.equal(got, want) and st.packs == 1, st
    # An MLP whose batch equals its width, on a plain input (no gradient): its hidden activations have its
    # weights' shape, and are packed all the same, since their graphs reach the data.
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 32))
    with at.saved_tensors(policy="division:B=8,Q=2") as st:
        mlp(torch.randn(32, 32, generator=g)).sum().backward()
    assert st.packs == 3, st  # the input and the two tanh outputs (each Linear after one shares its pack)
    # keep=: what the rule cannot see (a constant mask a weight is multiplied by) is kept by the caller.
    w = torch.randn(24, 24, generator=g, requires_grad=True)
    mask = (torch.rand(24, 24, generator=g) > 0.5).float()
    with at.saved_tensors(policy="division:B=8,Q=2") as coded:
        (w * mask).sum().backward()
    w.grad = None
    with at.saved_tensors(policy="division:B=8,Q=2", keep=lambda t: t is mask) as kept:
        (w * mask).sum().backward()
    assert coded.packs == 1 and kept.packs == 0 and torch.equal(w.grad, mask), (coded, kept)
    expect_error(lambda: at.saved_tensors(keep=3).__enter__(), TypeError, "keep")
    # A 3-D convolution's volumes are coded (planes of their last two axes), not kept at full size.
    conv = torch.nn.Sequential(torch.nn.Conv3d(2, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(8, 8, 3, padding=1))
    with at.saved_tensors(policy="division:B=8,Q=2") as st:
        conv(torch.randn(2, 2, 8, 16, 16, generator=g)).sum().backward()
    assert st.packs == 2 and st.packed_bytes * 4 < st.raw_bytes, st
    # A second-order gradient through a lossy pack is refused; through exact's it is PyTorch's own.
    for policy, refused in (("division:B=8,Q=2", True), ("exact", False)):
        a = torch.randn(4, 16, generator=g, requires_grad=True)
        m = torch.randn(16, 16, generator=g, requires_grad=True)
        with at.saved_tensors(policy=policy):
            y = (torch.tanh(a @ m) ** 2).sum()
        if refused:
            expect_error(lambda: torch.autograd.grad(y, a, create_graph=True), RuntimeError, "create_graph")
        else:
            (ga,) = torch.autograd.grad(y, a, create_graph=True)
            ga.sum().backward()
            b = a.detach().clone().requires_grad_(True)
            (gb,) = torch.autograd.grad((torch.tanh(b @ m) ** 2).sum(), b, create_graph=True)
            gb.sum().backward()
            assert torch.equal(a.grad, b.grad)
    # acgc's widths come from actlab's own training loop: refused at once, not coded at a fixed width.
    expect_error(lambda: at.saved_tensors(policy="acgc:E=0,I=100,G=256").__enter__(), RuntimeError, "acgc")
    expect_error(lambda: actlab.pack(maps((2, 8)), "acgc:E=0,I=100,G=256"), RuntimeError, "training loop")
    # The block pool keeps freed packs for the next step until empty_cache gives them back.
    del conv, st
    actlab.empty_cache()
    assert "reserved       0.00 MiB" in actlab.memory_stats(), actlab.memory_stats()


def _swap_step_in_a_child(queue):
    import torch
    import actlab.torch as at
    w = torch.randn(16, 16, requires_grad=True)
    with at.saved_tensors("swap:P=2"):
        h = torch.randn(8, 16)
        for _ in range(4):
            h = torch.tanh(h @ w)
    h.sum().backward()
    queue.put(float(w.grad.abs().sum()))


@case
def the_adapter_frees_graphs_dropped_without_backward_keeps_broadcasts_small_and_swaps_in_forked_children():
    if not torch_or_skip():
        return
    import gc
    import multiprocessing
    import weakref
    import torch
    import torch.nn.functional as F
    import actlab.torch as at
    g = torch.Generator().manual_seed(4)
    # A kept save of an op's own output (log_softmax's) held with its grad_fn made a cycle through autograd's
    # C++ nodes: a graph dropped without a backward (a skipped step, retain_graph=True) was never freed.
    lin, head = torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 16, (8,), generator=g)
    for policy, backward in (("division:B=8,Q=2", False), ("exact", True)):
        with at.saved_tensors(policy):
            score = torch.tanh(head(x))  # (8, 1): kept as it is, tanh's own output
            loss = F.cross_entropy(lin(x), y) + score.sum()
        if backward:
            loss.backward(retain_graph=True)
        alive = weakref.ref(score)
        del score, loss
        gc.collect()
        assert alive() is None, "the graph of a %s block outlived its last reference" % policy
    # A broadcast save (an SE gate's expand) is kept or packed at its source's size, as PyTorch keeps it, and
    # gives PyTorch's gradients under exact.
    xs = torch.randn(4, 8, 6, 6, generator=g, requires_grad=True)
    s = torch.randn(4, 8, 1, 1, generator=g, requires_grad=True)
    (xs * 1.0 * torch.sigmoid(s * 1.0).expand_as(xs)).sum().backward()
    plain = (xs.grad.clone(), s.grad.clone())
    xs.grad = s.grad = None
    with at.saved_tensors("exact") as st:
        gate = torch.sigmoid(s * 1.0).expand_as(xs)
        out = xs * 1.0 * gate
    out.sum().backward()
    assert torch.equal(xs.grad, plain[0]) and torch.equal(s.grad, plain[1])
    assert st.raw_bytes == 4 * 8 * 6 * 6 * 4, st  # xs * 1.0 only: the gate is kept at its (4, 8, 1, 1)
    wide = torch.randn(4, 1, 16, generator=g, requires_grad=True)
    other = torch.randn(4, 32, 16, generator=g, requires_grad=True)
    with at.saved_tensors("division:B=8,Q=2") as st:
        out = (other * 1.0 * (wide * 1.0).expand(4, 32, 16)).sum()
    out.backward()
    assert st.packs == 2 and st.raw_bytes == (4 * 32 * 16 + 4 * 16) * 4, st  # the broadcast at its (4, 1, 16)
    assert wide.grad.shape == wide.shape and bool(torch.isfinite(wide.grad).all())
    # SWAP in a forked child after the parent used the same policy string: the parent's copy thread does not
    # exist in the child (its first unpack waited for it forever).
    _swap_step_in_a_child(multiprocessing.Queue())
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_swap_step_in_a_child, args=(queue,))
    child.start()
    child.join(60)
    hung = child.is_alive()
    if hung:
        child.kill()
    assert not hung, "a forked child hung in a swap backward"
    assert child.exitcode == 0 and queue.get(timeout=5) > 0


# ---------------------------------------------------------------- the models against torchvision's
def write_safetensors(path, tensors):
    """A plain safetensors writer (numpy only: not actlab's): int64 tensors as I64, the rest as F32."""
    import json
    import struct
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        a = value.detach().cpu().numpy()
        a = np.ascontiguousarray(a if a.dtype == np.int64 else a.astype(np.float32))
        dtype = "I64" if a.dtype == np.int64 else "F32"
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def torchvision_or_skip():
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        return True
    except ImportError as e:
        print("SKIPPED: missing prerequisite: torchvision (%s): the model comparisons do not run" % e)
        return False


def assert_same_logits(net, weights, model, x, classes):
    """torch `net` (in eval mode) and actlab's `model` loaded with the state dict `weights` give the same
    logits for the images x, to float rounding."""
    import tempfile
    import torch
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    with tempfile.TemporaryDirectory() as d:
        write_safetensors(d + "/w.safetensors", weights)
        got = actlab.forward(model, x, weights=d + "/w.safetensors", classes=classes)
    assert got.shape == want.shape, (model, got.shape)
    err = np.abs(got - want).max()
    assert err < 1e-4 * max(1.0, np.abs(want).max()), (model, err)


def randomize_batch_norms(net):
    """Random running statistics and affine parameters, so that an eval-mode BN is not the identity and
    a misplaced or missing one changes the logits."""
    import torch
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def torchvision_state_dict(net):
    """net's state dict without the num_batches_tracked counters, which actlab keeps none of."""
    return {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}


@case
def swin_t_computes_torchvisions_swin_t():
    # The same weights in both (torchvision's state dict minus its constant relative_position_index
    # buffers, which actlab derives), the same images: the same logits to float rounding.
    if not torchvision_or_skip():
        return
    import torch
    import torchvision
    torch.manual_seed(0)
    net = torchvision.models.swin_t().eval()
    weights = {k: v for k, v in net.state_dict().items() if not k.endswith("relative_position_index")}
    assert_same_logits(net, weights, "swin_t", maps((2, 3, 224, 224), 5), 1000)


@case
def densenet121_imagenet_computes_torchvisions_densenet121():
    # torchvision's state dict loads by name unchanged, and the same images give the same logits: at
    # 64x64 with 3 channels and 1000 classes, and with a 1-channel stem and 7 classes at 32x32.
    if not torchvision_or_skip():
        return
    import torch
    import torchvision
    torch.manual_seed(2)
    for channels, size, classes in ((3, 64, 1000), (1, 32, 7)):
        net = torchvision.models.densenet121(num_classes=classes)
        if channels != 3:
            net.features.conv0 = torch.nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
        randomize_batch_norms(net)
        net.eval()
        assert_same_logits(net, torchvision_state_dict(net), "densenet121_imagenet",
                           maps((2, channels, size, size), 7), classes)


@case
def densenet121_is_torchvisions_densenet121_with_a_cifar_stem():
    # actlab's CIFAR variant is torchvision's network with conv0 a 3x3 stride-1 conv and no norm0, relu0
    # or pool0 (models/densenet.h): built so in torch, it loads by name and agrees at 32x32.
    if not torchvision_or_skip():
        return
    import torch
    import torchvision
    torch.manual_seed(3)
    net = torchvision.models.densenet121(num_classes=10)
    net.features.conv0 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    for name in ("norm0", "relu0", "pool0"):
        delattr(net.features, name)
    randomize_batch_norms(net)
    net.eval()
    assert_same_logits(net, torchvision_state_dict(net), "densenet121", maps((2, 3, 32, 32), 8), 10)


def torchvision_vit_to_timm(name):
    """A torchvision VisionTransformer state-dict name -> actlab's (timm's): conv_proj -> patch_embed.proj,
    class_token -> cls_token, encoder.pos_embedding -> pos_embed, encoder.layers.encoder_layer_i -> blocks.i with
    ln_1/ln_2 -> norm1/norm2, self_attention.in_proj_* -> attn.qkv.*, self_attention.out_proj -> attn.proj,
    mlp.0/3 -> mlp.fc1/fc2, encoder.ln -> norm, heads.head -> head. (scripts/torch-vit-step-parity.py uses it.)"""
    names = {"conv_proj.weight": "patch_embed.proj.weight", "conv_proj.bias": "patch_embed.proj.bias",
             "class_token": "cls_token", "encoder.pos_embedding": "pos_embed", "encoder.ln.weight": "norm.weight",
             "encoder.ln.bias": "norm.bias", "heads.head.weight": "head.weight", "heads.head.bias": "head.bias"}
    if name in names:
        return names[name]
    parts = {"ln_1": "norm1", "ln_2": "norm2", "self_attention.in_proj_weight": "attn.qkv.weight",
             "self_attention.in_proj_bias": "attn.qkv.bias", "self_attention.out_proj": "attn.proj",
             "mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2"}
    prefix = "encoder.layers.encoder_layer_"
    assert name.startswith(prefix), name
    block, rest = name[len(prefix):].split(".", 1)
    for a, b in parts.items():
        if rest.startswith(a):
            rest = b + rest[len(a):]
            break
    return "blocks.%s.%s" % (block, rest)


@case
def vit_tiny_cifar_computes_torchvisions_vision_transformer():
    # torchvision's VisionTransformer of the same configuration, its names mapped to timm's (actlab's).
    if not torchvision_or_skip():
        return
    import torch
    import torchvision
    torch.manual_seed(1)
    net = torchvision.models.VisionTransformer(image_size=32, patch_size=4, num_layers=12, num_heads=3,
                                               hidden_dim=192, mlp_dim=768, num_classes=10).eval()
    weights = {torchvision_vit_to_timm(k): v for k, v in net.state_dict().items()}
    assert_same_logits(net, weights, "vit_tiny_cifar", maps((3, 3, 32, 32), 6), 10)


def main():
    failed = 0
    for f in CASES:
        try:
            f()
            print("ok   " + f.__name__)
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            failed += 1
            print("FAIL " + f.__name__)
            traceback.print_exc()
    print("%d passed, %d failed" % (len(CASES) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
