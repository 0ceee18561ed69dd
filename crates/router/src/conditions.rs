//! Condition bookkeeping shared by the status renderer and the process state: the remembered
//! status of every condition, so `lastTransitionTime` moves only when a condition flips, and
//! the wall-clock conversion into the Kubernetes `Time` type.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::state::lock;

/// A wall-clock time in the Kubernetes `Time` type (whole milliseconds).
pub use switchyard_api::common::k8s_time as time;

/// Remembered condition statuses, so `lastTransitionTime` moves only on a flip.
#[derive(Debug, Default)]
pub struct Transitions(Mutex<HashMap<String, (String, DateTime<Utc>)>>);

impl Transitions {
    #[allow(clippy::too_many_arguments)] // one flat call per condition reads best at the call sites
    pub(crate) fn condition(
        &self,
        object: &str,
        kind: &str,
        status: bool,
        reason: &str,
        message: String,
        generation: Option<i64>,
        now: DateTime<Utc>,
    ) -> Condition {
        let status = if status { "True" } else { "False" }.to_owned();
        let mut map = lock(&self.0);
        let entry = map
            .entry(format!("{object}#{kind}"))
            .or_insert_with(|| (status.clone(), now));
        if entry.0 != status {
            *entry = (status.clone(), now);
        }
        switchyard_api::common::new_condition(
            kind,
            entry.0 == "True",
            reason,
            message,
            generation,
            time(entry.1),
        )
    }
}
