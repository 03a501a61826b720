//! The `ncclNet_v9_t` … `ncclNet_v12_t` function tables (see `tables.rs` for v6 … v8), field for field in the order of NCCL's `net_vN.h`.
//! Every slot is a nullable C function pointer; NCCL checks the optional ones
//! (`regMrDmaBuf`, `getDeviceMr`, `irecvConsumed`, `makeVDevice`, `setNetAttr`) before calling.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use super::types::*;

/// `ncclNet_v9_t`: 20 slots, 160 bytes (`size_t` sizes, `makeVDevice`).
#[repr(C)]
pub struct ncclNet_v9_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(logFunction: ncclDebugLogger_t) -> ncclResult_t>,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> ncclResult_t>,
    pub getProperties: Option<unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v9_t) -> ncclResult_t>,
    pub listen:
        Option<unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listenComm: *mut *mut c_void) -> ncclResult_t>,
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            sendComm: *mut *mut c_void,
            sendDevComm: *mut *mut ncclNetDeviceHandle_v9_t,
        ) -> ncclResult_t,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            listenComm: *mut c_void,
            recvComm: *mut *mut c_void,
            recvDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
        ) -> ncclResult_t,
    >,
    pub regMr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub deregMr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t>,
    pub isend: Option<
        unsafe extern "C" fn(
            sendComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub test: Option<unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t>,
    pub closeSend: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeRecv: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeListen: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub getDeviceMr: Option<
        unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void, dptr_mhandle: *mut *mut c_void) -> ncclResult_t,
    >,
    pub irecvConsumed:
        Option<unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> ncclResult_t>,
    pub makeVDevice: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
}

/// `ncclNet_v10_t`: 20 slots, 160 bytes (profiler hooks, per-connect comm config).
#[repr(C)]
pub struct ncclNet_v10_t {
    pub name: *const c_char,
    pub init: Option<
        unsafe extern "C" fn(logFunction: ncclDebugLogger_t, profFunction: ncclProfilerCallback_t) -> ncclResult_t,
    >,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> ncclResult_t>,
    pub getProperties: Option<unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v10_t) -> ncclResult_t>,
    pub listen:
        Option<unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listenComm: *mut *mut c_void) -> ncclResult_t>,
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            config: *mut ncclNetCommConfig_v10_t,
            handle: *mut c_void,
            sendComm: *mut *mut c_void,
            sendDevComm: *mut *mut ncclNetDeviceHandle_v10_t,
        ) -> ncclResult_t,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            listenComm: *mut c_void,
            recvComm: *mut *mut c_void,
            recvDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
        ) -> ncclResult_t,
    >,
    pub regMr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub deregMr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t>,
    pub isend: Option<
        unsafe extern "C" fn(
            sendComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            phandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub test: Option<unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t>,
    pub closeSend: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeRecv: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeListen: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub getDeviceMr: Option<
        unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void, dptr_mhandle: *mut *mut c_void) -> ncclResult_t,
    >,
    pub irecvConsumed:
        Option<unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> ncclResult_t>,
    pub makeVDevice: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut ncclNetVDeviceProps_v10_t) -> ncclResult_t>,
}

/// `ncclNet_v11_t`: 22 slots, 176 bytes (per-communicator `init(ctx, …)`, `finalize`).
#[repr(C)]
pub struct ncclNet_v11_t {
    pub name: *const c_char,
    pub init: Option<
        unsafe extern "C" fn(
            ctx: *mut *mut c_void,
            commId: u64,
            config: *mut ncclNetCommConfig_v11_t,
            logFunction: ncclDebugLogger_t,
            profFunction: ncclProfilerCallback_t,
        ) -> ncclResult_t,
    >,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> ncclResult_t>,
    pub getProperties: Option<unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v11_t) -> ncclResult_t>,
    pub listen: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listenComm: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub connect: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            sendComm: *mut *mut c_void,
            sendDevComm: *mut *mut ncclNetDeviceHandle_v11_t,
        ) -> ncclResult_t,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            listenComm: *mut c_void,
            recvComm: *mut *mut c_void,
            recvDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
        ) -> ncclResult_t,
    >,
    pub regMr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub deregMr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t>,
    pub isend: Option<
        unsafe extern "C" fn(
            sendComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            phandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub test: Option<unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t>,
    pub closeSend: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeRecv: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeListen: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub getDeviceMr: Option<
        unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void, dptr_mhandle: *mut *mut c_void) -> ncclResult_t,
    >,
    pub irecvConsumed:
        Option<unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> ncclResult_t>,
    pub makeVDevice: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut ncclNetVDeviceProps_v11_t) -> ncclResult_t>,
    pub finalize: Option<unsafe extern "C" fn(ctx: *mut c_void) -> ncclResult_t>,
    pub setNetAttr: Option<unsafe extern "C" fn(ctx: *mut c_void, netAttr: *mut ncclNetAttr_v11_t) -> ncclResult_t>,
}

/// `ncclNet_v12_t`: the v11 table with v12 types (bigger properties), 176 bytes.
#[repr(C)]
pub struct ncclNet_v12_t {
    pub name: *const c_char,
    pub init: Option<
        unsafe extern "C" fn(
            ctx: *mut *mut c_void,
            commId: u64,
            config: *mut ncclNetCommConfig_v12_t,
            logFunction: ncclDebugLogger_t,
            profFunction: ncclProfilerCallback_t,
        ) -> ncclResult_t,
    >,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> ncclResult_t>,
    pub getProperties: Option<unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v12_t) -> ncclResult_t>,
    pub listen: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listenComm: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub connect: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            sendComm: *mut *mut c_void,
            sendDevComm: *mut *mut ncclNetDeviceHandle_v12_t,
        ) -> ncclResult_t,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            listenComm: *mut c_void,
            recvComm: *mut *mut c_void,
            recvDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
        ) -> ncclResult_t,
    >,
    pub regMr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            r#type: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub deregMr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t>,
    pub isend: Option<
        unsafe extern "C" fn(
            sendComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            phandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    pub test: Option<unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t>,
    pub closeSend: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeRecv: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub closeListen: Option<unsafe extern "C" fn(comm: *mut c_void) -> ncclResult_t>,
    pub getDeviceMr: Option<
        unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void, dptr_mhandle: *mut *mut c_void) -> ncclResult_t,
    >,
    pub irecvConsumed:
        Option<unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> ncclResult_t>,
    pub makeVDevice: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut ncclNetVDeviceProps_v12_t) -> ncclResult_t>,
    pub finalize: Option<unsafe extern "C" fn(ctx: *mut c_void) -> ncclResult_t>,
    pub setNetAttr: Option<unsafe extern "C" fn(ctx: *mut c_void, netAttr: *mut ncclNetAttr_v12_t) -> ncclResult_t>,
}

// SAFETY: the tables are immutable and point only at 'static data (a C string literal)
// and function items, so sharing them between threads is sound.
unsafe impl Sync for ncclNet_v9_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v10_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v11_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v12_t {}
