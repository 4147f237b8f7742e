//! The network edge below gRPC: the accept loop, TLS, and the limits that keep clients,
//! hostile or slow, from holding more of the server than the operator allows.

mod budget;
mod connection;
mod descriptors;
mod limits;
mod listener;
mod request_limits;
mod serve;
mod slots;
mod tls;

pub(crate) use budget::{Budgets, Charge};
pub use budget::{PeerShare, ResponseBudget};
pub(crate) use connection::Connection;
pub use connection::ConnectionInfo;
pub use descriptors::{
    DescriptorPlan, plan as plan_descriptors, raise_limit as raise_descriptor_limit,
};
pub use limits::{Limits, MAX_MESSAGE_BYTES};
pub(crate) use listener::incoming;
pub(crate) use request_limits::{HTTP2_HOLDS, OPEN_MESSAGE_BYTES, RequestLimitsLayer};
pub(crate) use serve::serve;
pub(crate) use tls::peer_tls;
pub use tls::{ServerTls, TlsError, TlsFiles};
