//! Loading a plugin exactly as NCCL does: `dlopen(RTLD_NOW | RTLD_LOCAL)`, then `dlsym` of
//! the data symbols `ncclNetPlugin_v12` … `ncclNetPlugin_v6`, newest first
//! (`src/plugin/net.cc`, `src/plugin/plugin_open.cc`).
//!
//! A loaded library is never unloaded: a plugin may own threads and thread-local state
//! (the soft fabric's helper thread does), and `dlclose` under them is undefined behaviour.
//! NCCL's own plugin is likewise loaded once per process. So every table reference handed
//! out here is `'static`.

use std::ffi::{CStr, CString, c_void};

use super::{Error, Result};
use ncclnet_types::tables::*;

/// The ABI versions NCCL 2.30 tries, newest first (`int ncclNetVersion[]`).
pub const VERSIONS: [u32; 7] = [12, 11, 10, 9, 8, 7, 6];

/// Evaluates `$e` with `$t` bound to the table, whatever its version, for fields whose
/// type is the same in every version (`name`, `devices`, `test`, `close*`, `deregMr`).
macro_rules! table_field {
    ($table:expr, $t:ident => $e:expr) => {
        match $table {
            $crate::ffi::Table::V6($t) => $e,
            $crate::ffi::Table::V7($t) => $e,
            $crate::ffi::Table::V8($t) => $e,
            $crate::ffi::Table::V9($t) => $e,
            $crate::ffi::Table::V10($t) => $e,
            $crate::ffi::Table::V11($t) => $e,
            $crate::ffi::Table::V12($t) => $e,
        }
    };
}
pub(crate) use table_field;

/// A `dlopen`ed library, kept loaded for the life of the process.
#[derive(Debug)]
pub struct Library {
    handle: *mut c_void,
    /// The name it was opened by (a path or a file name found by ld.so).
    pub name: String,
}

// SAFETY: a dlopen handle is a process-wide token; dlsym may be called from any thread.
unsafe impl Send for Library {}
// SAFETY: as above; the handle is never mutated after dlopen.
unsafe impl Sync for Library {}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`: a path, or a file name ld.so searches for.
    pub fn open(name: &str) -> Result<Library> {
        let c = CString::new(name).map_err(|_| Error::load(format!("library name {name:?} contains a NUL byte")))?;
        // SAFETY: `c` is a valid C string; the flags are the ones NCCL uses. Running the
        // library's initialisers is what loading a plugin means.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(Error::load(format!("cannot load {name}: {}", dl_error())));
        }
        Ok(Library { handle, name: name.to_string() })
    }

    /// Opens a plugin named the way `NCCL_NET_PLUGIN` names it: first `value` as given;
    /// if that fails and `value` has no `/` and is not `lib*.so`, `libnccl-net-<value>.so`.
    pub fn open_nccl_style(value: &str) -> Result<Library> {
        match Library::open(value) {
            Ok(l) => Ok(l),
            Err(first) => {
                let is_lib_name = value.starts_with("lib") && value.ends_with(".so");
                if value.contains('/') || is_lib_name {
                    return Err(first);
                }
                Library::open(&format!("libnccl-net-{value}.so"))
                    .map_err(|second| Error::load(format!("{}; {}", first.msg, second.msg)))
            }
        }
    }

    /// The address of symbol `name`, if the library defines it.
    pub fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: the handle is a live dlopen handle (never closed) and `name` a C string.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// One version's function table, as the plugin exports it.
#[derive(Clone, Copy)]
pub enum Table {
    V6(&'static ncclNet_v6_t),
    V7(&'static ncclNet_v7_t),
    V8(&'static ncclNet_v8_t),
    V9(&'static ncclNet_v9_t),
    V10(&'static ncclNet_v10_t),
    V11(&'static ncclNet_v11_t),
    V12(&'static ncclNet_v12_t),
}

impl Table {
    /// The table of `version` in `lib`, if exported.
    pub fn find(lib: &Library, version: u32) -> Option<Table> {
        let sym = CString::new(format!("ncclNetPlugin_v{version}")).expect("no NUL");
        let p = lib.symbol(&sym)?;
        // SAFETY: NCCL casts this data symbol to the versioned struct in the same way; the
        // library is never unloaded, so the reference is valid for 'static; the tables are
        // only read.
        let t = unsafe {
            match version {
                6 => Table::V6(&*p.cast()),
                7 => Table::V7(&*p.cast()),
                8 => Table::V8(&*p.cast()),
                9 => Table::V9(&*p.cast()),
                10 => Table::V10(&*p.cast()),
                11 => Table::V11(&*p.cast()),
                12 => Table::V12(&*p.cast()),
                _ => return None,
            }
        };
        Some(t)
    }

    pub fn version(&self) -> u32 {
        match self {
            Table::V6(_) => 6,
            Table::V7(_) => 7,
            Table::V8(_) => 8,
            Table::V9(_) => 9,
            Table::V10(_) => 10,
            Table::V11(_) => 11,
            Table::V12(_) => 12,
        }
    }

    /// The table's `name` field.
    pub fn name(&self) -> String {
        let p = table_field!(*self, t => t.name);
        if p.is_null() {
            return String::new();
        }
        // SAFETY: the plugin's name is a NUL-terminated string that lives as long as the
        // (never unloaded) library.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
