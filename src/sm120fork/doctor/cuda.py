"""The CUDA driver API through ctypes: device queries and what the peer probe does.

Standard library only (the doctor runs without torch or nvcc).  It never creates multicast
objects: it shares memory the two ways FlashInfer does (VMM exported as a POSIX FD; CUDA IPC).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TypeVar

from .facts import Device

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
# VMM (cuMemCreate) as FlashInfer's SymmDeviceMemory uses it on one node without multicast
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3

#: A grid-stride copy in PTX, JIT-compiled by the driver (no nvcc), 16 bytes a thread and
#: step: peer writes and reads are this kernel with a peer's memory on one side.
COPY_KERNEL_PTX = b"""\
.version 7.0
.target sm_75
.address_size 64

.visible .entry sm120fork_copy(
    .param .u64 dst,
    .param .u64 src,
    .param .u32 n
)
{
    .reg .pred %p;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u32 %r1, [n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    mov.u32 %r6, %nctaid.x;
    mul.lo.s32 %r6, %r6, %r3;
LOOP:
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd3, %r5, 16;
    add.s64 %rd4, %rd2, %rd3;
    add.s64 %rd5, %rd1, %rd3;
    ld.global.v4.u32 {%r7, %r8, %r9, %r10}, [%rd4];
    st.global.v4.u32 [%rd5], {%r7, %r8, %r9, %r10};
    add.s32 %r5, %r5, %r6;
    bra LOOP;
DONE:
    membar.sys;
    ret;
}
"""
COPY_KERNEL_NAME = b"sm120fork_copy"


class CudaError(RuntimeError):
    """A driver call failed; the message names the call and CUDA's error name."""


class IpcHandle(ctypes.Structure):
    # c_ubyte, not c_char: a c_char array field reads back cut at its first NUL byte.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):
    """``CUmemAllocationProp`` (32 bytes)."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", MemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    """``CUmemAccessDesc`` (12 bytes)."""

    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


_C = TypeVar("_C", ctypes.c_int, ctypes.c_uint64, ctypes.c_ulonglong, ctypes.c_size_t,
               ctypes.c_void_p, ctypes.c_float, IpcHandle)


@dataclass(frozen=True, kw_only=True)
class VmmBuffer:
    """Device memory made with ``cuMemCreate``, mapped here, exportable as a POSIX FD."""

    ptr: int
    size: int
    fd: int


class Driver:
    """``libcuda`` with the few calls the doctor needs; raises ``CudaError``."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"no NVIDIA driver: cannot load libcuda.so.1 ({exc})") from exc
        self._call("cuInit", 0)
        self._copy_function: ctypes.c_void_p | None = None

    def _call(self, function: str, *args: object) -> None:
        """``libcuda``'s ``function``; a failure names it as CUDA does (without ``_v2``)."""
        result = getattr(self.lib, function)(*args)
        if result == 0:
            return
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(result, ctypes.byref(name))
        label = name.value.decode() if name.value else f"error {result}"
        raise CudaError(f"{function.removesuffix('_v2')} failed: {label}")

    def _out(self, kind: type[_C], function: str, *args: object) -> _C:
        """What ``function`` writes through its first argument, a ``kind``."""
        value = kind()
        self._call(function, ctypes.byref(value), *args)
        return value

    def version(self) -> int:
        return self._out(ctypes.c_int, "cuDriverGetVersion").value

    def count(self) -> int:
        return self._out(ctypes.c_int, "cuDeviceGetCount").value

    def _device(self, index: int) -> ctypes.c_int:
        return self._out(ctypes.c_int, "cuDeviceGet", index)

    def attribute(self, index: int, attribute: int) -> int:
        return self._out(ctypes.c_int, "cuDeviceGetAttribute", attribute,
                         self._device(index)).value

    def _text(self, function: str, size: int, index: int) -> str:
        buf = ctypes.create_string_buffer(size)
        self._call(function, buf, size, self._device(index))
        return buf.value.decode()

    def device(self, index: int) -> Device:
        major = self.attribute(index, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(index, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        try:
            multicast: bool | None = bool(
                self.attribute(index, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED))
        except CudaError:
            multicast = None   # the driver does not know the attribute
        try:
            bus = self._text("cuDeviceGetPCIBusId", 32, index)
        except CudaError:
            bus = ""
        return {"index": index, "name": self._text("cuDeviceGetName", 256, index),
                "capability": f"{major}.{minor}", "multicast": multicast,
                "pci_bus_id": bus or None}

    def can_access_peer(self, a: int, b: int) -> bool:
        return bool(self._out(ctypes.c_int, "cuDeviceCanAccessPeer", self._device(a),
                              self._device(b)).value)

    def use(self, index: int) -> None:
        ctx = self._out(ctypes.c_void_p, "cuDevicePrimaryCtxRetain", self._device(index))
        self._call("cuCtxSetCurrent", ctx)

    def _zero(self, ptr: int, nbytes: int) -> None:
        self._call("cuMemsetD32_v2", ctypes.c_uint64(ptr), ctypes.c_uint(0),
                   ctypes.c_size_t(nbytes // 4))
        self.synchronize()

    def alloc_zeroed(self, nbytes: int) -> int:
        ptr = self._out(ctypes.c_uint64, "cuMemAlloc_v2", ctypes.c_size_t(nbytes)).value
        self._zero(ptr, nbytes)
        return ptr

    def ipc_handle(self, ptr: int) -> bytes:
        return bytes(self._out(IpcHandle, "cuIpcGetMemHandle", ctypes.c_uint64(ptr)).reserved)

    def ipc_open(self, handle: bytes) -> int:
        return self._out(ctypes.c_uint64, "cuIpcOpenMemHandle_v2",
                         IpcHandle.from_buffer_copy(handle),
                         ctypes.c_uint(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)).value

    def copy(self, dst: int, src: int, nbytes: int, blocks: int = 64) -> None:
        """Run the copy kernel on the current device (``nbytes`` a multiple of 16)."""
        if self._copy_function is None:
            module = self._out(ctypes.c_void_p, "cuModuleLoadData", COPY_KERNEL_PTX)
            self._copy_function = self._out(ctypes.c_void_p, "cuModuleGetFunction", module,
                                            COPY_KERNEL_NAME)
        d, s, n = ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_uint32(nbytes // 16)
        params = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                         for v in (d, s, n)))
        self._call("cuLaunchKernel", self._copy_function, blocks, 1, 1, 256, 1, 1, 0, None,
                   params, None)

    def timed_copy(self, dst: int, src: int, nbytes: int, repeats: int, blocks: int) -> float:
        """Milliseconds for ``repeats`` copies after one warm-up (CUDA events)."""
        self.copy(dst, src, nbytes, blocks)
        self.synchronize()
        start = self._out(ctypes.c_void_p, "cuEventCreate", 0)
        stop = self._out(ctypes.c_void_p, "cuEventCreate", 0)
        self._call("cuEventRecord", start, None)
        for _ in range(repeats):
            self.copy(dst, src, nbytes, blocks)
        self._call("cuEventRecord", stop, None)
        self._call("cuEventSynchronize", stop)
        return self._out(ctypes.c_float, "cuEventElapsedTime", start, stop).value

    def write_u32(self, ptr: int, words: list[int]) -> None:
        host = (ctypes.c_uint32 * len(words))(*words)
        self._call("cuMemcpyHtoD_v2", ctypes.c_uint64(ptr), host,
                   ctypes.c_size_t(len(words) * 4))

    def read_u32(self, ptr: int, count: int) -> list[int]:
        host = (ctypes.c_uint32 * count)()
        self._call("cuMemcpyDtoH_v2", host, ctypes.c_uint64(ptr), ctypes.c_size_t(count * 4))
        return list(host)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def _prop(self, index: int) -> AllocationProp:
        prop = AllocationProp(type=CU_MEM_ALLOCATION_TYPE_PINNED,
                              requestedHandleTypes=CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                              location=MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, index))
        prop.allocFlags.gpuDirectRDMACapable = 1   # as FlashInfer sets it
        return prop

    def granularity(self, index: int) -> int:
        return self._out(ctypes.c_size_t, "cuMemGetAllocationGranularity",
                         ctypes.byref(self._prop(index)),
                         CU_MEM_ALLOC_GRANULARITY_RECOMMENDED).value

    def _map(self, handle: int, size: int, granularity: int, index: int) -> int:
        ptr = self._out(ctypes.c_uint64, "cuMemAddressReserve", ctypes.c_size_t(size),
                        ctypes.c_size_t(granularity), ctypes.c_uint64(0),
                        ctypes.c_ulonglong(0)).value
        self._call("cuMemMap", ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                   ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0))
        access = AccessDesc(MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, index),
                            CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self._call("cuMemSetAccess", ctypes.c_uint64(ptr), ctypes.c_size_t(size),
                   ctypes.byref(access), ctypes.c_size_t(1))
        return ptr

    def vmm_alloc(self, index: int, nbytes: int) -> VmmBuffer:
        """``cuMemCreate`` on ``index``, mapped and zeroed here, exported as a POSIX FD."""
        granularity = self.granularity(index)
        size = -(-nbytes // granularity) * granularity
        handle = self._out(ctypes.c_ulonglong, "cuMemCreate", ctypes.c_size_t(size),
                           ctypes.byref(self._prop(index)), ctypes.c_ulonglong(0)).value
        fd = self._out(ctypes.c_int, "cuMemExportToShareableHandle", ctypes.c_ulonglong(handle),
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, ctypes.c_ulonglong(0)).value
        ptr = self._map(handle, size, granularity, index)
        self._zero(ptr, size)
        return VmmBuffer(ptr=ptr, size=size, fd=fd)

    def vmm_import(self, fd: int, size: int, index: int) -> int:
        """Map a peer's exported VMM memory here (accessed from device ``index``)."""
        handle = self._out(ctypes.c_ulonglong, "cuMemImportFromShareableHandle",
                           ctypes.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).value
        return self._map(handle, size, self.granularity(index), index)
