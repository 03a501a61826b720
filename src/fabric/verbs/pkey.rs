//! Partitions: the entry of a port's P_Key table the QPs use (`MPIB_PKEY`, else
//! `NCCL_IB_PKEY`: a table index, as net_ib uses it; default 0, the default partition of
//! every port). The index is checked against the port's table when the device opens: an
//! index with no P_Key there fails then, naming the table, instead of every connection's
//! `ibv_modify_qp` later. Both ends of a connection must be members of one partition (one
//! of them a full member) or the peer's HCA drops every packet; that is the fabric
//! manager's business, the log line says which P_Key each port uses.

use rdma_mummy_sys as ibv;

use super::sys::{self, ret_errno};
use crate::error::{Error, Result};

/// The membership bit of a P_Key: set for a full member, clear for a limited one.
const FULL_MEMBER: u16 = 0x8000;

/// The first `len` entries of the port's P_Key table (host order; 0 = an empty entry). An
/// entry that cannot be read ends the table.
pub fn read_table(ctx: *mut ibv::ibv_context, dev: &str, port: u8, len: usize) -> Vec<u16> {
    let mut table = Vec::new();
    for index in 0..len.min(1024) {
        let mut be: u16 = 0;
        // SAFETY: ctx is an open context; `be` is a valid out pointer.
        let ret = unsafe { ibv::ibv_query_pkey(ctx, port, index as i32, &mut be) };
        if ret != 0 {
            log::debug!("{dev}:{port}: ibv_query_pkey({index}): {}", sys::strerror(ret_errno(ret)));
            break;
        }
        table.push(u16::from_be(be));
    }
    table
}

/// The P_Key at `index` of a port whose table is `table` (empty: it could not be read, and
/// the index is used as given: `None`); an error when the index holds none.
pub fn check(table: &[u16], index: u16, dev: &str, port: u8) -> Result<Option<u16>> {
    if table.is_empty() {
        return Ok(None);
    }
    match table.get(index as usize) {
        Some(p) if p & !FULL_MEMBER != 0 => Ok(Some(*p)),
        _ => {
            let items: Vec<String> = table
                .iter()
                .enumerate()
                .filter(|(_, p)| **p & !FULL_MEMBER != 0)
                .map(|(i, p)| format!("{i}={p:#06x}"))
                .collect();
            Err(Error::invalid_argument(format!(
                "P_Key index {index} (MPIB_PKEY, else NCCL_IB_PKEY): {dev}:{port} has no P_Key there (table: {})",
                if items.is_empty() { "empty".to_string() } else { items.join(", ") }
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_must_hold_a_pkey() {
        let t = [0xffff, 0x8001, 0, 0x0002];
        assert_eq!(check(&t, 0, "mlx5_0", 1).unwrap(), Some(0xffff), "the default partition");
        assert_eq!(check(&t, 1, "mlx5_0", 1).unwrap(), Some(0x8001));
        assert_eq!(check(&t, 3, "mlx5_0", 1).unwrap(), Some(0x0002), "a limited member's entry");
        let e = check(&t, 2, "mlx5_0", 1).unwrap_err();
        assert!(e.msg().contains("P_Key index 2 (MPIB_PKEY, else NCCL_IB_PKEY): mlx5_0:1 has no P_Key there"), "{e}");
        assert!(e.msg().contains("0=0xffff, 1=0x8001, 3=0x0002"), "{e}");
        assert!(check(&t, 7, "mlx5_0", 1).is_err(), "beyond the table");
        assert!(check(&[0x8000], 0, "mlx5_0", 1).is_err(), "partition 0 is no partition");
        assert_eq!(check(&[], 3, "rxe0", 1).unwrap(), None, "a table that cannot be read: as given");
    }
}
