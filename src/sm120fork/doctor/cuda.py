"""The CUDA driver API through ctypes: device queries and what the peer probe does.

Standard library only (the doctor runs without torch or nvcc).  It never creates multicast
objects: it shares memory the two ways FlashInfer does (VMM exported as a POSIX FD; CUDA IPC).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

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
            multicast = None   # the driver does not know the attribute
        bus = ctypes.create_string_buffer(32)
        try:
            self._check("cuDeviceGetPCIBusId",
                        self.lib.cuDeviceGetPCIBusId(bus, 32, self._device(index)))
        except CudaError:
            bus.value = b""
        return {"index": index, "name": buf.value.decode(), "capability": f"{major}.{minor}",
                "multicast": multicast, "pci_bus_id": bus.value.decode() or None}

    def can_access_peer(self, a: int, b: int) -> bool:
        value = ctypes.c_int()
        self._check("cuDeviceCanAccessPeer", self.lib.cuDeviceCanAccessPeer(
            ctypes.byref(value), self._device(a), self._device(b)))
        return bool(value.value)

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

    def _function(self) -> ctypes.c_void_p:
        cached: ctypes.c_void_p | None = getattr(self, "_copy_function", None)
        if cached is not None:
            return cached
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuModuleLoadData",
                    self.lib.cuModuleLoadData(ctypes.byref(module), COPY_KERNEL_PTX))
        self._check("cuModuleGetFunction", self.lib.cuModuleGetFunction(
            ctypes.byref(function), module, COPY_KERNEL_NAME))
        self._copy_function = function
        return function

    def copy(self, dst: int, src: int, nbytes: int, blocks: int = 64) -> None:
        """Run the copy kernel on the current device (``nbytes`` a multiple of 16)."""
        function = self._function()
        d, s, n = ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_uint32(nbytes // 16)
        params = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                         for v in (d, s, n)))
        self._check("cuLaunchKernel", self.lib.cuLaunchKernel(
            function, blocks, 1, 1, 256, 1, 1, 0, None, params, None))

    def timed_copy(self, dst: int, src: int, nbytes: int, repeats: int, blocks: int) -> float:
        """Milliseconds for ``repeats`` copies after one warm-up (CUDA events)."""
        self.copy(dst, src, nbytes, blocks)
        self.synchronize()
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuEventCreate", self.lib.cuEventCreate(ctypes.byref(start), 0))
        self._check("cuEventCreate", self.lib.cuEventCreate(ctypes.byref(stop), 0))
        self._check("cuEventRecord", self.lib.cuEventRecord(start, None))
        for _ in range(repeats):
            self.copy(dst, src, nbytes, blocks)
        self._check("cuEventRecord", self.lib.cuEventRecord(stop, None))
        self._check("cuEventSynchronize", self.lib.cuEventSynchronize(stop))
        ms = ctypes.c_float()
        self._check("cuEventElapsedTime",
                    self.lib.cuEventElapsedTime(ctypes.byref(ms), start, stop))
        return ms.value

    def write_u32(self, ptr: int, words: list[int]) -> None:
        host = (ctypes.c_uint32 * len(words))(*words)
        self._check("cuMemcpyHtoD", self.lib.cuMemcpyHtoD_v2(
            ctypes.c_uint64(ptr), host, ctypes.c_size_t(len(words) * 4)))

    def _prop(self, index: int) -> AllocationProp:
        prop = AllocationProp()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.location = MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, index)
        prop.allocFlags.gpuDirectRDMACapable = 1   # as FlashInfer sets it
        return prop

    def _map(self, handle: int, size: int, granularity: int, index: int) -> int:
        ptr = ctypes.c_uint64()
        self._check("cuMemAddressReserve", self.lib.cuMemAddressReserve(
            ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(granularity),
            ctypes.c_uint64(0), ctypes.c_ulonglong(0)))
        self._check("cuMemMap", self.lib.cuMemMap(
            ctypes.c_uint64(ptr.value), ctypes.c_size_t(size), ctypes.c_size_t(0),
            ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0)))
        access = AccessDesc(MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, index),
                            CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self._check("cuMemSetAccess", self.lib.cuMemSetAccess(
            ctypes.c_uint64(ptr.value), ctypes.c_size_t(size), ctypes.byref(access),
            ctypes.c_size_t(1)))
        return ptr.value

    def granularity(self, index: int) -> int:
        value = ctypes.c_size_t()
        prop = self._prop(index)
        self._check("cuMemGetAllocationGranularity", self.lib.cuMemGetAllocationGranularity(
            ctypes.byref(value), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return value.value

    def vmm_alloc(self, index: int, nbytes: int) -> VmmBuffer:
        """``cuMemCreate`` on ``index``, mapped and zeroed here, exported as a POSIX FD."""
        granularity = self.granularity(index)
        size = -(-nbytes // granularity) * granularity
        handle = ctypes.c_ulonglong()
        prop = self._prop(index)
        self._check("cuMemCreate", self.lib.cuMemCreate(
            ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
            ctypes.c_ulonglong(0)))
        fd = ctypes.c_int(-1)
        self._check("cuMemExportToShareableHandle", self.lib.cuMemExportToShareableHandle(
            ctypes.byref(fd), handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            ctypes.c_ulonglong(0)))
        ptr = self._map(handle.value, size, granularity, index)
        self._check("cuMemsetD32", self.lib.cuMemsetD32_v2(
            ctypes.c_uint64(ptr), ctypes.c_uint(0), ctypes.c_size_t(size // 4)))
        self.synchronize()
        return VmmBuffer(ptr=ptr, size=size, fd=fd.value)

    def vmm_import(self, fd: int, size: int, index: int) -> int:
        """Map a peer's exported VMM memory here (accessed from device ``index``)."""
        handle = ctypes.c_ulonglong()
        self._check("cuMemImportFromShareableHandle", self.lib.cuMemImportFromShareableHandle(
            ctypes.byref(handle), ctypes.c_void_p(fd),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return self._map(handle.value, size, self.granularity(index), index)

    def read_u32(self, ptr: int, count: int) -> list[int]:
        host = (ctypes.c_uint32 * count)()
        self._check("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(
            host, ctypes.c_uint64(ptr), ctypes.c_size_t(count * 4)))
        return list(host)

    def synchronize(self) -> None:
        self._check("cuCtxSynchronize", self.lib.cuCtxSynchronize())
