//! Collecting outcome counters from every router replica (DESIGN §2, `switchyard_api::outcomes`).
//!
//! Each control interval the leader fetches `GET /outcomes` from every replica, concurrently and
//! with a timeout, and turns the cumulative counters into the window's counts per provider:
//!
//! ```text
//! per replica r (keyed by its address):
//!   first sight:  delta = counters        if startedAt > previous tick (it started in this window)
//!                 delta = 0               otherwise (baseline: its past belongs to earlier windows)
//!   same process: delta = counters − last (per provider, per class)
//!   reset:        delta = counters        (startedAt or replica name changed, or any counter went down)
//!   unreachable:  skipped, its last report kept, so the next good scrape's delta covers both
//!                 windows; reported in the result, a log line and a metric
//! window(provider) = Σ_r delta_r(provider)
//! ```
//!
//! Cumulative counters with a kept baseline lose nothing on a missed scrape; only the traffic a
//! replica served between its last scrape and its removal is lost (at most one interval).
//! Provider-side errors are the classes `ErrorClass::is_provider_side` accepts (everything but
//! `request` and `deadline`); unknown class names are ignored so a newer router can add classes.
//!
//! Replicas are found through the EndpointSlices of the router Service (label
//! `kubernetes.io/service-name`; ready endpoints only) or given as a static list of base URLs
//! for routers outside the cluster.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use switchyard_api::outcomes::{OUTCOMES_PATH, OutcomeReport, ProviderOutcomes};
use switchyard_core::availability::WindowCounts;
use switchyard_core::classify::ErrorClass;

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
}

impl ProviderWindow {
    /// The counts the availability controller takes.
    pub fn counts(&self) -> WindowCounts {
        WindowCounts {
            successes: self.successes,
            provider_errors: self.provider_errors,
        }
    }

    fn add(&mut self, d: &ProviderOutcomes) {
        self.successes += d.successes;
        self.cancelled += d.cancelled;
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
    /// First sight, started before the previous tick: a baseline, nothing counted.
    Baseline,
    /// First sight, started during this window: everything counted.
    Started,
    /// Restarted since the last scrape: the new counters were counted.
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
}

/// Scrapes replicas and keeps the last report of each (see the module docs).
#[derive(Debug)]
pub struct Collector {
    http: reqwest::Client,
    last: HashMap<String, OutcomeReport>,
    previous_tick: Option<DateTime<Utc>>,
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
        c.successes < p.successes
            || c.cancelled < p.cancelled
            || p.errors.iter().any(|(class, n)| c.errors_of(class) < *n)
    })
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
            previous_tick: None,
        }
    }

    /// Forgets every replica (on losing leadership: a later term starts from baselines).
    pub fn clear(&mut self) {
        self.last.clear();
        self.previous_tick = None;
    }

    /// Takes one replica's report into `into` and remembers it; pure apart from `self`.
    pub fn absorb(&mut self, address: &str, report: OutcomeReport, into: &mut Collected) {
        let state = match self.last.get(address) {
            Some(prev) if reset(prev, &report) => ReplicaState::Reset,
            Some(_) => ReplicaState::Continued,
            None => match self.previous_tick {
                Some(tick) if report.started_at > tick => ReplicaState::Started,
                _ => ReplicaState::Baseline,
            },
        };
        if state != ReplicaState::Baseline {
            let prev = match state {
                ReplicaState::Continued => self.last.get(address),
                _ => None,
            };
            for (key, counters) in &report.providers {
                let delta = minus(counters, prev.and_then(|p| p.providers.get(key)));
                into.providers.entry(key.clone()).or_default().add(&delta);
            }
        }
        into.scraped.insert(address.to_owned(), state);
        self.last.insert(address.to_owned(), report);
    }

    /// Scrapes every address concurrently and returns the window's counts; `now` becomes the
    /// previous tick of the next round. Replicas no longer listed are forgotten.
    pub async fn collect(&mut self, addresses: &[String], now: DateTime<Utc>) -> Collected {
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
                Ok(report) => self.absorb(&address, report, &mut out),
                Err(e) => {
                    tracing::warn!(replica = %address, error = %e, "router replica unreachable; skipped this interval");
                    out.unreachable.insert(address, e.to_string());
                }
            }
        }
        self.last.retain(|address, _| addresses.contains(address));
        self.previous_tick = Some(now);
        out
    }

    /// Sets the time of the previous tick (tests, and a collector resumed mid-term).
    pub fn set_previous_tick(&mut self, at: Option<DateTime<Utc>>) {
        self.previous_tick = at;
    }
}
