//! Device counts per ABI version, `makeVDevice` (v9+) and the one environment variable the
//! plugin sets for NCCL (`NCCL_NET_FORCE_MERGE`). Which devices each version sees, and why,
//! is `plugin/devices.rs`.

use super::PROCESS;
use std::ffi::c_int;

use ncclnet_types::types::*;

use super::args::out;
use super::guard::run;
use crate::error::{Error, Result};
use crate::plugin::{AbiVersion, NcclEnv};

fn devices_impl(abi: AbiVersion, ndev: *mut c_int) -> ncclResult_t {
    run("devices", || {
        // SAFETY: NCCL passes a valid int pointer or NULL (rejected by `out`).
        let ndev = unsafe { out(ndev, "ndev") }?;
        *ndev = c_int::try_from(PROCESS.device_count(abi)?).unwrap_or(c_int::MAX);
        Ok(())
    })
}

/// `devices` of v6 – v8: one device per rail pair (these versions cannot fuse).
pub unsafe extern "C" fn devices_v6(ndev: *mut c_int) -> ncclResult_t {
    devices_impl(AbiVersion::V8, ndev)
}

/// `devices` of v9 – v12: NICs NCCL fuses and pairs, then the devices `makeVDevice` made.
pub unsafe extern "C" fn devices_v9(ndev: *mut c_int) -> ncclResult_t {
    devices_impl(AbiVersion::V12, ndev)
}

/// The device list of a `vProps` NCCL passes, checked against its array.
fn vdevs(ndevs: c_int, devs: &[c_int]) -> Result<&[c_int]> {
    usize::try_from(ndevs).ok().filter(|&n| n <= devs.len()).map(|n| &devs[..n]).ok_or_else(|| {
        Error::invalid_argument(format!("makeVDevice: vProps.ndevs {ndevs} (0 … {} allowed)", devs.len()))
    })
}

fn make_vdevice_impl(d: *mut c_int, devs: impl FnOnce() -> Result<Vec<c_int>>) -> ncclResult_t {
    run("makeVDevice", || {
        // SAFETY: NCCL passes a valid int pointer for the new device's index (NULL rejected).
        let d = unsafe { out(d, "d") }?;
        *d = PROCESS.make_vdevice(&devs()?)?;
        Ok(())
    })
}

/// `makeVDevice` of v9 – v11 (`vProps` of 4 devices).
pub unsafe extern "C" fn make_vdevice_v9(d: *mut c_int, props: *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t {
    make_vdevice_impl(d, || {
        // SAFETY: NCCL passes NULL or a valid vProps of this version.
        let p = unsafe { props.as_ref() }.ok_or_else(|| Error::invalid_argument("makeVDevice: props is NULL"))?;
        vdevs(p.ndevs, &p.devs).map(<[c_int]>::to_vec)
    })
}

/// `makeVDevice` of v12 (`vProps` of 8 devices).
pub unsafe extern "C" fn make_vdevice_v12(d: *mut c_int, props: *mut ncclNetVDeviceProps_v12_t) -> ncclResult_t {
    make_vdevice_impl(d, || {
        // SAFETY: NCCL passes NULL or a valid vProps of this version.
        let p = unsafe { props.as_ref() }.ok_or_else(|| Error::invalid_argument("makeVDevice: props is NULL"))?;
        vdevs(p.ndevs, &p.devs).map(<[c_int]>::to_vec)
    })
}

/// Sets `env` in the process environment unless the user set that variable: NCCL reads it
/// when it builds its topology, after `init` (`ncclTopoGetSystem` runs after `ncclNetInit`).
/// A user's own value wins (NCCL then fuses what it names; `makeVDevice` refuses groups
/// that are not rail pairs, with a message naming the pairs).
pub fn publish(env: &NcclEnv) {
    match std::env::var(env.name) {
        Ok(v) if v == env.value => {}
        Ok(v) => log::warn!(
            target: "mpib::abi",
            "{}={v} is kept (set by the user); the rail pairs would be {}={}",
            env.name,
            env.name,
            env.value
        ),
        Err(_) => {
            // SAFETY: setenv while other threads may read the environment is what the
            // `unsafe` is about. NCCL calls init on the thread that creates the
            // communicator, under its plugin lock, and sets variables the same way itself
            // (`setEnvFile` → `setenv` for nccl.conf); this is one variable, set once, and
            // never changed or removed afterwards.
            unsafe { std::env::set_var(env.name, &env.value) };
            log::info!(
                target: "mpib::abi",
                "{}={} (so that NCCL fuses each rail pair's two NICs into one device)",
                env.name,
                env.value
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vprops_lengths_are_checked() {
        assert_eq!(vdevs(2, &[3, 4, 0, 0]).unwrap(), &[3, 4]);
        assert_eq!(vdevs(0, &[0; 4]).unwrap(), &[] as &[c_int]);
        assert!(vdevs(5, &[0; 4]).is_err());
        assert!(vdevs(-1, &[0; 4]).is_err());
        assert!(vdevs(8, &[0; 8]).is_ok());
    }
}
