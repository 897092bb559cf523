"""The CUDA driver API through ctypes: device queries and the IPC peer-write probe.

Standard library only (the doctor ships inside the plugin wheel and must run without
torch, nvcc or a package index).  It only ever queries attributes, allocates ordinary
device memory and opens CUDA IPC handles; it never creates multicast objects.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1

#: A store kernel in PTX, JIT-compiled by the driver (no nvcc): dst[i] = i ^ seed.
#: ISA 7.0 / sm_75 is the oldest the CUDA 13 driver still JITs; it runs on every newer GPU.
WRITE_KERNEL_PTX = b"""\
.version 7.0
.target sm_75
.address_size 64

.visible .entry sm120fork_peer_write(
    .param .u64 dst,
    .param .u32 n,
    .param .u32 seed
)
{
    .reg .pred %p;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [dst];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [seed];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p, %r6, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r6, 4;
    add.s64 %rd2, %rd2, %rd3;
    xor.b32 %r3, %r6, %r2;
    st.volatile.global.u32 [%rd2], %r3;
    membar.sys;
DONE:
    ret;
}
"""
KERNEL_NAME = b"sm120fork_peer_write"


class CudaError(RuntimeError):
    """A driver call failed; the message names the call and CUDA's error name."""


class IpcHandle(ctypes.Structure):
    # c_ubyte, not c_char: a c_char array field reads back cut at its first NUL byte.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


@dataclass(frozen=True, kw_only=True)
class Device:
    index: int
    name: str
    capability: tuple[int, int]
    multicast: bool | None      # None: the driver does not know the attribute


class Driver:
    """``libcuda`` with the few calls the doctor needs; raises ``CudaError``."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise CudaError(f"no NVIDIA driver: cannot load {library} ({exc})") from exc
        self._check("cuInit", self.lib.cuInit(0))

    def _check(self, call: str, result: int) -> None:
        if result == 0:
            return
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(result, ctypes.byref(name))
        label = name.value.decode() if name.value else f"error {result}"
        raise CudaError(f"{call} failed: {label}")

    def version(self) -> int:
        value = ctypes.c_int()
        self._check("cuDriverGetVersion", self.lib.cuDriverGetVersion(ctypes.byref(value)))
        return value.value

    def count(self) -> int:
        value = ctypes.c_int()
        self._check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(value)))
        return value.value

    def _device(self, index: int) -> ctypes.c_int:
        dev = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), index))
        return dev

    def attribute(self, index: int, attribute: int) -> int:
        value = ctypes.c_int()
        self._check("cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute(
            ctypes.byref(value), attribute, self._device(index)))
        return value.value

    def device(self, index: int) -> Device:
        buf = ctypes.create_string_buffer(256)
        self._check("cuDeviceGetName", self.lib.cuDeviceGetName(buf, 256, self._device(index)))
        major = self.attribute(index, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(index, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        try:
            multicast: bool | None = bool(
                self.attribute(index, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED))
        except CudaError:
            multicast = None
        return Device(index=index, name=buf.value.decode(), capability=(major, minor),
                      multicast=multicast)

    def can_access_peer(self, a: int, b: int) -> bool:
        value = ctypes.c_int()
        self._check("cuDeviceCanAccessPeer", self.lib.cuDeviceCanAccessPeer(
            ctypes.byref(value), self._device(a), self._device(b)))
        return bool(value.value)

    # --- what the IPC probe's processes do -----------------------------------------------

    def use(self, index: int) -> None:
        ctx = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain",
                    self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self._device(index)))
        self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))

    def alloc_zeroed(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._check("cuMemAlloc",
                    self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)))
        self._check("cuMemsetD32", self.lib.cuMemsetD32_v2(
            ctypes.c_uint64(ptr.value), ctypes.c_uint(0), ctypes.c_size_t(nbytes // 4)))
        self.synchronize()
        return ptr.value

    def ipc_handle(self, ptr: int) -> bytes:
        handle = IpcHandle()
        self._check("cuIpcGetMemHandle",
                    self.lib.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(ptr)))
        return bytes(handle.reserved)

    def ipc_open(self, handle: bytes) -> int:
        ptr = ctypes.c_uint64()
        value = IpcHandle.from_buffer_copy(handle)
        self._check("cuIpcOpenMemHandle", self.lib.cuIpcOpenMemHandle_v2(
            ctypes.byref(ptr), value, ctypes.c_uint(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
        return ptr.value

    def write_pattern(self, ptr: int, count: int, seed: int) -> None:
        """Run the store kernel on the current device into ``ptr`` (maybe a peer's memory)."""
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuModuleLoadData",
                    self.lib.cuModuleLoadData(ctypes.byref(module), WRITE_KERNEL_PTX))
        self._check("cuModuleGetFunction", self.lib.cuModuleGetFunction(
            ctypes.byref(function), module, KERNEL_NAME))
        dst, n, s = ctypes.c_uint64(ptr), ctypes.c_uint32(count), ctypes.c_uint32(seed)
        params = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                         for v in (dst, n, s)))
        block = 256
        self._check("cuLaunchKernel", self.lib.cuLaunchKernel(
            function, (count + block - 1) // block, 1, 1, block, 1, 1, 0, None, params, None))
        self.synchronize()

    def read_u32(self, ptr: int, count: int) -> list[int]:
        host = (ctypes.c_uint32 * count)()
        self._check("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(
            host, ctypes.c_uint64(ptr), ctypes.c_size_t(count * 4)))
        return list(host)

    def synchronize(self) -> None:
        self._check("cuCtxSynchronize", self.lib.cuCtxSynchronize())
