//! Injected time.
//!
//! Core never reads a clock. Callers pass [`Instant`], a monotonic reading measured from an
//! arbitrary origin chosen by the caller (process start in the router, zero in the simulator).
//! Wall-clock time, needed only to turn an HTTP-date `Retry-After` into a delay, is passed
//! separately as a `chrono::DateTime<Utc>`.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A monotonic point in time: the elapsed [`Duration`] since an origin the caller chose.
///
/// Two instants are only comparable when they were measured from the same origin; the router
/// uses one origin per process and the simulator uses virtual time starting at zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(Duration);

impl Instant {
    /// The origin itself.
    pub const ZERO: Instant = Instant(Duration::ZERO);

    /// An instant `since_origin` after the origin.
    pub const fn from_origin(since_origin: Duration) -> Self {
        Instant(since_origin)
    }

    /// An instant `ms` milliseconds after the origin (convenient in tests and the simulator).
    pub const fn from_millis(ms: u64) -> Self {
        Instant(Duration::from_millis(ms))
    }

    /// Elapsed time since the origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to `self`, or zero when `earlier` is later (never panics).
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(rhs))
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_sub(rhs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_saturating_since_earlier_later_is_zero() {
        let a = Instant::from_millis(10);
        let b = Instant::from_millis(25);
        assert_eq!(b.saturating_since(a), Duration::from_millis(15));
        assert_eq!(a.saturating_since(b), Duration::ZERO);
        assert_eq!(a + Duration::from_millis(5), Instant::from_millis(15));
        assert_eq!(a - Duration::from_secs(1), Instant::ZERO);
    }
}
