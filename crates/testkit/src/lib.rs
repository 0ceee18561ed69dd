//! Test helpers shared by Switchyard's crates (a dev-dependency only).
//!
//! [`RedisServer`] runs a throwaway `redis-server` for the quota store's tests: a free loopback
//! port, no persistence, killed on drop, and [`RedisServer::stop`] / [`RedisServer::restart`]
//! for outage tests. Tests never skip when the binary is missing: they fail and say how to
//! install it (`.ci/run` installs it from Debian packages).

mod redis_server;

pub use redis_server::{RedisServer, RedisServerError};
