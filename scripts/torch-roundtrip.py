#!/usr/bin/python3
"""Weights both ways between actlab and PyTorch (needs Debian's python3-torch and python3-torchvision).

    scripts/torch-roundtrip.py BUILD_DIR WORK_DIR [TEST_IMAGES]

1. actlab trains ResNet-18 (torchvision layout, 1 input channel) on Fashion-MNIST for one short epoch
   and writes --export-weights a.safetensors;
2. PyTorch loads it into torchvision.models.resnet18 with load_state_dict(strict=True), evaluates the
   same test images, and writes its own state_dict to b.safetensors with the writer below (numpy only:
   an independent writer of the format, not actlab's);
3. actlab evaluates a.safetensors and b.safetensors (--init-weights, --eval-only).
Prints the three test accuracies; they must agree (PyTorch's to the last image, as float rounding of a
different convolution order permits; actlab's two exactly). Exit status 0 when they do.
"""
import gzip
import json
import re
import struct
import subprocess
import sys

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:  # CTest reports this line as a skip (CMakeLists.txt)
    print("SKIPPED: missing prerequisite: %s (scripts/setup.sh --python installs it)" % e)
    sys.exit(0)

build, work = sys.argv[1], sys.argv[2]
n_test = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        begin, end = v["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[begin:end], DTYPES[v["dtype"]]).reshape(v["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    names = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        b = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def actlab(*args):
    out = subprocess.run([build + "/actlab-train", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("actlab-train failed: " + out.stderr.strip())
    return out.stdout


def actlab_accuracy(weights):
    out = actlab("--model", "resnet18_imagenet", "--init-weights", weights, "--eval-only", "--test-limit", str(n_test))
    return float(re.search(r"accuracy ([0-9.]+)%", out).group(1))


a, b = work + "/a.safetensors", work + "/b.safetensors"
actlab("--model", "resnet18_imagenet", "--train-limit", "4096", "--test-limit", str(n_test), "--quiet",
       "--export-weights", a, "--overwrite")

model = torchvision.models.resnet18(num_classes=10)
model.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
print("PyTorch load_state_dict(strict=True):", model.load_state_dict(read_safetensors(a), strict=True))
d = "/usr/share/datasets/fashion-mnist/"
images = np.frombuffer(gzip.open(d + "t10k-images-idx3-ubyte.gz").read()[16:], np.uint8).reshape(-1, 1, 28, 28)
labels = np.frombuffer(gzip.open(d + "t10k-labels-idx1-ubyte.gz").read()[8:], np.uint8)
x = (torch.from_numpy(images[:n_test].astype(np.float32) / 255.0) - 0.2860) / 0.3530  # actlab's normalization
model.eval()
with torch.no_grad():
    torch_acc = 100.0 * float((model(x).argmax(1).numpy() == labels[:n_test]).mean())
write_safetensors(b, model.state_dict())

acc_a, acc_b = actlab_accuracy(a), actlab_accuracy(b)
print(f"test accuracy on {n_test} images: actlab {acc_a:.2f}%, PyTorch {torch_acc:.2f}%, "
      f"actlab after the PyTorch round trip {acc_b:.2f}%")
ok = acc_a == acc_b and abs(acc_a - torch_acc) <= 100.0 / n_test
print("round trip:", "ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
