"""Weights from a trainer to every replica over NCCL (docs/weights_nccl.md).

broadcast_weights_nccl(client, tensors, version, device, drain, timeout_ms): `tensors` is a list
of (name, tensor) where tensor is a numpy array (uploaded here; bfloat16 as (uint16 bits,
"bf16")) or, when torch imports, a CUDA torch.Tensor on `device` (its data_ptr() is broadcast in
place, never written). The protocol is the C++ sender's (rollout/nccl_weight_sender.h): status ->
n live replicas; ncclGetUniqueId; begin_update_weights_nccl(unique id, n + 1, manifest, version,
drain); join as rank 0 with a non-blocking communicator, polling the reply meanwhile (an error
reply aborts); one ncclBroadcast per tensor (numel * dtype size bytes, ncclUint8, root 0); wait
for the reply. examples/python/nccl_update_weights.py is a command line around it.

NCCL and the CUDA runtime are reached through ctypes (libnccl.so.2, libcudart.so): no torch
needed. Not imported by `import bitroll`: `from bitroll.nccl import broadcast_weights_nccl`.
"""

import ctypes
import ctypes.util
import time

import numpy as np

from .errors import BitrollError

try:  # optional: CUDA torch tensors are accepted as they are
    import torch  # noqa: F401
except Exception:  # noqa: BLE001 (any import failure means "no torch")
    torch = None

# ---- NCCL and CUDA runtime through ctypes ----

NCCL_SUCCESS = 0
NCCL_IN_PROGRESS = 7
NCCL_UINT8 = 1
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CUDA_MEMCPY_HOST_TO_DEVICE = 1
INT_MIN = -(2 ** 31)


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class NcclConfig(ctypes.Structure):
    """The leading fields of ncclConfig_t as of NCCL 2.17: NCCL reads `size` bytes of it and
    gives every later field its default (src/init.cc parseCommConfig), so this prefix works with
    any NCCL >= 2.17."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int),
                ("minCTAs", ctypes.c_int), ("maxCTAs", ctypes.c_int),
                ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int)]

    @classmethod
    def non_blocking(cls):
        c = cls()
        c.size = ctypes.sizeof(cls)
        c.magic = 0xCAFEBEEF
        c.version = 21700  # NCCL_VERSION(2, 17, 0)
        c.blocking = 0
        c.cgaClusterSize = c.minCTAs = c.maxCTAs = c.splitShare = INT_MIN
        c.netName = None
        return c


def _load(names, what):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    raise BitrollError("unavailable", f"{what} not found (tried {', '.join(names)})")


class Cuda:
    """The few CUDA runtime and NCCL calls the broadcast needs; errors become BitrollError."""

    def __init__(self):
        found = ctypes.util.find_library("cudart")
        self.rt = _load(([found] if found else []) +
                        ["libcudart.so", "libcudart.so.13", "libcudart.so.12",
                         "/usr/local/cuda/lib64/libcudart.so"], "the CUDA runtime (libcudart)")
        self.nccl = _load(["libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib/libnccl.so.2",
                           "/usr/local/cuda/lib64/libnccl.so.2"], "NCCL (libnccl.so.2)")
        self.rt.cudaGetErrorString.restype = ctypes.c_char_p
        self.nccl.ncclGetErrorString.restype = ctypes.c_char_p
        self.nccl.ncclGetLastError.restype = ctypes.c_char_p
        self.nccl.ncclCommInitRankConfig.argtypes = [
            ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclUniqueId, ctypes.c_int,
            ctypes.POINTER(NcclConfig)]
        self.nccl.ncclBroadcast.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p]
        for f in ("ncclCommGetAsyncError", "ncclCommAbort", "ncclCommFinalize",
                  "ncclCommDestroy"):
            getattr(self.nccl, f).argtypes = [ctypes.c_void_p] + (
                [ctypes.POINTER(ctypes.c_int)] if f == "ncclCommGetAsyncError" else [])

    def check(self, call, err):
        if err != CUDA_SUCCESS:
            msg = self.rt.cudaGetErrorString(err).decode()
            raise BitrollError("internal", f"NCCL weight update: {call} -> {err} ({msg})")

    def nccl_check(self, call, r, comm=None):
        if r not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
            last = self.nccl.ncclGetLastError(comm) or b""
            raise BitrollError("internal", f"NCCL weight update: {call} -> "
                               f"{self.nccl.ncclGetErrorString(r).decode()} ({last.decode()})")
        return r

    def require_device(self, device):
        n = ctypes.c_int(0)
        err = self.rt.cudaGetDeviceCount(ctypes.byref(n))
        if err != CUDA_SUCCESS:
            raise BitrollError("unavailable", "no CUDA device: cudaGetDeviceCount -> "
                               f"{self.rt.cudaGetErrorString(err).decode()}")
        if n.value <= device:
            raise BitrollError("unavailable", f"no CUDA device: device {device} requested, "
                               f"{n.value} present")
        self.check("cudaSetDevice", self.rt.cudaSetDevice(device))


class DeviceMemory:
    """numpy arrays uploaded to the current device; freed by free()."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.ptrs = []

    def upload(self, a):
        a = np.ascontiguousarray(a)
        p = ctypes.c_void_p()
        self.cuda.check("cudaMalloc", self.cuda.rt.cudaMalloc(ctypes.byref(p),
                                                              ctypes.c_size_t(a.nbytes)))
        self.ptrs.append(p)
        self.cuda.check("cudaMemcpy", self.cuda.rt.cudaMemcpy(
            p, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes),
            CUDA_MEMCPY_HOST_TO_DEVICE))
        return p.value

    def free(self):
        for p in self.ptrs:
            self.cuda.rt.cudaFree(p)
        self.ptrs = []


# ---- the broadcast ----

_NP_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_DTYPE_SIZE = {"f32": 4, "f16": 2, "bf16": 2}


def _describe(name, t, memory):
    """((name, dtype, shape) manifest entry, device pointer, bytes) of one tensor."""
    if torch is not None and isinstance(t, torch.Tensor):
        if not t.is_cuda or not t.is_contiguous():
            raise BitrollError("invalid_argument", f"{name}: a contiguous CUDA tensor is needed")
        dtype = _TORCH_DTYPES.get(str(t.dtype))
        if dtype is None:
            raise BitrollError("invalid_argument", f"{name}: dtype {t.dtype} (f32/f16/bf16)")
        shape, ptr = list(t.shape), t.data_ptr()
    else:
        a, dtype = t, None
        if isinstance(t, tuple):  # (uint16 array of bfloat16 bits, "bf16")
            a, dtype = t
        a = np.ascontiguousarray(a)
        dtype = dtype or _NP_DTYPES.get(a.dtype)
        if dtype is None:
            raise BitrollError("invalid_argument", f"{name}: numpy dtype {a.dtype} "
                               "(float32, float16, or (uint16 bits, 'bf16'))")
        shape, ptr = list(a.shape), memory.upload(a)
    numel = int(np.prod(shape)) if shape else 1
    return (name, dtype, shape), ptr, numel * _DTYPE_SIZE[dtype]


def broadcast_weights_nccl(client, tensors, version, device=0, drain=False, timeout_ms=60000):
    """Broadcasts [(name, tensor)] to every live replica as weights `version`; returns the live
    version once every replica installed them. Raises BitrollError (the C++ sender's codes)."""
    if not tensors:
        raise BitrollError("invalid_argument", "NCCL weight update: no tensors to send")
    cuda = Cuda()
    cuda.require_device(device)
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize(device)  # the trainer's last writes are done
    memory = DeviceMemory(cuda)
    comm = ctypes.c_void_p()
    stream = ctypes.c_void_p()
    clean = False
    try:
        described = [_describe(n, t, memory) for n, t in tensors]
        replicas = sum(1 for r in client.status()["replicas"] if r["alive"])
        if replicas == 0:
            raise BitrollError("failed_precondition",
                               "NCCL weight update: the service has no live replica")
        cuda.check("cudaStreamCreate", cuda.rt.cudaStreamCreate(ctypes.byref(stream)))
        uid = NcclUniqueId()
        cuda.nccl_check("ncclGetUniqueId", cuda.nccl.ncclGetUniqueId(ctypes.byref(uid)))
        world = replicas + 1
        rid = client.begin_update_weights_nccl(bytes(uid.internal), world,
                                               [d[0] for d in described], version, drain)
        reply = []

        def poll_reply():  # raises the service's error; records its version
            if reply:
                return
            try:
                reply.append(client.wait_update_reply(rid, 0))
            except BitrollError as e:
                if e.code != "timeout":
                    raise

        def wait(done, what):
            deadline = time.monotonic() + timeout_ms / 1000.0
            while True:
                if done():
                    return
                poll_reply()
                if time.monotonic() >= deadline:
                    raise BitrollError("timeout", f"NCCL weight update: {what} within "
                                       f"{timeout_ms} ms")
                time.sleep(0.0002)

        def comm_ready(call):
            state = ctypes.c_int(NCCL_IN_PROGRESS)
            cuda.nccl_check("ncclCommGetAsyncError",
                            cuda.nccl.ncclCommGetAsyncError(comm, ctypes.byref(state)), comm)
            if state.value not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
                cuda.nccl_check(call, state.value, comm)
            return state.value == NCCL_SUCCESS

        def stream_done():
            err = cuda.rt.cudaStreamQuery(stream)
            if err == CUDA_ERROR_NOT_READY:
                comm_ready("ncclBroadcast")  # raises on an asynchronous NCCL error
                return False
            cuda.check("cudaStreamQuery", err)
            return True

        config = NcclConfig.non_blocking()
        cuda.nccl_check("ncclCommInitRankConfig", cuda.nccl.ncclCommInitRankConfig(
            ctypes.byref(comm), world, uid, 0, ctypes.byref(config)), comm)
        wait(lambda: comm_ready("ncclCommInitRankConfig"),
             f"the {replicas} replicas did not all join the communicator")
        for i, (entry, ptr, nbytes) in enumerate(described):
            r = cuda.nccl_check("ncclBroadcast", cuda.nccl.ncclBroadcast(
                ptr, ptr, nbytes, NCCL_UINT8, 0, comm, stream), comm)
            what = f"tensor {i} ({entry[0]}, {nbytes} bytes) was not received"
            if r == NCCL_IN_PROGRESS:
                wait(lambda: comm_ready("ncclBroadcast"), what)
            wait(stream_done, what)
        # Every byte was sent: tear down while waiting for the reply (abort if it lingers).
        if cuda.nccl.ncclCommFinalize(comm) in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
            try:
                wait(lambda: comm_ready("ncclCommFinalize"), "ncclCommFinalize did not complete")
                cuda.nccl.ncclCommDestroy(comm)
                clean = True
            except BitrollError:
                pass
        wait(lambda: bool(reply), "every tensor was sent but the service did not answer")
        return reply[0]
    finally:
        if comm.value and not clean:
            cuda.nccl.ncclCommAbort(comm)
        if stream.value:
            cuda.rt.cudaStreamDestroy(stream)
        memory.free()
