//! The soft fabric: a software RDMA NIC over TCP with RC verbs semantics.
