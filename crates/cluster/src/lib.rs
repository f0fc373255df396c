//! ditto's control plane
//! =====================
//! A Raft group over the nodes (raft-rs: nothing about consensus is written here) holds
//! the epoch, the primary, the members and the commit policy; failure detection and the
//! failover's steps run on its leader (Rolis 4, Query Fresh 3.4.4; docs/cluster.md).
//!
//! ```text
//!  node.rs         ControlNode: raft-rs's RawNode, its Ready protocol, and the
//!                  committed Commands applied to the ControlState (no I/O)
//!  state.rs        ControlState and Command: members, policy, epochs and their
//!                  recovery points; what a node accepts (the fence)
//!  coordinator.rs  failure detection and the failover's steps, on the Raft leader
//!  failover.rs     where the old epoch ends: the recovery point from a quorum of tail
//!                  reports (Rolis figure 8), the new primary, what it must fetch
//!  disk.rs         FileDisk: a node's Raft state and fence in one checksummed file
//!  service.rs      ControlService: one node on threads, over TCP, on a FileDisk (I/O)
//! ```
//!
//! Every part but disk.rs and service.rs is free of I/O, so the deterministic simulation (tests/sim.rs) drives
//! whole clusters through partitions, lost and delayed messages, crashes and restarts,
//! one seed reproducing a run. Above this crate: the server (which carries the messages
//! over TCP and keeps the Raft state on disk) and the binary.

pub mod coordinator;
pub mod disk;
pub mod failover;
pub mod node;
pub mod service;
pub mod state;

pub use coordinator::{Action, Coordinator, Fence, Timeouts};
pub use disk::{DiskError, FileDisk};
pub use failover::{plan, Fetch, PlanError, RecoveryPlan, TailReport};
pub use node::{quiet_logger, raft_logger, Applied, ControlDisk, ControlNode, NodeError, Output, RaftDurable, Timing};
pub use service::{
    admin_request, is_refused, load_secret, AdminReply, AdminRequest, ClusterSecret, ControlService, Ctl, DataPlane,
    Holding, Secret, ServiceConfig, ServiceError, Status, SECRETS_ALSO_MAX, SECRET_BYTES_MAX, SECRET_BYTES_MIN,
};
pub use state::{Command, ControlState, EpochRecord, Member, NodeId, Phase};
