//! The router's clock: monotonic readings for core decisions and wall-clock time for
//! HTTP dates and status timestamps.

use chrono::{DateTime, Utc};
use switchyard_core::time::Instant;

/// Monotonic origin of one process; core [`Instant`]s are measured from it.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Clock {
            origin: tokio::time::Instant::now(),
        }
    }

    /// Monotonic time since the origin (follows tokio's paused clock in tests).
    pub fn now(&self) -> Instant {
        Instant::from_origin(tokio::time::Instant::now().saturating_duration_since(self.origin))
    }

    /// The tokio instant of a core instant.
    pub fn to_tokio(&self, at: Instant) -> tokio::time::Instant {
        self.origin + at.since_origin()
    }

    /// Wall-clock time, for HTTP-date `Retry-After` values and status timestamps.
    #[allow(clippy::disallowed_methods)] // the one place the router reads the wall clock
    pub fn wall(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
