"""bitroll.torch.moe_ops: gradcheck of route and combine (float64) and of RoPE on Llama 3
tables, the float32 kernels against the float64 reference, and typed errors.

route's weights are differentiated through the softmax (and the top-k normalisation) at fixed
expert ids; combine through the weights, the expert outputs, the shared expert and its gate.
Negative control: a wrong backward (combine's weight gradient halved) must fail gradcheck.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

tc.args()
tc.require_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.autograd import gradcheck  # noqa: E402

from bitroll.torch import moe_ops  # noqa: E402

c = tc.Checks()
g = torch.Generator().manual_seed(3)


def rnd(*shape):
    grad = shape[-1] is True
    shape = shape[:-1] if grad else shape
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


def grad_ok(name, fn, inputs):
    try:
        ok = gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)
    except RuntimeError as e:
        print(str(e)[:300])
        ok = False
    return ok


n, e, k, d = 5, 6, 2, 4
forced = torch.tensor([[0, 3], [5, 1], [2, 4], [1, 0], [3, 2]])
for norm in (True, False):
    c.check(grad_ok("route", lambda x: moe_ops.route(x, k, norm)[1], (rnd(n, e, True),)),
            f"gradcheck route (norm_topk_prob {norm})")
    c.check(grad_ok("route", lambda x: moe_ops.route(x, k, norm, forced)[1], (rnd(n, e, True),)),
            f"gradcheck route with forced ids (norm_topk_prob {norm})")
c.check(grad_ok("combine", moe_ops.combine, (rnd(n, k, True), rnd(n, k, d, True))),
        "gradcheck combine")
c.check(grad_ok("combine", moe_ops.combine, (rnd(n, k, True), rnd(n, k, d, True),
                                             rnd(n, True), rnd(n, d, True))),
        "gradcheck combine with a shared expert")

# RoPE on the engine's Llama 3 tables (rope_tables): gradcheck, and float32 == float64.
from bitroll.torch import ops  # noqa: E402
tables = ops.rope_tables(500000.0, 8, 32, 8.0, 1.0, 4.0, 16)
plain = ops.rope_tables(500000.0, 8, 32)
pos = torch.tensor([0, 5, 31, 7], dtype=torch.int32)
c.check(grad_ok("rope", lambda x: ops.rope(x, pos, 500000.0, False, tables),
                (rnd(4, 2, 8, True),)), "gradcheck rope with llama3 tables")
xr = rnd(4, 2, 8)
c.check(torch.allclose(ops.rope(xr.float(), pos, 5e5, False, tables).double(),
                       ops.rope(xr, pos, 5e5, False, tables), atol=1e-6) and
        not torch.equal(tables[0], plain[0]),
        "rope with llama3 tables: float32 kernel == float64 reference; scaling changes the table")
c.check(torch.equal(ops.rope(xr.float(), pos, 5e5, False, plain),
                    ops.rope(xr.float(), pos, 5e5, False)),
        "rope with unscaled tables == rope at theta (bitwise)")

# Negative control: a backward that is wrong must fail gradcheck.
orig = moe_ops._Combine.backward
moe_ops._Combine.backward = staticmethod(lambda ctx, gr: tuple(
    None if t is None else t * (0.5 if i == 0 else 1.0) for i, t in enumerate(orig(ctx, gr))))
c.check(not grad_ok("combine", moe_ops.combine, (rnd(n, k, True), rnd(n, k, d, True))),
        "negative control: a halved weight gradient fails gradcheck")
moe_ops._Combine.backward = orig

# float32 kernels against the float64 reference.
x = rnd(40, 8) * 2
for norm in (True, False):
    i32, w32 = moe_ops.route(x.float(), 2, norm)
    i64, w64 = moe_ops.route(x, 2, norm)
    c.check(torch.equal(i32, i64) and torch.allclose(w32.double(), w64, atol=1e-6),
            f"route float32 kernel == float64 reference (norm_topk_prob {norm})")
    fi, fw = moe_ops.route(x.float(), 2, norm, i32)
    c.check(torch.equal(fi, i32) and np.array_equal(fw.numpy().view(np.uint32),
                                                     w32.numpy().view(np.uint32)),
            "route forced at its own ids: the same weight bits")
ws, ys, gt, sh = rnd(40, 2), rnd(40, 2, 8), rnd(40), rnd(40, 8)
y32 = moe_ops.combine(ws.float(), ys.float(), gt.float(), sh.float())
c.check(torch.allclose(y32.double(), moe_ops.combine(ws, ys, gt, sh), atol=1e-5),
        "combine float32 kernel == float64 reference")
# Ties go to the lowest id.
tie = torch.zeros(1, 4)
c.check(moe_ops.route(tie, 2, True)[0].tolist() == [[0, 1]], "route ties: lowest ids first")

for what, fn in (("forced id out of range",
                  lambda: moe_ops.route(x.float(), 2, True, torch.full((40, 2), 8))),
                 ("forced ids of the wrong shape",
                  lambda: moe_ops.route(x.float(), 2, True, torch.zeros(40, 3, dtype=torch.long))),
                 ("k > n_experts", lambda: moe_ops.route(x.float(), 9, True))):
    try:
        fn()
        c.check(False, f"{what}: no ValueError")
    except ValueError as err:
        c.check(True, f"{what}: ValueError ({err})")
c.done()
