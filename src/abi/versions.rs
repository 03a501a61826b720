//! The seven exported tables `ncclNetPlugin_v6` … `ncclNetPlugin_v12` (NCCL 2.14 … 2.30)
//! and the shims whose signature differs per version. Everything else is shared
//! (`common.rs`) and all of it ends in the one implementation in `crate::plugin`.

use super::PROCESS;
use std::ffi::{c_int, c_void};

use ncclnet_types::tables::*;
use ncclnet_types::types::*;

use super::args::*;
use super::common::*;
use super::fusion::{devices_v6, devices_v9, make_vdevice_v9, make_vdevice_v12, publish};
use super::guard::run;
use super::logger;
use super::profiler;
use crate::plugin::{AbiVersion, ContextHandle, Properties};

const NAME: *const std::ffi::c_char = c"MPIB".as_ptr();

fn init_common(abi: AbiVersion, log_fn: ncclDebugLogger_t) -> crate::error::Result<()> {
    logger::set_nccl_logger(log_fn);
    logger::install_panic_hook();
    if let Some(env) = super::init_process(abi)? {
        publish(&env);
    }
    Ok(())
}

// ---- init / finalize -------------------------------------------------------------------

unsafe extern "C" fn init_v6(log_fn: ncclDebugLogger_t) -> ncclResult_t {
    logger::install();
    run("init", || init_common(AbiVersion::V6, log_fn))
}
unsafe extern "C" fn init_v7(log_fn: ncclDebugLogger_t) -> ncclResult_t {
    logger::install();
    run("init", || init_common(AbiVersion::V7, log_fn))
}
unsafe extern "C" fn init_v8(log_fn: ncclDebugLogger_t) -> ncclResult_t {
    logger::install();
    run("init", || init_common(AbiVersion::V8, log_fn))
}
unsafe extern "C" fn init_v9(log_fn: ncclDebugLogger_t) -> ncclResult_t {
    logger::install();
    run("init", || init_common(AbiVersion::V9, log_fn))
}
/// v10: the profiler callback goes to the default context (the only one before v11).
unsafe extern "C" fn init_v10(log_fn: ncclDebugLogger_t, prof: ncclProfilerCallback_t) -> ncclResult_t {
    logger::install();
    run("init", || {
        init_common(AbiVersion::V10, log_fn)?;
        PROCESS.set_profiler(None, profiler::sink(prof))
    })
}

/// v11/v12: `init` is per communicator; `*ctx` carries the communicator's config to
/// `listen`/`connect`, and `finalize(ctx)` releases one reference of the global state.
fn init_ctx(
    abi: AbiVersion,
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v11_t,
    log_fn: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    logger::install();
    run("init", || {
        // SAFETY: NCCL passes a valid out-pointer for the context (NULL rejected).
        let ctx = unsafe { out(ctx, "ctx") }?;
        *ctx = std::ptr::null_mut();
        // SAFETY: NCCL passes NULL or a valid config.
        let tc = unsafe { config.as_ref() }.map(|c| c.trafficClass);
        init_common(abi, log_fn)?;
        let c = PROCESS.new_context(comm_id, tc)?;
        PROCESS.set_profiler(Some(c), profiler::sink(prof))?;
        *ctx = ptr(Some(c.0));
        Ok(())
    })
}
unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v11_t,
    log_fn: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    init_ctx(AbiVersion::V11, ctx, comm_id, config, log_fn, prof)
}
unsafe extern "C" fn init_v12(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v12_t,
    log_fn: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    init_ctx(AbiVersion::V12, ctx, comm_id, config, log_fn, prof)
}
unsafe extern "C" fn finalize(ctx: *mut c_void) -> ncclResult_t {
    run("finalize", || PROCESS.finalize(ContextHandle(raw(ctx))))
}
unsafe extern "C" fn set_net_attr(ctx: *mut c_void, attr: *mut ncclNetAttr_v11_t) -> ncclResult_t {
    run("setNetAttr", || {
        // SAFETY: NCCL passes NULL or a valid attribute struct.
        if let Some(a) = unsafe { attr.as_ref() } {
            PROCESS.set_net_attr(ContextHandle(raw(ctx)), a.sendCommAttr.maxConcurrentPeers, a.op, a.algo, a.proto)?;
        }
        Ok(())
    })
}

// ---- getProperties ---------------------------------------------------------------------

/// A `vProps` of `N` slots from the plugin's fused devices.
fn vprops<const N: usize>(p: &Properties) -> (c_int, [c_int; N]) {
    let mut devs = [0; N];
    let v = p.vdevs.as_slice();
    devs[..v.len()].copy_from_slice(v);
    (v.len() as c_int, devs)
}

/// NCCL's `railId`/`planeId` for an id the plugin may not know.
fn net_id(v: Option<i16>) -> i16 {
    v.unwrap_or(consts::NCCL_NET_ID_UNDEF)
}

fn props_v9(p: &Properties) -> ncclNetProperties_v9_t {
    let (ndevs, devs) = vprops::<NCCL_NET_MAX_DEVS_PER_NIC_V9>(p);
    ncclNetProperties_v9_t {
        name: p.name.as_ptr().cast_mut(),
        pciPath: p.pci_path.map_or(std::ptr::null_mut(), |s| s.as_ptr().cast_mut()),
        guid: p.guid,
        ptrSupport: ptr_support(p.mem_types),
        regIsGlobal: p.reg_is_global as c_int,
        forceFlush: p.force_flush as c_int,
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: consts::NCCL_NET_DEVICE_HOST,
        netDeviceVersion: consts::NCCL_NET_DEVICE_INVALID_VERSION,
        vProps: ncclNetVDeviceProps_v9_t { ndevs, devs },
        maxP2pBytes: p.max_p2p_bytes,
        maxCollBytes: p.max_coll_bytes,
    }
}

fn props_v8(p: &Properties) -> ncclNetProperties_v8_t {
    let v = props_v9(p);
    ncclNetProperties_v8_t {
        name: v.name,
        pciPath: v.pciPath,
        guid: v.guid,
        ptrSupport: v.ptrSupport,
        regIsGlobal: v.regIsGlobal,
        speed: v.speed,
        port: v.port,
        latency: v.latency,
        maxComms: v.maxComms,
        maxRecvs: v.maxRecvs,
        netDeviceType: v.netDeviceType,
        netDeviceVersion: v.netDeviceVersion,
    }
}

fn props_v7(p: &Properties) -> ncclNetProperties_v7_t {
    let v = props_v8(p);
    ncclNetProperties_v7_t {
        name: v.name,
        pciPath: v.pciPath,
        guid: v.guid,
        ptrSupport: v.ptrSupport,
        speed: v.speed,
        port: v.port,
        latency: v.latency,
        maxComms: v.maxComms,
        maxRecvs: v.maxRecvs,
        netDeviceType: v.netDeviceType,
        netDeviceVersion: v.netDeviceVersion,
    }
}

fn props_v6(p: &Properties) -> ncclNetProperties_v6_t {
    let v = props_v7(p);
    ncclNetProperties_v6_t {
        name: v.name,
        pciPath: v.pciPath,
        guid: v.guid,
        ptrSupport: v.ptrSupport,
        speed: v.speed,
        port: v.port,
        latency: v.latency,
        maxComms: v.maxComms,
        maxRecvs: v.maxRecvs,
    }
}

fn props_v11(p: &Properties) -> ncclNetProperties_v11_t {
    let v = props_v9(p);
    ncclNetProperties_v11_t {
        name: v.name,
        pciPath: v.pciPath,
        guid: v.guid,
        ptrSupport: v.ptrSupport,
        regIsGlobal: v.regIsGlobal,
        forceFlush: v.forceFlush,
        speed: v.speed,
        port: v.port,
        latency: v.latency,
        maxComms: v.maxComms,
        maxRecvs: v.maxRecvs,
        netDeviceType: v.netDeviceType,
        netDeviceVersion: v.netDeviceVersion,
        vProps: v.vProps,
        maxP2pBytes: v.maxP2pBytes,
        maxCollBytes: v.maxCollBytes,
        maxMultiRequestSize: p.max_multi_request_size,
    }
}

fn props_v12(p: &Properties) -> ncclNetProperties_v12_t {
    let v = props_v11(p);
    let (ndevs, devs) = vprops::<NCCL_NET_MAX_DEVS_PER_NIC_V12>(p);
    ncclNetProperties_v12_t {
        name: v.name,
        pciPath: v.pciPath,
        guid: v.guid,
        ptrSupport: v.ptrSupport,
        regIsGlobal: v.regIsGlobal,
        forceFlush: v.forceFlush,
        speed: v.speed,
        port: v.port,
        latency: v.latency,
        maxComms: v.maxComms,
        maxRecvs: v.maxRecvs,
        netDeviceType: v.netDeviceType,
        netDeviceVersion: v.netDeviceVersion,
        vProps: ncclNetVDeviceProps_v12_t { ndevs, devs },
        maxP2pBytes: v.maxP2pBytes,
        maxCollBytes: v.maxCollBytes,
        maxMultiRequestSize: v.maxMultiRequestSize,
        railId: net_id(p.rail),
        planeId: net_id(p.plane),
    }
}

macro_rules! get_properties {
    ($name:ident, $abi:expr, $ty:ty, $conv:ident) => {
        unsafe extern "C" fn $name(dev: c_int, props: *mut $ty) -> ncclResult_t {
            run("getProperties", || {
                // SAFETY: NCCL passes a valid properties struct of this version (NULL rejected).
                let props = unsafe { out(props, "props") }?;
                *props = $conv(&PROCESS.properties($abi, dev)?);
                Ok(())
            })
        }
    };
}
get_properties!(get_properties_v6, AbiVersion::V6, ncclNetProperties_v6_t, props_v6);
get_properties!(get_properties_v7, AbiVersion::V7, ncclNetProperties_v7_t, props_v7);
get_properties!(get_properties_v8, AbiVersion::V8, ncclNetProperties_v8_t, props_v8);
get_properties!(get_properties_v9, AbiVersion::V9, ncclNetProperties_v9_t, props_v9);
get_properties!(get_properties_v11, AbiVersion::V11, ncclNetProperties_v11_t, props_v11);
get_properties!(get_properties_v12, AbiVersion::V12, ncclNetProperties_v12_t, props_v12);

// ---- listen / connect ------------------------------------------------------------------

macro_rules! listen_no_ctx {
    ($name:ident, $abi:expr) => {
        unsafe extern "C" fn $name(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> ncclResult_t {
            run("listen", || listen_impl($abi, None, dev, handle, listen_comm))
        }
    };
}
listen_no_ctx!(listen_v6, AbiVersion::V6);
listen_no_ctx!(listen_v7, AbiVersion::V7);
listen_no_ctx!(listen_v8, AbiVersion::V8);
listen_no_ctx!(listen_v9, AbiVersion::V9);
listen_no_ctx!(listen_v10, AbiVersion::V10);

unsafe extern "C" fn listen_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    lc: *mut *mut c_void,
) -> ncclResult_t {
    run("listen", || listen_impl(AbiVersion::V11, Some(ContextHandle(raw(ctx))), dev, handle, lc))
}
unsafe extern "C" fn listen_v12(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    lc: *mut *mut c_void,
) -> ncclResult_t {
    run("listen", || listen_impl(AbiVersion::V12, Some(ContextHandle(raw(ctx))), dev, handle, lc))
}

unsafe extern "C" fn connect_v6(dev: c_int, handle: *mut c_void, sc: *mut *mut c_void) -> ncclResult_t {
    run("connect", || connect_impl(AbiVersion::V6, None, dev, None, handle, sc, std::ptr::null_mut()))
}
macro_rules! connect_devcomm {
    ($name:ident, $abi:expr) => {
        unsafe extern "C" fn $name(
            dev: c_int,
            handle: *mut c_void,
            sc: *mut *mut c_void,
            dc: *mut *mut ncclNetDeviceHandle_v7_t,
        ) -> ncclResult_t {
            run("connect", || connect_impl($abi, None, dev, None, handle, sc, dc))
        }
    };
}
connect_devcomm!(connect_v7, AbiVersion::V7);
connect_devcomm!(connect_v8, AbiVersion::V8);
connect_devcomm!(connect_v9, AbiVersion::V9);

unsafe extern "C" fn connect_v10(
    dev: c_int,
    config: *mut ncclNetCommConfig_v10_t,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dc: *mut *mut ncclNetDeviceHandle_v10_t,
) -> ncclResult_t {
    run("connect", || {
        // SAFETY: NCCL passes NULL or a valid comm config.
        let tc = unsafe { config.as_ref() }.map(|c| c.trafficClass);
        connect_impl(AbiVersion::V10, None, dev, tc, handle, sc, dc)
    })
}
unsafe extern "C" fn connect_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dc: *mut *mut ncclNetDeviceHandle_v11_t,
) -> ncclResult_t {
    // The traffic class comes with the context.
    run("connect", || connect_impl(AbiVersion::V11, Some(ContextHandle(raw(ctx))), dev, None, handle, sc, dc))
}
unsafe extern "C" fn connect_v12(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dc: *mut *mut ncclNetDeviceHandle_v12_t,
) -> ncclResult_t {
    run("connect", || connect_impl(AbiVersion::V12, Some(ContextHandle(raw(ctx))), dev, None, handle, sc, dc))
}

// ---- the exported tables ---------------------------------------------------------------

/// NCCL 2.14 – 2.18.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v6: ncclNet_v6_t = ncclNet_v6_t {
    name: NAME,
    init: Some(init_v6),
    devices: Some(devices_v6),
    getProperties: Some(get_properties_v6),
    listen: Some(listen_v6),
    connect: Some(connect_v6),
    accept: Some(accept_v6),
    regMr: Some(reg_mr_int),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
};

/// NCCL 2.19.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v7: ncclNet_v7_t = ncclNet_v7_t {
    name: NAME,
    init: Some(init_v7),
    devices: Some(devices_v6),
    getProperties: Some(get_properties_v7),
    listen: Some(listen_v7),
    connect: Some(connect_v7),
    accept: Some(accept),
    regMr: Some(reg_mr_int),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
};

/// NCCL 2.20 – 2.23.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: ncclNet_v8_t = ncclNet_v8_t {
    name: NAME,
    init: Some(init_v8),
    devices: Some(devices_v6),
    getProperties: Some(get_properties_v8),
    listen: Some(listen_v8),
    connect: Some(connect_v8),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
};

/// isend with a `size_t` size (v9 only; v10+ adds the profiler handle).
unsafe extern "C" fn isend_sizet(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("isend", || isend_impl(comm, data, size, tag, mhandle, std::ptr::null_mut(), request))
}

/// NCCL 2.24 – 2.25.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v9: ncclNet_v9_t = ncclNet_v9_t {
    name: NAME,
    init: Some(init_v9),
    devices: Some(devices_v9),
    getProperties: Some(get_properties_v9),
    listen: Some(listen_v9),
    connect: Some(connect_v9),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_sizet),
    irecv: Some(irecv_sizet),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    // NCCL fuses each rail pair's NICs into one device (plugin/devices.rs).
    makeVDevice: Some(make_vdevice_v9),
};

/// NCCL 2.26 – 2.27.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v10: ncclNet_v10_t = ncclNet_v10_t {
    name: NAME,
    init: Some(init_v10),
    devices: Some(devices_v9),
    getProperties: Some(get_properties_v9),
    listen: Some(listen_v10),
    connect: Some(connect_v10),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_prof),
    irecv: Some(irecv_prof),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(make_vdevice_v9),
};

/// NCCL 2.28 – 2.29.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v11: ncclNet_v11_t = ncclNet_v11_t {
    name: NAME,
    init: Some(init_v11),
    devices: Some(devices_v9),
    getProperties: Some(get_properties_v11),
    listen: Some(listen_v11),
    connect: Some(connect_v11),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_prof),
    irecv: Some(irecv_prof),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(make_vdevice_v9),
    finalize: Some(finalize),
    setNetAttr: Some(set_net_attr),
};

/// NCCL 2.30.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: ncclNet_v12_t = ncclNet_v12_t {
    name: NAME,
    init: Some(init_v12),
    devices: Some(devices_v9),
    getProperties: Some(get_properties_v12),
    listen: Some(listen_v12),
    connect: Some(connect_v12),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_prof),
    irecv: Some(irecv_prof),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(make_vdevice_v12),
    finalize: Some(finalize),
    setNetAttr: Some(set_net_attr),
};

#[cfg(test)]
#[path = "versions_tests.rs"]
mod tests;
