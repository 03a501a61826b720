//! Handles given to NCCL: opaque 64-bit values, not pointers. Each names an entry of a
//! process-wide table by index and generation, and says what it is (a kind), so a NULL,
//! stale (closed, completed) or foreign handle is a clear error, never a wild pointer.
//!
//! ```text
//!  bits 60..63  kind (listen, send, recv, mr, send request, recv request)
//!  bits 40..59  generation of the entry (never 0)
//!  bits 16..39  entry index
//!  bits  0..15  requests: request id (9 bits) | sequence (7 bits) << 9
//! ```
//!
//! Each entry has its own mutex: only the threads that use that object take it (NCCL's
//! progress thread for a comm's data path, its service thread for set-up and
//! registration), so no lock is shared between connections.

use std::sync::OnceLock;

use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Handle values as NCCL holds them (a `void*` at the C edge, turned into one of these
/// there, once), not yet looked up: the type says which calls accept it.
macro_rules! handle_types {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(transparent)]
        pub struct $name(pub u64);
    )*};
}

handle_types! {
    /// A listen comm (`listen` → `accept`, `closeListen`).
    ListenHandle;
    /// A send or receive comm (`isend`/`irecv`, `regMr`, the closes).
    CommHandle;
    /// A memory registration (`regMr` → `deregMr`, the data calls' `mhandle`).
    MemHandle;
    /// An in-flight request (`isend`/`irecv`/`iflush` → `test`).
    RequestHandle;
    /// A v11+ plugin context (`init` → `listen`/`connect`, `finalize`): one per communicator.
    ContextHandle;
}

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Listen = 1,
    Send = 2,
    Recv = 3,
    Mr = 4,
    SendReq = 5,
    RecvReq = 6,
    /// A connection being set up (`connect` keeps its handle in NCCL's handle buffer).
    Pending = 7,
}

impl Kind {
    fn from_bits(b: u64) -> Option<Kind> {
        Some(match b {
            1 => Kind::Listen,
            2 => Kind::Send,
            3 => Kind::Recv,
            4 => Kind::Mr,
            5 => Kind::SendReq,
            6 => Kind::RecvReq,
            7 => Kind::Pending,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Listen => "listen comm",
            Kind::Send => "send comm",
            Kind::Recv => "receive comm",
            Kind::Mr => "memory handle",
            Kind::SendReq => "send request",
            Kind::RecvReq => "receive request",
            Kind::Pending => "pending connection",
        }
    }
}

const CHUNK: usize = 1024;
const CHUNKS: usize = 16 * 1024; // 16 Mi entries: the 24-bit index space
const GEN_MASK: u32 = (1 << 20) - 1;

/// A decoded handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub kind: Kind,
    pub generation: u32,
    pub index: u32,
    /// Request id and sequence (requests only).
    pub sub: u16,
}

impl Handle {
    pub fn encode(self) -> u64 {
        (self.kind as u64) << 60
            | ((self.generation & GEN_MASK) as u64) << 40
            | (self.index as u64) << 16
            | self.sub as u64
    }

    pub fn decode(v: u64) -> Option<Handle> {
        let kind = Kind::from_bits(v >> 60)?;
        let generation = ((v >> 40) as u32) & GEN_MASK;
        if generation == 0 {
            return None;
        }
        Some(Handle { kind, generation, index: ((v >> 16) & 0xff_ffff) as u32, sub: v as u16 })
    }

    /// The request handle for request `id` (sequence `seq`) of this comm.
    pub fn request(self, id: u16, seq: u8) -> u64 {
        let kind = if self.kind == Kind::Send { Kind::SendReq } else { Kind::RecvReq };
        Handle { kind, sub: (id & 0x1ff) | ((seq as u16 & 0x7f) << 9), ..self }.encode()
    }

    /// A request handle value split into its comm's handle value and kind, the request id
    /// and its sequence, without a full decode; `None` if `v` is not a request's kind (the
    /// comm lookup checks the rest).
    #[inline]
    pub fn split_request(v: u64) -> Option<(u64, Kind, u16, u8)> {
        let kind = match v >> 60 {
            5 => Kind::Send,
            6 => Kind::Recv,
            _ => return None,
        };
        let comm = (v & !(0xf << 60) & TAG_MASK) | (kind as u64) << 60;
        Some((comm, kind, (v & 0x1ff) as u16, ((v >> 9) & 0x7f) as u8))
    }
}

struct Slot<T> {
    /// The handle of the live object without its request bits (kind | generation | index);
    /// 0 while the entry is free. One compare checks kind, generation and liveness.
    tag: u64,
    generation: u32,
    obj: Option<T>,
}

/// One lazily allocated chunk of entries.
type Chunk<T> = OnceLock<Box<[Mutex<Slot<T>>]>>;

/// A table of objects addressed by handles.
pub struct Table<T> {
    chunks: Box<[Chunk<T>]>,
    free: Mutex<FreeList>,
}

struct FreeList {
    free: Vec<u32>,
    next: u32,
}

/// Exclusive access to one live object.
pub struct Guard<'a, T> {
    g: MutexGuard<'a, Slot<T>>,
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.g.obj.as_ref().expect("live entry")
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        self.g.obj.as_mut().expect("live entry")
    }
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The bits of a handle its entry's `tag` holds (all but the request bits).
const TAG_MASK: u64 = !0xffff;

impl<T> Table<T> {
    pub fn new() -> Self {
        Table {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            free: Mutex::new(FreeList { free: Vec::new(), next: 0 }),
        }
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> Option<&Mutex<Slot<T>>> {
        let chunk = self.chunks.get(index as usize / CHUNK)?.get()?;
        chunk.get(index as usize % CHUNK)
    }

    /// Stores `obj`; returns its handle.
    pub fn insert(&self, kind: Kind, obj: T) -> Result<u64> {
        let index = {
            let mut f = self.free.lock();
            match f.free.pop() {
                Some(i) => i,
                None => {
                    let i = f.next;
                    if i as usize >= CHUNK * CHUNKS {
                        return Err(Error::system("out of handles: 16 million objects are open"));
                    }
                    f.next += 1;
                    i
                }
            }
        };
        let chunk = self.chunks[index as usize / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| Mutex::new(Slot { tag: 0, generation: 0, obj: None })).collect());
        let mut s = chunk[index as usize % CHUNK].lock();
        s.generation = (s.generation % GEN_MASK) + 1;
        let v = Handle { kind, generation: s.generation, index, sub: 0 }.encode();
        s.tag = v;
        s.obj = Some(obj);
        Ok(v)
    }

    /// Locks the object of handle `v`, which must be of kind `kind`. The hot path: one
    /// compare against the entry's tag; every failure is explained by [`Self::lookup_error`].
    #[inline(always)]
    pub fn get(&self, v: u64, kind: Kind) -> Result<(Handle, Guard<'_, T>)> {
        let index = ((v >> 16) & 0xff_ffff) as u32;
        if v >> 60 == kind as u64
            && let Some(slot) = self.slot(index)
        {
            let g = slot.lock();
            if g.tag == v & TAG_MASK && g.obj.is_some() {
                let h = Handle { kind, generation: ((v >> 40) as u32) & GEN_MASK, index, sub: v as u16 };
                return Ok((h, Guard { g }));
            }
        }
        Err(self.lookup_error(v, &[kind]))
    }

    /// Locks the object of handle `v`, which must be of one of `kinds`.
    pub fn get_any(&self, v: u64, kinds: &[Kind]) -> Result<(Handle, Guard<'_, T>)> {
        match kinds.iter().find(|k| v >> 60 == **k as u64) {
            Some(&k) => self.get(v, k),
            None => Err(self.lookup_error(v, kinds)),
        }
    }

    /// Calls `f` with every live object, in handle order; `None` for one another thread has
    /// held for `wait` (a debugger may call this with a thread stopped holding a lock: the
    /// object is skipped, not waited for). Not for the data path: it visits every entry.
    pub fn for_each_live(&self, wait: std::time::Duration, mut f: impl FnMut(Option<&mut T>)) {
        let issued = self.free.lock().next;
        for index in 0..issued {
            let Some(slot) = self.slot(index) else { continue };
            match slot.try_lock_for(wait) {
                Some(mut g) => {
                    if let Some(obj) = g.obj.as_mut() {
                        f(Some(obj));
                    }
                }
                None => f(None),
            }
        }
    }

    /// Removes and returns the object of handle `v`.
    pub fn remove(&self, v: u64, kind: Kind) -> Result<T> {
        let (h, mut g) = self.get(v, kind)?;
        g.g.tag = 0;
        let obj = g.g.obj.take().expect("live entry");
        drop(g);
        self.free.lock().free.push(h.index);
        Ok(obj)
    }

    /// Why handle `v` names no live object of one of `want`.
    #[cold]
    fn lookup_error(&self, v: u64, want: &[Kind]) -> Error {
        let what = want[0].name();
        let Some(h) = Handle::decode(v) else {
            return Error::invalid_argument(format!("{v:#x} is not a valid {what} handle"));
        };
        if !want.contains(&h.kind) {
            return Error::invalid_argument(format!("handle {v:#x} is a {}, not a {what}", h.kind.name()));
        }
        if self.slot(h.index).is_none() {
            return Error::invalid_argument(format!("{what} handle {v:#x} was never issued"));
        }
        Error::invalid_argument(format!("{} handle {v:#x} is stale (already closed)", h.kind.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_are_never_null_or_the_optional_marker() {
        let h = Handle { kind: Kind::Recv, generation: 5, index: 77, sub: 0 };
        assert_eq!(Handle::decode(h.encode()), Some(h));
        let r = h.request(300, 100);
        assert_eq!(Handle::split_request(r), Some((h.encode(), Kind::Recv, 300, 100)));
        assert_eq!(Handle::split_request(h.encode()), None, "a comm is not a request");
        assert!(h.encode() > 1, "never NULL nor NCCL_NET_OPTIONAL_RECV_COMPLETION");
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(1), None);
    }

    #[test]
    fn stale_wrong_kind_and_garbage_handles_are_errors() {
        let t: Table<String> = Table::new();
        let a = t.insert(Kind::Send, "a".into()).unwrap();
        assert_eq!(*t.get(a, Kind::Send).unwrap().1, "a");
        let e = t.get(a, Kind::Recv).err().unwrap();
        assert!(e.msg().contains("is a send comm, not a receive comm"), "{}", e.msg());
        assert_eq!(t.remove(a, Kind::Send).unwrap(), "a");
        let e = t.get(a, Kind::Send).err().unwrap();
        assert!(e.msg().contains("stale"), "{}", e.msg());
        // The entry is reused with a new generation: the old handle stays dead.
        let b = t.insert(Kind::Send, "b".into()).unwrap();
        assert_ne!(a, b);
        assert!(t.get(a, Kind::Send).is_err());
        assert_eq!(*t.get(b, Kind::Send).unwrap().1, "b");
        for junk in [
            0u64,
            1,
            0xdead_beef,
            u64::MAX,
            Handle { kind: Kind::Send, generation: 1, index: 999_999, sub: 0 }.encode(),
        ] {
            assert!(t.get(junk, Kind::Send).is_err(), "{junk:#x}");
        }
    }
}
