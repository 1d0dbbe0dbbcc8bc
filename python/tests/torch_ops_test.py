"""bitroll.torch.ops: gradcheck of every op (float64), the float32 kernels against the float64
reference, bitwise invariance of the kernels to packing and threads, and typed errors.

gradcheck runs each op's hand-written backward against the numerical derivative of its float64
forward (plain PyTorch math, the same function as the kernel's). A second check shows that the
float32 kernel computes that function (close to the float64 reference), so the backward is the
derivative of what the kernel computes, up to float32 rounding.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

tc.args()
tc.require_torch()

import torch  # noqa: E402
from torch.autograd import gradcheck  # noqa: E402

from bitroll.torch import ops  # noqa: E402

c = tc.Checks()
g = torch.Generator().manual_seed(1)


def rnd(*shape, dtype=torch.float64, scale=1.0, requires_grad=False):
    t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    return t.requires_grad_(requires_grad)


def grad_ok(name, fn, inputs):
    try:
        ok = gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)
    except RuntimeError as e:
        print(e)
        ok = False
    c.check(ok, f"gradcheck {name}")


def close(name, f32, f64, tol):
    err = (f32.double() - f64).abs().max().item()
    c.check(err <= tol, f"{name}: float32 kernel vs float64 reference, max |diff| {err:.2e} "
            f"<= {tol:g}")


# ---- gradcheck, float64 --------------------------------------------------------------------
x, w, b = rnd(5, 7, requires_grad=True), rnd(6, 7, requires_grad=True), rnd(6, requires_grad=True)
grad_ok("linear", ops.linear, (x, w, b))
grad_ok("linear (no bias, 3-d x)", lambda x, w: ops.linear(x, w),
        (rnd(2, 3, 7, requires_grad=True), w))
grad_ok("rms_norm", lambda x, w: ops.rms_norm(x, w, 1e-5),
        (rnd(4, 8, requires_grad=True), rnd(8, requires_grad=True)))
pos = torch.tensor([0, 1, 2, 7, 30], dtype=torch.int32)
for inter in (True, False):
    grad_ok(f"rope interleaved={inter}", lambda x: ops.rope(x, pos, 10000.0, inter),
            (rnd(5, 3, 8, requires_grad=True),))
grad_ok("swiglu", ops.swiglu, (rnd(4, 9, requires_grad=True), rnd(4, 9, requires_grad=True)))
cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)  # three sequences: 3, 1, 5 rows
q, k, v = (rnd(9, 4, 6, requires_grad=True), rnd(9, 2, 6, requires_grad=True),
           rnd(9, 2, 6, requires_grad=True))
grad_ok("attention (GQA, packed)", lambda q, k, v: ops.attention(q, k, v, cu), (q, k, v))
for t in (1.0, 0.7, 0.0):
    grad_ok(f"log_softmax T={t}", lambda x: ops.log_softmax(x, t),
            (rnd(3, 11, requires_grad=True),))

# ---- the float32 kernels compute the reference function ----------------------------------
x64, w64, b64 = rnd(33, 64), rnd(40, 64), rnd(40)
close("linear", ops.linear(x64.float(), w64.float(), b64.float()), ops.linear(x64, w64, b64), 1e-4)
x64, n64 = rnd(33, 64), rnd(64)
close("rms_norm", ops.rms_norm(x64.float(), n64.float()), ops.rms_norm(x64, n64), 1e-5)
x64 = rnd(40, 4, 16)
p40 = torch.arange(40, dtype=torch.int32) * 7
for inter in (True, False):
    close(f"rope interleaved={inter}", ops.rope(x64.float(), p40, 10000.0, inter),
          ops.rope(x64, p40, 10000.0, inter), 1e-5)
a64, u64 = rnd(33, 50, scale=3), rnd(33, 50)
close("swiglu", ops.swiglu(a64.float(), u64.float()), ops.swiglu(a64, u64), 1e-5)
cu = torch.tensor([0, 17, 18, 70, 103], dtype=torch.int32)
q64, k64, v64 = rnd(103, 8, 16), rnd(103, 4, 16), rnd(103, 4, 16)
att32 = ops.attention(q64.float(), k64.float(), v64.float(), cu)
close("attention", att32, ops.attention(q64, k64, v64, cu), 1e-5)
l64 = rnd(9, 512, scale=4)
for t in (1.0, 0.8, 0.0):
    close(f"log_softmax T={t}", ops.log_softmax(l64.float(), t), ops.log_softmax(l64, t), 1e-5)

# ---- the float32 backwards (bitroll's matmul, C++ attention) against the float64 ones -----
def grads(fn, inputs):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
    return [x.grad for x in leaves]


for name, fn, inputs in [
        ("linear", lambda x, w: ops.linear(x, w), (rnd(33, 64), rnd(40, 64))),
        ("attention", lambda q, k, v: ops.attention(q, k, v, cu), (q64, k64, v64))]:
    g32 = grads(fn, [x.float() for x in inputs])
    g64 = grads(fn, inputs)
    err = max(((a.double() - b).abs().max() / b.abs().max()).item() for a, b in zip(g32, g64))
    c.check(err <= 1e-5, f"{name}: float32 backward vs float64 backward, max relative "
            f"difference {err:.2e} <= 1e-5")
    ops.set_num_threads(2)
    g32b = grads(fn, [x.float() for x in inputs])
    ops.set_num_threads(1)
    same = all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(g32, g32b))
    c.check(same, f"{name}: float32 backward on 2 threads agrees with 1 thread")

# ---- bitwise: packing and threads never change a bit --------------------------------------
q32, k32, v32 = q64.float(), k64.float(), v64.float()
alone = torch.cat([ops.attention(q32[a:b], k32[a:b], v32[a:b],
                                 torch.tensor([0, b - a], dtype=torch.int32))
                   for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
c.check(torch.equal(alone.view(torch.int32), att32.view(torch.int32)),
        "attention: each sequence alone == packed together, bit for bit")
rev = [(a, b) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())][::-1]
perm = torch.cat([torch.arange(a, b) for a, b in rev])
cu_rev = torch.tensor([0] + list(torch.cumsum(torch.tensor([b - a for a, b in rev]), 0)),
                      dtype=torch.int32)
att_rev = ops.attention(q32[perm], k32[perm], v32[perm], cu_rev)
c.check(torch.equal(att_rev.view(torch.int32), att32[perm].view(torch.int32)),
        "attention: sequences in reverse order, bit for bit")
x32, w32 = rnd(37, 64).float(), rnd(100, 64).float()
y1 = ops.linear(x32, w32)
y_rows = torch.cat([ops.linear(x32[i:i + 1], w32) for i in range(37)])
c.check(torch.equal(y1.view(torch.int32), y_rows.view(torch.int32)),
        "linear: 37 rows at once == one row at a time, bit for bit")
ops.set_num_threads(2)
att2 = ops.attention(q32, k32, v32, cu)
y2 = ops.linear(x32, w32)
ops.set_num_threads(1)
c.check(torch.equal(att2.view(torch.int32), att32.view(torch.int32)) and
        torch.equal(y2.view(torch.int32), y1.view(torch.int32)),
        "attention and linear: 2 threads == 1 thread, bit for bit")

# ---- Python threads may share the kernels (one pool, one mutex) -------------------------
import threading  # noqa: E402

ops.set_num_threads(2)
results = []


def worker():
    for _ in range(10):
        results.append(torch.equal(ops.attention(q32, k32, v32, cu).view(torch.int32),
                                   att32.view(torch.int32)) and
                       torch.equal(ops.linear(x32, w32).view(torch.int32), y1.view(torch.int32)))


threads = [threading.Thread(target=worker) for _ in range(3)]
for t in threads:
    t.start()
for n in (1, 2, 1, 2):
    ops.set_num_threads(n)
for t in threads:
    t.join()
ops.set_num_threads(1)
c.check(len(results) == 30 and all(results),
        "3 Python threads calling ops while the thread count changes: same bits every time")

# ---- typed errors --------------------------------------------------------------------------
for name, fn, exc in [
        ("mixed dtypes", lambda: ops.linear(x32, w64), TypeError),
        ("int tensor", lambda: ops.rms_norm(torch.ones(2, 3, dtype=torch.int32),
                                            torch.ones(3, dtype=torch.int32)), TypeError),
        ("linear shapes", lambda: ops.linear(rnd(2, 5).float(), rnd(3, 4).float()), ValueError),
        ("rope odd head_dim", lambda: ops.rope(rnd(2, 1, 3).float(),
                                               torch.zeros(2, dtype=torch.int32)), ValueError),
        ("attention cu_seqlens", lambda: ops.attention(
            q32, k32, v32, torch.tensor([0, 5], dtype=torch.int32)), ValueError),
        ("negative temperature", lambda: ops.log_softmax(l64.float(), -1.0), ValueError),
        ("threads 0", lambda: ops.set_num_threads(0), ValueError)]:
    try:
        fn()
        c.check(False, f"error: {name} raised nothing")
    except exc as e:
        c.check(True, f"error: {name} -> {type(e).__name__}: {str(e)[:70]}")
c.done()
