//! Availability controller (DESIGN §4.1). Placeholder body; see the final version.

/// Controller settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// Target provider-side error rate (0.005 = 0.5 %); `K = 1/target`.
    pub target_error_rate: f64,
    /// Proportional gain.
    pub kp: f64,
    /// Integral gain.
    pub ki: f64,
    /// Derivative gain.
    pub kd: f64,
    /// Bound on the integral term's state.
    pub integral_limit: f64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            target_error_rate: 0.005,
            kp: 0.1,
            ki: 0.3,
            kd: 0.0,
            integral_limit: 10.0,
        }
    }
}

/// Outcomes of one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowCounts {
    /// Successful responses.
    pub successes: u64,
    /// Provider-side errors only.
    pub provider_errors: u64,
}

/// Result of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Availability after the step.
    pub availability: f64,
    /// Raw score.
    pub score: f64,
    /// Normalised error signal.
    pub error_signal: f64,
}

/// PID availability controller.
#[derive(Debug, Clone)]
pub struct AvailabilityController {
    cfg: ControllerConfig,
    availability: f64,
}

impl AvailabilityController {
    /// Starts at 1.
    pub fn new(cfg: ControllerConfig) -> Self {
        Self::with_availability(cfg, 1.0)
    }

    /// Starts at `a`.
    pub fn with_availability(cfg: ControllerConfig, a: f64) -> Self {
        AvailabilityController {
            cfg,
            availability: if a.is_nan() { 1.0 } else { a.clamp(0.0, 1.0) },
        }
    }

    /// Current availability.
    pub fn availability(&self) -> f64 {
        self.availability
    }

    /// One interval.
    pub fn step(&mut self, counts: WindowCounts) -> StepReport {
        let k = 1.0 / self.cfg.target_error_rate;
        let s = counts.successes as f64;
        let e = counts.provider_errors as f64;
        let score = s - k * e + 1.0;
        let sig = score / (s + e + 1.0);
        self.availability =
            (self.availability + self.cfg.ki * sig.clamp(-1.0, 1.0)).clamp(0.0, 1.0);
        StepReport {
            availability: self.availability,
            score,
            error_signal: sig,
        }
    }
}
