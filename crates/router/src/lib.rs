//! switchyard-router: the data plane.

pub mod upstream;
pub mod wire;
