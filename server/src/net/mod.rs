//! The network edge below gRPC: the accept loop, TLS, and the limits that keep clients,
//! hostile or slow, from holding more of the server than the operator allows.

mod connection;
mod limits;
mod listener;
mod request_limits;
mod tls;

pub use connection::ConnectionInfo;
pub use limits::Limits;
pub(crate) use listener::incoming;
pub(crate) use request_limits::RequestLimitsLayer;
pub use tls::{ServerTls, TlsError, TlsFiles};
