//! The provider-neutral checks of `tests/fabric_checks` that the shared queues rely on
//! (a CQ shared by several QPs grows and keeps its completions; a QP drained off a shared
//! CQ), run on the soft fabric's in-process mode (its TCP mode shares the code that
//! matters here: the ring and its growth). The verbs provider runs the same checks in
//! `tests/verbs_device.rs` (Soft-RoCE in CI).

mod fabric_checks;

use std::sync::Arc;

use fabric_checks as checks;
use mpib::fabric::soft::{self, InprocNet, SoftDevice, SoftOptions};

fn inproc_pair() -> (Arc<SoftDevice>, Arc<SoftDevice>) {
    let net = InprocNet::new();
    let open = |n: &str| Arc::new(soft::open(&SoftOptions::inproc(n, &net)).expect("open"));
    (open("checks-ia"), open("checks-ib"))
}

#[test]
fn shared_cq_grows_and_keeps_its_completions() {
    let (a, b) = inproc_pair();
    checks::shared_cq_grows_and_keeps_its_completions(&a, &b);
}

#[test]
fn drain_marker_comes_last() {
    // The soft fabric posts no marker (its QP numbers are never reused): nothing to wait
    // for, and the check says so by returning early.
    let (a, b) = inproc_pair();
    checks::drain_marker_comes_last(&a, &b);
}
