//! Collecting outcome counters from every router replica (DESIGN §2, `switchyard_api::outcomes`).
//!
//! Each control interval the leader fetches `GET /outcomes` from every replica, concurrently and
//! with a timeout, and turns the cumulative counters into the window's counts per provider:
//!
//! ```text
//! per replica r (keyed by its address):
//!   first sight:  delta = counters − checkpoint   when the provider's status.counted has r
//!                                                 (same replica name and startedAt, no counter
//!                                                 below it): what the previous leader, or this
//!                                                 process before a restart, already counted
//!                 delta = counters                otherwise (never counted, or restarted since)
//!   same process: delta = counters − last (per provider, per class)
//!   reset:        delta = counters        (startedAt or replica name changed, or any counter went down)
//!   unreachable:  skipped, its last report kept, so the next good scrape's delta covers both
//!                 windows; reported in the result, a log line and a metric
//! window(provider) = Σ_r delta_r(provider)
//! checkpoint(provider) = every listed replica's last report for it, written to
//!                        status.counted together with the window it fed
//! ```
//!
//! The checkpoint goes into the same status write as the window, so the stored availability and
//! the stored "counted up to" always agree: a write that fails loses neither half alone, and a
//! new leader (or a restarted operator) resumes from both. Before checkpoints, a first sight was
//! a baseline and everything a replica served before the first scrape of a term was lost.
//!
//! Cumulative counters with a kept checkpoint lose nothing on a missed scrape or a change of
//! leader; only the traffic a replica served between its last scrape and its removal is lost (at
//! most one interval).
//! Provider-side errors are the classes `ErrorClass::is_provider_side` accepts (everything but
//! `request` and `deadline`); unknown class names are ignored so a newer router can add classes.
//!
//! Replicas are found through the EndpointSlices of the router Service (label
//! `kubernetes.io/service-name`; ready endpoints only) or given as a static list of base URLs
//! for routers outside the cluster.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::DateTime;
use futures::future::join_all;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use switchyard_api::outcomes::{OUTCOMES_PATH, OutcomeReport, ProviderOutcomes};
use switchyard_api::provider::ReplicaCounted;
use switchyard_core::availability::WindowCounts;
use switchyard_core::classify::ErrorClass;
use switchyard_core::latency::slow_as_errors;

/// Where the router replicas are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Base URLs given on the command line, such as `http://10.0.0.7:8080`.
    Static(Vec<String>),
    /// The ready endpoints of a Service's EndpointSlices.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
        /// Port name to use; the slice's first port when `None`.
        port_name: Option<String>,
    },
}

/// Base URLs of the ready endpoints in `slices`, sorted and deduplicated.
///
/// An endpoint whose `conditions.ready` is `false` is left out (unset counts as ready, as the
/// API documents). IPv6 addresses are bracketed.
pub fn endpoint_urls(slices: &[EndpointSlice], port_name: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for slice in slices {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = match port_name {
            Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name)),
            None => ports.first(),
        };
        let Some(port) = port.and_then(|p| p.port) else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                if address.contains(':') {
                    out.push(format!("http://[{address}]:{port}"));
                } else {
                    out.push(format!("http://{address}:{port}"));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Lists the replicas' base URLs now.
///
/// # Errors
/// A failed EndpointSlice list (the tick then scrapes nobody and reports it).
pub async fn discover(client: &Client, targets: &Targets) -> Result<Vec<String>, kube::Error> {
    match targets {
        Targets::Static(urls) => Ok(urls.clone()),
        Targets::Service {
            namespace,
            name,
            port_name,
        } => {
            let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
            let list = api
                .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
                .await?;
            Ok(endpoint_urls(&list.items, port_name.as_deref()))
        }
    }
}

/// One provider's counts over one window, summed over replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderWindow {
    /// Successful attempts.
    pub successes: u64,
    /// Provider-side errors (what the availability controller counts).
    pub provider_errors: u64,
    /// Errors by class name, every class.
    pub errors: BTreeMap<String, u64>,
    /// Attempts the client cancelled.
    pub cancelled: u64,
    /// Successes judged slow by the routers' latency baselines.
    pub slow: u64,
}

impl ProviderWindow {
    /// The counts the availability controller takes: slow successes are soft errors
    /// (`switchyard_core::latency::slow_as_errors` at the controller's `target_error_rate`),
    /// as in the router's own windows.
    pub fn counts(&self, target_error_rate: f64) -> WindowCounts {
        WindowCounts {
            successes: self.successes,
            provider_errors: self.provider_errors + slow_as_errors(self.slow, target_error_rate),
        }
    }

    fn add(&mut self, d: &ProviderOutcomes) {
        self.successes += d.successes;
        self.cancelled += d.cancelled;
        self.slow += d.slow;
        for (class, n) in &d.errors {
            *self.errors.entry(class.clone()).or_default() += n;
            if is_provider_side(class) {
                self.provider_errors += n;
            }
        }
    }
}

fn is_provider_side(class: &str) -> bool {
    ErrorClass::ALL
        .iter()
        .find(|c| c.metric_label() == class)
        .is_some_and(|c| c.is_provider_side())
}

/// How one replica's report was taken into the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Seen before; the delta since the last scrape was counted.
    Continued,
    /// First sight, and a checkpoint in status covered it: the delta since it was counted.
    Resumed,
    /// First sight without a checkpoint (never counted): everything since its start counted.
    Started,
    /// Restarted since the last scrape or checkpoint: the new counters were counted.
    Reset,
}

/// The outcome of one collection round.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// Window counts by provider (`namespace/name`).
    pub providers: BTreeMap<String, ProviderWindow>,
    /// Replicas scraped, by address, with how each was counted.
    pub scraped: BTreeMap<String, ReplicaState>,
    /// Replicas that could not be scraped, by address, with the reason.
    pub unreachable: BTreeMap<String, String>,
    /// The reports of this round, as received (their tenants go into TenantQuota status,
    /// `crate::tenants`).
    pub reports: Vec<OutcomeReport>,
}

/// Checkpoints read from status: provider key (`namespace/name`) → replica name → counted
/// (one entry per process of that name: start times differ).
pub type Checkpoints = BTreeMap<String, BTreeMap<String, Vec<ReplicaCounted>>>;

/// Scrapes replicas and keeps the last report of each (see the module docs).
#[derive(Debug)]
pub struct Collector {
    http: reqwest::Client,
    last: HashMap<String, OutcomeReport>,
}

/// How long one scrape may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

fn reset(prev: &OutcomeReport, cur: &OutcomeReport) -> bool {
    if prev.started_at != cur.started_at || prev.replica != cur.replica {
        return true;
    }
    prev.providers.iter().any(|(key, p)| {
        let Some(c) = cur.providers.get(key) else {
            return p.successes > 0 || p.cancelled > 0 || p.errors.values().any(|n| *n > 0);
        };
        went_down(p, c)
    })
}

fn went_down(prev: &ProviderOutcomes, cur: &ProviderOutcomes) -> bool {
    cur.successes < prev.successes
        || cur.cancelled < prev.cancelled
        || cur.slow < prev.slow
        || prev
            .errors
            .iter()
            .any(|(class, n)| cur.errors_of(class) < *n)
}

/// The counters a checkpoint holds, when it belongs to the process that sent `report`.
fn resumable(checkpoint: &ReplicaCounted, report: &OutcomeReport) -> Option<ProviderOutcomes> {
    let started = DateTime::parse_from_rfc3339(&checkpoint.started_at).ok()?;
    (checkpoint.replica == report.replica && started == report.started_at).then(|| {
        ProviderOutcomes {
            successes: checkpoint.successes,
            errors: checkpoint.errors.clone(),
            cancelled: checkpoint.cancelled,
            in_flight: 0,
            slow: checkpoint.slow,
            // Not checkpointed: the controller does not count it.
            full_on_spill: 0,
        }
    })
}

/// The checkpoint entry for one replica's counters of one provider.
pub fn counted(report: &OutcomeReport, counters: &ProviderOutcomes) -> ReplicaCounted {
    ReplicaCounted {
        replica: report.replica.clone(),
        started_at: report
            .started_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        successes: counters.successes,
        errors: counters
            .errors
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| (c.clone(), *n))
            .collect(),
        cancelled: counters.cancelled,
        slow: counters.slow,
    }
}

fn minus(cur: &ProviderOutcomes, prev: Option<&ProviderOutcomes>) -> ProviderOutcomes {
    let Some(prev) = prev else { return cur.clone() };
    ProviderOutcomes {
        successes: cur.successes.saturating_sub(prev.successes),
        errors: cur
            .errors
            .iter()
            .map(|(class, n)| (class.clone(), n.saturating_sub(prev.errors_of(class))))
            .collect(),
        cancelled: cur.cancelled.saturating_sub(prev.cancelled),
        in_flight: cur.in_flight,
        slow: cur.slow.saturating_sub(prev.slow),
        full_on_spill: cur.full_on_spill.saturating_sub(prev.full_on_spill),
    }
}

impl Default for Collector {
    fn default() -> Self {
        Self::new()
    }
}

impl Collector {
    /// A collector that has seen nothing yet.
    pub fn new() -> Self {
        let http = reqwest::Client::builder()
            .timeout(SCRAPE_TIMEOUT)
            .build()
            .unwrap_or_default();
        Collector {
            http,
            last: HashMap::new(),
        }
    }

    /// Forgets every replica (on losing leadership: a later term resumes from checkpoints).
    pub fn clear(&mut self) {
        self.last.clear();
    }

    /// Takes one replica's report into `into` and remembers it; pure apart from `self`.
    /// `checkpoints` are consulted only on first sight of `address`.
    pub fn absorb(
        &mut self,
        address: &str,
        report: OutcomeReport,
        checkpoints: &Checkpoints,
        into: &mut Collected,
    ) {
        into.reports.push(report.clone());
        let state = match self.last.get(address) {
            Some(prev) if reset(prev, &report) => {
                for (key, counters) in &report.providers {
                    into.providers.entry(key.clone()).or_default().add(counters);
                }
                ReplicaState::Reset
            }
            Some(prev) => {
                for (key, counters) in &report.providers {
                    let delta = minus(counters, prev.providers.get(key));
                    into.providers.entry(key.clone()).or_default().add(&delta);
                }
                ReplicaState::Continued
            }
            None => {
                let mut state = ReplicaState::Started;
                for (key, counters) in &report.providers {
                    let entries = checkpoints
                        .get(key)
                        .and_then(|by_replica| by_replica.get(&report.replica));
                    let checkpoint =
                        entries.map(|all| all.iter().find_map(|c| resumable(c, &report)));
                    let base = match checkpoint {
                        Some(Some(base)) if !went_down(&base, counters) => {
                            state = ReplicaState::Resumed;
                            Some(base)
                        }
                        // Another process of the same replica name, or counters below the
                        // checkpoint: restarted since it was counted.
                        Some(_) => {
                            if state == ReplicaState::Started {
                                state = ReplicaState::Reset;
                            }
                            None
                        }
                        None => None,
                    };
                    let delta = minus(counters, base.as_ref());
                    into.providers.entry(key.clone()).or_default().add(&delta);
                }
                state
            }
        };
        into.scraped.insert(address.to_owned(), state);
        self.last.insert(address.to_owned(), report);
    }

    /// Scrapes every address concurrently and returns the window's counts. Replicas no longer
    /// listed are forgotten; `checkpoints` (from status) resume replicas seen for the first time.
    pub async fn collect(&mut self, addresses: &[String], checkpoints: &Checkpoints) -> Collected {
        let fetches = addresses.iter().map(|address| {
            let url = format!("{}{OUTCOMES_PATH}", address.trim_end_matches('/'));
            let http = self.http.clone();
            async move {
                let result = async {
                    let response = http.get(&url).send().await?.error_for_status()?;
                    response.json::<OutcomeReport>().await
                }
                .await;
                (address.clone(), result)
            }
        });
        let results = join_all(fetches).await;
        let mut out = Collected::default();
        for (address, result) in results {
            match result {
                Ok(report) => self.absorb(&address, report, checkpoints, &mut out),
                Err(e) => {
                    tracing::warn!(replica = %address, error = %e, "router replica unreachable; skipped this interval");
                    out.unreachable.insert(address, e.to_string());
                }
            }
        }
        self.last.retain(|address, _| addresses.contains(address));
        out
    }

    /// The checkpoint of provider `key`: every remembered replica's counters for it, sorted by
    /// replica name and start time (what goes into `status.counted`).
    pub fn counted(&self, key: &str) -> Vec<ReplicaCounted> {
        let mut out: Vec<ReplicaCounted> = self
            .last
            .values()
            .filter_map(|r| r.providers.get(key).map(|c| counted(r, c)))
            .collect();
        out.sort_by(|a, b| (&a.replica, &a.started_at).cmp(&(&b.replica, &b.started_at)));
        // Two addresses reporting one process (the same name and start) would repeat a key.
        out.dedup_by(|a, b| a.replica == b.replica && a.started_at == b.started_at);
        out
    }
}
