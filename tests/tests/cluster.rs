//! End-to-end against a real cluster (issue 6): opt-in, for kind or k3d.
//!
//! Gate ([`gate`]): the test runs only when `KUBECONFIG` is set and the API server answers
//! (`kubectl get --raw /readyz`); otherwise it is skipped with a note, unless
//! `SWITCHYARD_REQUIRE_CLUSTER=1`, which turns every skip into a failure (CI with a cluster).
//!
//! What it does, with `kubectl` (or `SWITCHYARD_KUBECTL`) and the `switchyard` binary:
//! 1. applies `crds/`, waits until they are established;
//! 2. creates the namespace `ai-platform`, the Secrets the examples reference, and applies
//!    `config/examples/` plus one provider (`e2e-mock`, an in-process mock provider on
//!    loopback), one policy (`e2e-chat`) and one tenant (`e2e-tenant`, key `sk-cluster-e2e`);
//! 3. runs `switchyard operator` (interval 3 s, static router address, no election) and, when
//!    the binary has it, `switchyard router` in Kubernetes mode, both as local processes;
//! 4. sends chat requests through the router and expects, within two intervals (plus slack for
//!    watch latency), `e2e-mock`'s status to show its successes and availability and
//!    `e2e-chat`'s status its weights; without a router it expects the operator's validation
//!    status on every example object;
//! 5. applies invalid manifests from `config/examples/invalid/` and expects the API server
//!    to refuse each with its CEL rule's message (a limit rule and the weighted-tier rules).
//!
//! Everything it created in `ai-platform` is deleted at the end, by a drop guard also when a
//! step fails; the CRDs stay.
//!
//! Scenario tests (issue 15), each in a namespace of its own (`sy-<tag>-<pid>`, deleted with its
//! objects by a drop guard) and one at a time (one stops the API server):
//! - traffic the router served before the operator started is in the operator's first window,
//!   written within one interval of its start;
//! - an operator SIGKILLed and restarted mid-traffic: the restarted one's first window starts
//!   exactly where the killed one's `status.counted` stopped, and in the end every success the
//!   router counted is counted;
//! - two operators on a real Lease: only the leader writes (metrics), the follower takes the
//!   Lease within its 15 s duration after the leader is SIGKILLed, nothing is lost, and the
//!   status has one field manager (`switchyard-operator`, Apply, status subresource);
//! - fail-static: a Secret rotation reaches the running router; the API server and etcd are
//!   stopped under load (`../shared/kapi/down.sh`, or `SWITCHYARD_KAPI_DIR`) with no client
//!   error, the router reports staleness in `/status` and `switchyard_config_stale_seconds`, the
//!   operator counts watch errors; after `up.sh` the watches recover; a change made while the
//!   router is cut off (a TCP forwarder the test closes) reaches it once reconnected;
//! - the chart, rendered for the default and HA values (`tests/helm/render_chart.py`, the venv's
//!   helm-python-sdk), is accepted object by object by a server-side dry-run apply into a
//!   namespace, for every kind the server serves.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_mock::{MockConfig, MockHandle, MockProvider};

/// What to do with the cluster test.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gate {
    /// A cluster is configured and reachable.
    Run,
    /// Skip, saying why.
    Skip(String),
    /// Fail, saying why (a cluster was required).
    Fail(String),
}

/// Decides from `KUBECONFIG`, `SWITCHYARD_REQUIRE_CLUSTER` and a reachability probe (called
/// only when a kubeconfig is set).
fn gate(
    kubeconfig: Option<&str>,
    require: Option<&str>,
    reachable: impl FnOnce() -> Result<(), String>,
) -> Gate {
    let required = require.is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let verdict = |why: String| {
        if required {
            Gate::Fail(format!("SWITCHYARD_REQUIRE_CLUSTER=1 but {why}"))
        } else {
            Gate::Skip(why)
        }
    };
    match kubeconfig.filter(|k| !k.is_empty()) {
        None => verdict("KUBECONFIG is not set".to_owned()),
        Some(_) => match reachable() {
            Ok(()) => Gate::Run,
            Err(why) => verdict(format!("no cluster is reachable: {why}")),
        },
    }
}

#[test]
fn gate_without_kubeconfig_skips_and_never_probes() {
    let g = gate(None, None, || panic!("must not probe without a kubeconfig"));
    assert!(
        matches!(g, Gate::Skip(ref why) if why.contains("KUBECONFIG")),
        "{g:?}"
    );
    assert!(matches!(gate(Some(""), None, || Ok(())), Gate::Skip(_)));
}

#[test]
fn gate_required_without_kubeconfig_fails() {
    let g = gate(None, Some("1"), || Ok(()));
    assert!(
        matches!(g, Gate::Fail(ref why) if why.contains("KUBECONFIG is not set")),
        "{g:?}"
    );
}

#[test]
fn gate_unreachable_cluster_skips_or_fails_when_required() {
    let down = || Err("connection refused".to_owned());
    assert!(
        matches!(gate(Some("/k"), None, down), Gate::Skip(ref w) if w.contains("connection refused"))
    );
    assert!(matches!(gate(Some("/k"), Some("0"), down), Gate::Skip(_)));
    let g = gate(Some("/k"), Some("1"), down);
    assert!(
        matches!(g, Gate::Fail(ref w) if w.contains("no cluster is reachable: connection refused")),
        "{g:?}"
    );
}

#[test]
fn gate_reachable_cluster_runs() {
    assert_eq!(gate(Some("/k"), None, || Ok(())), Gate::Run);
    assert_eq!(gate(Some("/k"), Some("1"), || Ok(())), Gate::Run);
}

// ---------------------------------------------------------------------------------------------

const NS: &str = "ai-platform";
const KEY: &str = "sk-cluster-e2e";
const INTERVAL_SECS: u64 = 3;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubectl_bin() -> String {
    std::env::var("SWITCHYARD_KUBECTL").unwrap_or_else(|_| "kubectl".to_owned())
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(kubectl_bin());
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run {}: {e}", kubectl_bin()));
    if let Some(text) = stdin {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn probe_cluster() -> Result<(), String> {
    let out = Command::new(kubectl_bin())
        .args(["get", "--raw", "/readyz", "--request-timeout=5s"])
        .output()
        .map_err(|e| format!("failed to run {}: {e}", kubectl_bin()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn get_json(kind: &str, name: &str) -> Option<Value> {
    let out = kubectl(&["get", kind, name, "-n", NS, "-o", "json"], None);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// A child process killed on drop, its output kept in a file for failure reports.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, args: &[String], dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(common::switchyard_bin())
            .args(args)
            .env("RUST_LOG", "info")
            // The replica identity in /outcomes: two routers of one test are two replicas.
            .env("POD_NAME", name)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Proc { name, child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} output ---\n{}", self.name, self.output());
        }
    }
}

/// Deletes the examples and the test's own objects on drop (the CRDs stay).
struct Cleanup {
    objects: String,
    examples: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = kubectl(
            &[
                "delete",
                "-f",
                self.examples.to_str().unwrap_or_default(),
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
        let _ = kubectl(
            &["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
            Some(&self.objects),
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn secret_yaml(name: &str, key: &str, value: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {NS}}}\nstringData: {{{key}: {value}}}\n"
    )
}

async fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> Option<String>) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let Some(last) = check() else { return };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}; last seen: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ready_status(obj: &Value) -> Option<String> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_operator_and_router_write_status_and_api_server_enforces_cel() {
    let _serial = serial().await;
    let kubeconfig = std::env::var("KUBECONFIG").ok();
    let require = std::env::var("SWITCHYARD_REQUIRE_CLUSTER").ok();
    match gate(kubeconfig.as_deref(), require.as_deref(), probe_cluster) {
        Gate::Run => {}
        Gate::Skip(why) => {
            eprintln!("skipping the cluster test: {why}");
            return;
        }
        Gate::Fail(why) => panic!("{why}"),
    }
    let repo = repo();
    let dir = tempfile::tempdir().unwrap();

    // 1. CRDs.
    kubectl_ok(&["apply", "-f", repo.join("crds").to_str().unwrap()], None);
    for crd in ["llmproviders", "routingpolicies", "tenantquotas"] {
        kubectl_ok(
            &[
                "wait",
                "--for=condition=established",
                "--timeout=60s",
                &format!("crd/{crd}.switchyard.dev"),
            ],
            None,
        );
    }

    // 2. Namespace, Secrets, examples, and the mock-backed objects traffic goes through.
    let ns_yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n");
    kubectl_ok(&["apply", "-f", "-"], Some(&ns_yaml));
    let mock = MockProvider::start(MockConfig {
        name: "e2e-mock".to_owned(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut objects = String::new();
    for (name, key) in [
        ("anthropic-api", "api-key"),
        ("vertex-sa", "key.json"),
        ("acme-agents-keys", "prod"),
        ("acme-batch-keys", "nightly"),
        ("e2e-mock-creds", "api-key"),
    ] {
        objects.push_str(&secret_yaml(name, key, "placeholder"));
    }
    objects.push_str(&secret_yaml("e2e-keys", "default", KEY));
    objects.push_str(&format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: aws-bedrock, namespace: {NS}}}\nstringData: {{access-key-id: placeholder, secret-access-key: placeholder}}\n"
    ));
    objects.push_str(&format!(
        "---\napiVersion: switchyard.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: e2e-mock, namespace: {NS}}}\nspec:\n  api: openai\n  endpoint: {}\n  region: us-east-1\n  credentials: {{secretRef: {{name: e2e-mock-creds, key: api-key}}}}\n  models:\n    - {{name: e2e-chat}}\n",
        mock.base_url()
    ));
    objects.push_str(&format!(
        "---\napiVersion: switchyard.dev/v1alpha1\nkind: RoutingPolicy\nmetadata: {{name: e2e-chat, namespace: {NS}}}\nspec:\n  model: e2e-chat\n  serviceType: chat\n  providers: [{{name: e2e-mock}}]\n  availability: {{interval: {INTERVAL_SECS}s}}\n"
    ));
    objects.push_str(&format!(
        "---\napiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: e2e-tenant, namespace: {NS}}}\nspec:\n  apiKeys: [{{name: default, secretRef: {{name: e2e-keys, key: default}}}}]\n"
    ));
    // Deleted on drop, also when a step below fails.
    let _cleanup = Cleanup {
        objects: objects.clone(),
        examples: repo.join("config/examples"),
    };
    kubectl_ok(&["apply", "-f", "-"], Some(&objects));
    kubectl_ok(
        &[
            "apply",
            "-f",
            repo.join("config/examples").to_str().unwrap(),
        ],
        None,
    );

    // 3. Operator and (when available) router, as local processes.
    let router_port = free_port();
    let router_url = format!("http://127.0.0.1:{router_port}");
    let kubeconfig = kubeconfig.unwrap();
    let operator = Proc::spawn(
        "operator",
        &[
            "operator".into(),
            format!("--namespace={NS}"),
            format!("--kubeconfig={kubeconfig}"),
            format!("--router-address={router_url}"),
            "--no-leader-election".into(),
            format!("--interval={INTERVAL_SECS}s"),
            "--metrics-listen=127.0.0.1:0".into(),
            "--identity=cluster-e2e".into(),
        ],
        dir.path(),
    );
    let has_router = Command::new(common::switchyard_bin())
        .args(["router", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    let router = has_router.then(|| {
        Proc::spawn(
            "router",
            &[
                "router".into(),
                format!("--namespace={NS}"),
                format!("--kubeconfig={kubeconfig}"),
                format!("--listen=127.0.0.1:{router_port}"),
            ],
            dir.path(),
        )
    });

    // Validation status appears on the example objects in any case.
    wait_until(Duration::from_secs(30), "Ready on the examples", || {
        let Some(p) = get_json("llmprovider", "anthropic-direct") else {
            return Some("llmprovider anthropic-direct not found".to_owned());
        };
        let Some(t) = get_json("tenantquota", "acme-agents") else {
            return Some("tenantquota acme-agents not found".to_owned());
        };
        (ready_status(&p).as_deref() == Some("True") && ready_status(&t).as_deref() == Some("True"))
            .then_some(())
            .map_or_else(
                || Some(format!("{} / {}", p["status"], t["status"])),
                |()| None,
            )
    })
    .await;

    if router.is_some() {
        // 4. Traffic through the router, then availability and weights in status.
        let http = reqwest::Client::new();
        let mut served = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while served < 20 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "router never served; {}",
                operator.output()
            );
            let reply = http
                .post(format!("{router_url}/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(
                    &json!({"model": "e2e-chat", "messages": [{"role": "user", "content": "hi"}]}),
                )
                .send()
                .await;
            match reply {
                Ok(r) if r.status().is_success() => served += 1,
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        let sent_at = tokio::time::Instant::now();
        // Two intervals, plus the watch and scrape latency of a local cluster.
        wait_until(
            Duration::from_secs(2 * INTERVAL_SECS + 10),
            "availability in status",
            || {
                let Some(p) = get_json("llmprovider", "e2e-mock") else {
                    return Some("llmprovider e2e-mock not found".to_owned());
                };
                let successes = p["status"]["lastWindow"]["successes"].as_u64().unwrap_or(0);
                let seen = p["status"]["availability"].is_number() && successes > 0;
                (!seen).then(|| p["status"].to_string())
            },
        )
        .await;
        wait_until(
            Duration::from_secs(2 * INTERVAL_SECS + 10),
            "weights in status",
            || {
                let Some(r) = get_json("routingpolicy", "e2e-chat") else {
                    return Some("routingpolicy e2e-chat not found".to_owned());
                };
                let w = &r["status"]["providers"][0];
                let seen = w["name"] == "e2e-mock"
                    && w["weight"].is_number()
                    && w["availability"].is_number();
                (!seen).then(|| r["status"].to_string())
            },
        )
        .await;
        eprintln!("status appeared {:?} after the traffic", sent_at.elapsed());
    } else {
        eprintln!("`switchyard router` is not in this build: checked the operator alone");
        wait_until(
            Duration::from_secs(2 * INTERVAL_SECS + 10),
            "weights in status",
            || {
                let Some(r) = get_json("routingpolicy", "e2e-chat") else {
                    return Some("routingpolicy e2e-chat not found".to_owned());
                };
                let w = &r["status"]["providers"][0];
                (!(w["weight"].is_number())).then(|| r["status"].to_string())
            },
        )
        .await;
    }

    // 5. The API server refuses an invalid manifest with the CEL rule's message.
    let invalid = repo.join("config/examples/invalid/concurrency-with-period.yaml");
    let refused = kubectl(&["apply", "-n", NS, "-f", invalid.to_str().unwrap()], None);
    assert!(
        !refused.status.success(),
        "the invalid manifest was accepted"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("a concurrency limit must not have a period"),
        "{stderr}"
    );
    // The weighted-tier and flap-damping rules (issue 18): only each file's RoutingPolicy is applied (by
    // stdin), so the files' LLMProviders are not created in the namespace.
    for (file, message) in [
        (
            "policy-priority-partial.yaml",
            "priority must be set on every provider of the policy or on none",
        ),
        (
            "policy-weights-all-zero.yaml",
            "at least one provider must have a weight above 0",
        ),
        (
            "policy-weight-on-p2c.yaml",
            "priority and weight apply only to the stickyChain strategy",
        ),
        (
            "policy-flap-reuse-above-suppress.yaml",
            "flapReuse must be below flapSuppress",
        ),
    ] {
        let text = std::fs::read_to_string(repo.join("config/examples/invalid").join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let policy = text
            .split("\n---\n")
            .find(|doc| doc.contains("kind: RoutingPolicy"))
            .unwrap_or_else(|| panic!("{file} has no RoutingPolicy"));
        let refused = kubectl(&["apply", "-n", NS, "-f", "-"], Some(policy));
        assert!(!refused.status.success(), "{file} was accepted");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(message), "{file}: {stderr}");
    }

    drop(router);
    drop(operator);
    mock.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Scenario tests (issue 15): each in its own namespace, cleaned up by a drop guard also when it
// fails, run one at a time (one of them stops the API server).

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs cluster scenarios one at a time (an async lock: it does not poison, so a failed one
/// does not block the others).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// The kubeconfig when the cluster tests run; `None` (with a note) when they are skipped;
/// panics when `SWITCHYARD_REQUIRE_CLUSTER=1` and no cluster answers.
fn cluster(test: &str) -> Option<String> {
    let kubeconfig = std::env::var("KUBECONFIG").ok();
    let require = std::env::var("SWITCHYARD_REQUIRE_CLUSTER").ok();
    match gate(kubeconfig.as_deref(), require.as_deref(), probe_cluster) {
        Gate::Run => kubeconfig,
        Gate::Skip(why) => {
            eprintln!("skipping {test}: {why}");
            None
        }
        Gate::Fail(why) => panic!("{why}"),
    }
}

/// `../shared/kapi` beside the repository, or `SWITCHYARD_KAPI_DIR`.
fn kapi_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_KAPI_DIR")
        .map_or_else(|| repo().join("../shared/kapi"), PathBuf::from)
}

fn apply_crds() {
    kubectl_ok(
        &["apply", "-f", repo().join("crds").to_str().unwrap()],
        None,
    );
    for crd in ["llmproviders", "routingpolicies", "tenantquotas"] {
        kubectl_ok(
            &[
                "wait",
                "--for=condition=established",
                "--timeout=60s",
                &format!("crd/{crd}.switchyard.dev"),
            ],
            None,
        );
    }
}

const SCENARIO_KEY: &str = "sk-scenario-1";

/// One namespace with a mock-backed provider `e2e-mock`, policy `e2e-chat` (interval 3 s) and a
/// tenant whose key is in Secret `e2e-keys`; everything in it is deleted on drop.
struct Scenario {
    ns: String,
    dir: tempfile::TempDir,
    kubeconfig: String,
    _mock: MockHandle,
}

impl Scenario {
    async fn new(tag: &str, kubeconfig: &str) -> Scenario {
        apply_crds();
        let ns = format!("sy-{tag}-{}", std::process::id());
        let scenario_ns = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n");
        kubectl_ok(&["apply", "-f", "-"], Some(&scenario_ns));
        let mock = MockProvider::start(MockConfig {
            name: "e2e-mock".to_owned(),
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let s = Scenario {
            ns,
            dir: tempfile::tempdir().unwrap(),
            kubeconfig: kubeconfig.to_owned(),
            _mock: mock,
        };
        let ns = &s.ns;
        let objects = format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: e2e-mock-creds, namespace: {ns}}}\nstringData: {{api-key: placeholder}}\n\
             ---\napiVersion: v1\nkind: Secret\nmetadata: {{name: e2e-keys, namespace: {ns}}}\nstringData: {{default: {SCENARIO_KEY}}}\n\
             ---\napiVersion: switchyard.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: e2e-mock, namespace: {ns}}}\nspec:\n  api: openai\n  endpoint: {}\n  region: us-east-1\n  credentials: {{secretRef: {{name: e2e-mock-creds, key: api-key}}}}\n  models:\n    - {{name: e2e-chat}}\n\
             ---\napiVersion: switchyard.dev/v1alpha1\nkind: RoutingPolicy\nmetadata: {{name: e2e-chat, namespace: {ns}}}\nspec:\n  model: e2e-chat\n  serviceType: chat\n  providers: [{{name: e2e-mock}}]\n  availability: {{interval: {INTERVAL_SECS}s}}\n\
             ---\napiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: e2e-tenant, namespace: {ns}}}\nspec:\n  apiKeys: [{{name: default, secretRef: {{name: e2e-keys, key: default}}}}]\n",
            s._mock.base_url()
        );
        kubectl_ok(&["apply", "-f", "-"], Some(&objects));
        s
    }

    fn get(&self, kind: &str, name: &str) -> Value {
        let out = kubectl_ok(&["get", kind, name, "-n", &self.ns, "-o", "json"], None);
        serde_json::from_str(&out).unwrap()
    }

    fn router(&self, port: u16, kubeconfig: &str) -> Proc {
        self.router_named("router", port, kubeconfig)
    }

    /// A router whose log and replica identity are `name`.
    fn router_named(&self, name: &'static str, port: u16, kubeconfig: &str) -> Proc {
        Proc::spawn(
            name,
            &[
                "router".into(),
                format!("--namespace={}", self.ns),
                format!("--kubeconfig={kubeconfig}"),
                format!("--listen=127.0.0.1:{port}"),
            ],
            self.dir.path(),
        )
    }

    /// An operator scraping `router_url`; with `elect`, it takes part in the election on the
    /// Lease `switchyard-operator` of the scenario's namespace.
    fn operator(&self, name: &'static str, router_url: &str, elect: bool, metrics: u16) -> Proc {
        self.operator_for(name, &[router_url], elect, metrics)
    }

    /// An operator scraping every router of `router_urls` (see [`Scenario::operator`]).
    fn operator_for(
        &self,
        name: &'static str,
        router_urls: &[&str],
        elect: bool,
        metrics: u16,
    ) -> Proc {
        let mut args = vec![
            "operator".into(),
            format!("--namespace={}", self.ns),
            format!("--kubeconfig={}", self.kubeconfig),
        ];
        args.extend(router_urls.iter().map(|u| format!("--router-address={u}")));
        args.extend([
            format!("--interval={INTERVAL_SECS}s"),
            format!("--metrics-listen=127.0.0.1:{metrics}"),
            format!("--identity={name}"),
            "--no-probes".into(),
        ]);
        if elect {
            args.push(format!("--lease-namespace={}", self.ns));
        } else {
            args.push("--no-leader-election".into());
        }
        Proc::spawn(name, &args, self.dir.path())
    }

    fn provider_status(&self) -> Value {
        self.get("llmprovider", "e2e-mock")["status"].clone()
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        // The API server has no garbage collector: delete what is in the namespace, then it.
        let _ = kubectl(
            &[
                "delete",
                "llmproviders,routingpolicies,tenantquotas,secrets,leases,events",
                "--all",
                "-n",
                &self.ns,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
        let _ = kubectl(
            &[
                "delete",
                "namespace",
                &self.ns,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// Sum of `status.counted[].successes`: how far the leader has counted every replica.
fn counted_successes(status: &Value) -> u64 {
    status["counted"].as_array().map_or(0, |a| {
        a.iter().filter_map(|c| c["successes"].as_u64()).sum()
    })
}

fn window_successes(status: &Value) -> u64 {
    status["lastWindow"]["successes"].as_u64().unwrap_or(0)
}

async fn chat(http: &reqwest::Client, url: &str, key: &str) -> Result<u16, String> {
    http.post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .timeout(Duration::from_secs(10))
        .json(&json!({"model": "e2e-chat", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// Waits until the router serves `key` (that first success counts: it is returned as 1).
async fn until_served(url: &str, key: &str) -> u64 {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if chat(&http, url, key).await == Ok(200) {
            return 1;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the router at {url} never served {key}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `n` requests, each of which must succeed.
async fn send(url: &str, n: u64) {
    let http = reqwest::Client::new();
    for i in 0..n {
        let got = chat(&http, url, SCENARIO_KEY).await;
        assert_eq!(got, Ok(200), "request {i} of {n}");
    }
}

/// Requests in the background until stopped: successes and failures at the client.
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ok: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(url: &str, every: Duration) -> Load {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ok = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, o, f, url) = (stop.clone(), ok.clone(), failed.clone(), url.to_owned());
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !s.load(Ordering::Relaxed) {
                match chat(&http, &url, SCENARIO_KEY).await {
                    Ok(200) => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    other => f.lock().unwrap().push(format!("{other:?}")),
                }
                tokio::time::sleep(every).await;
            }
        });
        Load {
            stop,
            ok,
            failed,
            task,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops and returns (successes, failures).
    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap();
        let failed = self.failed.lock().unwrap().clone();
        (self.ok.load(std::sync::atomic::Ordering::Relaxed), failed)
    }
}

/// The router's own cumulative successes for the scenario's provider (`GET /outcomes`).
async fn router_successes(url: &str, ns: &str) -> u64 {
    let report: Value = reqwest::get(format!("{url}/outcomes"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    report["providers"][format!("{ns}/e2e-mock")]["successes"]
        .as_u64()
        .unwrap_or(0)
}

async fn metric(url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls the provider's status every 100 ms until `done` accepts it; returns it.
async fn status_until(
    s: &Scenario,
    limit: Duration,
    what: &str,
    done: impl FnMut(&Value) -> bool,
) -> Value {
    object_status_until(s, "llmprovider", "e2e-mock", limit, what, done).await
}

/// Waits until the status of `kind/name` in the scenario's namespace satisfies `done`.
async fn object_status_until(
    s: &Scenario,
    kind: &str,
    name: &str,
    limit: Duration,
    what: &str,
    mut done: impl FnMut(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let status = s.get(kind, name)["status"].clone();
        if done(&status) {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}; last status: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_traffic_before_the_operator_starts_is_counted_in_its_first_window() {
    let _serial = serial().await;
    let Some(kubeconfig) = cluster("the start scenario") else {
        return;
    };
    let s = Scenario::new("start", &kubeconfig).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _router = s.router(port, &kubeconfig);
    let served = until_served(&url, SCENARIO_KEY).await;
    send(&url, 11).await;
    let total = served + 11;
    assert_eq!(router_successes(&url, &s.ns).await, total);

    let started = tokio::time::Instant::now();
    let _operator = s.operator("op-start", &url, false, free_port());
    let status = status_until(
        &s,
        Duration::from_secs(INTERVAL_SECS + 15),
        "the first window",
        |st| counted_successes(st) > 0,
    )
    .await;
    eprintln!(
        "first window written {:?} after the operator started",
        started.elapsed()
    );
    assert_eq!(counted_successes(&status), total, "{status}");
    assert_eq!(
        window_successes(&status),
        total,
        "the first window holds what the router served before the first scrape: {status}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(INTERVAL_SECS),
        "the first tick runs at start, not one interval later ({:?})",
        started.elapsed()
    );
}

/// Sends `n` requests with the scenario's key; returns (served, refused with 429).
async fn send_counting(url: &str, n: u64) -> (u64, u64) {
    let http = reqwest::Client::new();
    let (mut ok, mut limited) = (0, 0);
    for i in 0..n {
        match chat(&http, url, SCENARIO_KEY).await {
            Ok(200) => ok += 1,
            Ok(429) => limited += 1,
            other => panic!("request {i} of {n}: {other:?}"),
        }
    }
    (ok, limited)
}

/// Waits up to 20 s until the TenantQuota's status satisfies `done`.
async fn tenant_status_until(s: &Scenario, what: &str, done: impl FnMut(&Value) -> bool) -> Value {
    object_status_until(
        s,
        "tenantquota",
        "e2e-tenant",
        Duration::from_secs(20),
        what,
        done,
    )
    .await
}

/// Issue 17 item 5 in a cluster: two router replicas (in-process quota stores, so each holds
/// its own bucket) refuse what their tenant's RPM limit does not allow; the operator writes the
/// fleet's usage and rejected count into TenantQuota status, and a restarted operator counts
/// on from the stored checkpoints without counting anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tenant_usage_and_rejections_reach_tenantquota_status_exactly_once() {
    let _serial = serial().await;
    let Some(kubeconfig) = cluster("the tenant usage scenario") else {
        return;
    };
    let s = Scenario::new("tenant", &kubeconfig).await;
    let ns = &s.ns;
    let limited = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: e2e-tenant, namespace: {ns}}}\nspec:\n  apiKeys: [{{name: default, secretRef: {{name: e2e-keys, key: default}}}}]\n  limits:\n    - {{name: rpm, dimension: requests, amount: 3, period: 600s}}\n"
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&limited));
    let (pa, pb) = (free_port(), free_port());
    let (ua, ub) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    let _ra = s.router_named("router-a", pa, &kubeconfig);
    let _rb = s.router_named("router-b", pb, &kubeconfig);
    // Each replica: its first success proves it has the tenant, then 2 more fit its bucket
    // of 3 and 2 are refused.
    for url in [&ua, &ub] {
        until_served(url, SCENARIO_KEY).await;
        let (ok, refused) = send_counting(url, 4).await;
        assert_eq!((ok, refused), (2, 2), "replica {url}");
    }
    let operator = s.operator_for("op-tenant-1", &[&ua, &ub], false, free_port());
    let status = tenant_status_until(&s, "rejected = 4", |st| st["rejected"] == 4).await;
    let usage = status["usage"].as_array().expect("usage in status");
    let rpm = usage
        .iter()
        .find(|u| u["limit"] == "rpm")
        .unwrap_or_else(|| panic!("no rpm usage: {status}"));
    assert_eq!(rpm["dimension"], "requests", "{status}");
    assert_eq!(
        rpm["used"], 6,
        "both replicas' buckets are drained: {status}"
    );
    assert_eq!(rpm["amount"], 6, "two in-process buckets of 3: {status}");
    assert_eq!(rpm["remaining"], 0, "{status}");
    assert_eq!(rpm["window"], "600s", "{status}");
    assert_eq!(status["throttled"], 0, "{status}");
    assert_eq!(
        status["counted"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    // Ticks with nothing new change nothing.
    tokio::time::sleep(Duration::from_secs(INTERVAL_SECS + 1)).await;
    let again = s.get("tenantquota", "e2e-tenant")["status"].clone();
    assert_eq!(again["rejected"], 4, "{again}");

    // A new operator process resumes from status.counted: 3 more refusals make 7, not 11.
    drop(operator);
    let (ok, refused) = send_counting(&ua, 3).await;
    assert_eq!((ok, refused), (0, 3));
    let _operator = s.operator_for("op-tenant-2", &[&ua, &ub], false, free_port());
    tokio::time::sleep(Duration::from_secs(INTERVAL_SECS + 1)).await;
    let status = tenant_status_until(&s, "rejected = 7", |st| st["rejected"] == 7).await;
    tokio::time::sleep(Duration::from_secs(INTERVAL_SECS)).await;
    let settled = s.get("tenantquota", "e2e-tenant")["status"].clone();
    assert_eq!(settled["rejected"], 7, "counted once: {settled}");
    assert_eq!(status["conditions"][0]["type"], "Ready", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_operator_killed_and_restarted_mid_traffic_loses_no_outcome() {
    let _serial = serial().await;
    let Some(kubeconfig) = cluster("the restart scenario") else {
        return;
    };
    let s = Scenario::new("restart", &kubeconfig).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _router = s.router(port, &kubeconfig);
    until_served(&url, SCENARIO_KEY).await;
    let load = Load::start(&url, Duration::from_millis(50));
    let first = s.operator("op-restart", &url, false, free_port());
    status_until(&s, Duration::from_secs(15), "a first count", |st| {
        counted_successes(st) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(INTERVAL_SECS + 1)).await;
    // SIGKILL mid-traffic: no chance to write anything more.
    drop(first);
    let at_kill = s.provider_status();
    let counted_at_kill = counted_successes(&at_kill);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sent_while_down = load.ok();
    let _second = s.operator("op-restart", &url, false, free_port());
    let resumed = status_until(
        &s,
        Duration::from_secs(15),
        "the restarted operator's window",
        |st| counted_successes(st) != counted_at_kill,
    )
    .await;
    let first_window = window_successes(&resumed);
    assert_eq!(
        first_window,
        counted_successes(&resumed) - counted_at_kill,
        "the restarted operator's first window starts where the killed one stopped: {resumed}"
    );
    assert!(
        counted_successes(&resumed) >= sent_while_down.saturating_sub(1),
        "everything sent while the operator was down is in its first window: {resumed}, sent {sent_while_down}"
    );
    let (ok, failed) = load.finish().await;
    assert!(failed.is_empty(), "client errors: {failed:?}");
    let total = router_successes(&url, &s.ns).await;
    // The router's cumulative count includes the readiness request.
    assert_eq!(total, ok + 1);
    status_until(
        &s,
        Duration::from_secs(2 * INTERVAL_SECS + 5),
        "every outcome counted",
        |st| counted_successes(st) == total,
    )
    .await;
    eprintln!(
        "restart: {ok} requests, {counted_at_kill} counted at the kill, first window after restart {first_window}, all {total} counted"
    );
}

fn lease_holder(s: &Scenario) -> Option<String> {
    let out = kubectl(
        &[
            "get",
            "lease",
            "switchyard-operator",
            "-n",
            &s.ns,
            "-o",
            "json",
        ],
        None,
    );
    out.status.success().then(|| {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leadership_moves_on_a_real_lease_without_losing_outcomes() {
    let _serial = serial().await;
    let Some(kubeconfig) = cluster("the leader-election scenario") else {
        return;
    };
    let s = Scenario::new("lease", &kubeconfig).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _router = s.router(port, &kubeconfig);
    until_served(&url, SCENARIO_KEY).await;
    let load = Load::start(&url, Duration::from_millis(50));
    let (ma, mb) = (free_port(), free_port());
    let mut a = Some(s.operator("op-a", &url, true, ma));
    let mut b = Some(s.operator("op-b", &url, true, mb));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let leader = loop {
        match lease_holder(&s).as_deref() {
            Some("op-a") => break "op-a",
            Some("op-b") => break "op-b",
            _ => {}
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    status_until(
        &s,
        Duration::from_secs(15),
        "the leader's first count",
        |st| counted_successes(st) > 0,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(INTERVAL_SECS + 1)).await;
    let (leader_metrics, follower_metrics, follower) = if leader == "op-a" {
        (ma, mb, "op-b")
    } else {
        (mb, ma, "op-a")
    };
    let written = "switchyard_operator_status_syncs_total{kind=\"LLMProvider\",result=\"written\"}";
    let leader_url = format!("http://127.0.0.1:{leader_metrics}");
    let follower_url = format!("http://127.0.0.1:{follower_metrics}");
    assert!(metric(&leader_url, written).await > 0.0);
    assert_eq!(
        metric(&follower_url, written).await,
        0.0,
        "the follower writes nothing"
    );
    assert_eq!(
        metric(&follower_url, "switchyard_operator_leader ").await,
        0.0
    );

    // SIGKILL the leader: its Lease is not released and must expire.
    let killed = tokio::time::Instant::now();
    if leader == "op-a" {
        drop(a.take());
    } else {
        drop(b.take());
    }
    let at_kill = counted_successes(&s.provider_status());
    let deadline = killed + Duration::from_secs(30);
    while lease_holder(&s).as_deref() != Some(follower) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{follower} never took the Lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let takeover = killed.elapsed();
    let after = status_until(
        &s,
        Duration::from_secs(15),
        "the new leader's window",
        |st| counted_successes(st) != at_kill,
    )
    .await;
    assert_eq!(
        window_successes(&after),
        counted_successes(&after) - at_kill,
        "the new leader's first window starts where the old one stopped: {after}"
    );
    assert!(
        window_successes(&after) > 0,
        "traffic sent during the takeover is counted: {after}"
    );
    assert!(
        takeover <= Duration::from_secs(15 + 2),
        "takeover took {takeover:?}, more than the 15 s lease duration"
    );
    assert!(metric(&follower_url, written).await > 0.0);
    assert_eq!(
        metric(&follower_url, "switchyard_operator_leader ").await,
        1.0
    );

    // The status has one field manager, the operator's, through the status subresource.
    let obj: Value = serde_json::from_str(&kubectl_ok(
        &[
            "get",
            "llmprovider",
            "e2e-mock",
            "-n",
            &s.ns,
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    ))
    .unwrap();
    let managers: Vec<(String, String)> = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["subresource"] == "status")
        .map(|m| {
            (
                m["manager"].as_str().unwrap_or("").to_owned(),
                m["operation"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        managers,
        [("switchyard-operator".to_owned(), "Apply".to_owned())],
        "{}",
        obj["metadata"]["managedFields"]
    );

    let (ok, failed) = load.finish().await;
    assert!(failed.is_empty(), "client errors: {failed:?}");
    let total = router_successes(&url, &s.ns).await;
    assert_eq!(total, ok + 1);
    status_until(
        &s,
        Duration::from_secs(2 * INTERVAL_SECS + 5),
        "every outcome counted",
        |st| counted_successes(st) == total,
    )
    .await;
    eprintln!(
        "leader change: {leader} killed, {follower} held the Lease after {takeover:?}; first window {} ; all {total} counted",
        window_successes(&after)
    );
}

/// A TCP forwarder to the API server that can be cut (every connection closed, nothing
/// accepted) and restored on the same port: a router cut off from a server that stays up.
struct Cut {
    port: u16,
    upstream: std::net::SocketAddr,
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Cut {
    async fn open(upstream: std::net::SocketAddr, port: u16) -> Cut {
        let cut = Cut {
            port,
            upstream,
            tasks: std::sync::Arc::default(),
        };
        cut.restore().await;
        cut
    }

    async fn restore(&self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .unwrap();
        let (upstream, tasks) = (self.upstream, self.tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tasks.lock().unwrap().push(conn);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }

    fn cut(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.cut();
    }
}

fn api_server_addr(kubeconfig: &str) -> std::net::SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("a server: https://HOST:PORT line in the kubeconfig");
    server
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("{server}: {e} (an IP:port server is needed for the cut)"))
}

fn set_tenant_key(s: &Scenario, key: &str) {
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: e2e-keys, namespace: {}}}\nstringData: {{default: {key}}}\n",
        s.ns
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&secret));
}

/// Waits until `key` is served and `old` refused with 401.
async fn until_rotated(url: &str, key: &str, old: &str, limit: Duration) -> Duration {
    let http = reqwest::Client::new();
    let start = tokio::time::Instant::now();
    loop {
        let new_ok = chat(&http, url, key).await == Ok(200);
        let old_refused = chat(&http, url, old).await == Ok(401);
        if new_ok && old_refused {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "the rotated key did not reach the router within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn router_messages(url: &str) -> String {
    let status: Value = reqwest::get(format!("{url}/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    status["messages"].to_string()
}

/// Runs `../shared/kapi/<script>` and fails the test when it fails.
fn kapi(script: &str) {
    let path = kapi_dir().join(script);
    let out = Command::new(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the API server again if a failed test left it stopped.
struct Restart;

impl Drop for Restart {
    fn drop(&mut self) {
        if probe_cluster().is_err() {
            let _ = Command::new(kapi_dir().join("up.sh"))
                .stdin(Stdio::null())
                .output();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_routers_fail_static_through_an_outage_and_catch_up_after_it() {
    let _serial = serial().await;
    let Some(kubeconfig) = cluster("the outage scenario") else {
        return;
    };
    let s = Scenario::new("outage", &kubeconfig).await;
    // The router reaches the API server through a forwarder the test can cut.
    let cut = Cut::open(api_server_addr(&kubeconfig), free_port()).await;
    let routed = s.dir.path().join("kubeconfig-cut");
    let text = std::fs::read_to_string(&kubeconfig).unwrap().replace(
        &format!("server: https://{}", cut.upstream),
        &format!("server: https://127.0.0.1:{}", cut.port),
    );
    std::fs::write(&routed, text).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let router = s.router(port, routed.to_str().unwrap());
    let router_pid = router.child.id();
    let operator_metrics = free_port();
    let _operator = s.operator("op-outage", &url, false, operator_metrics);
    until_served(&url, SCENARIO_KEY).await;

    // 1. Secret rotation reaches the running router.
    let rotated = "sk-scenario-2";
    set_tenant_key(&s, rotated);
    let took = until_rotated(&url, rotated, SCENARIO_KEY, Duration::from_secs(15)).await;
    eprintln!("secret rotation reached the router in {took:?}");

    // 2. A real outage under load: the API server and etcd stop.
    let _restart = Restart;
    let load = LoadWith::start(&url, rotated);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = tokio::time::Instant::now();
    kapi("down.sh");
    eprintln!(
        "down.sh stopped the API server and etcd in {:?}",
        stopped.elapsed()
    );
    assert!(probe_cluster().is_err(), "the API server still answers");
    let deadline = stopped + Duration::from_secs(20);
    loop {
        let stale = metric(&url, "switchyard_config_stale_seconds").await;
        let messages = router_messages(&url).await;
        if stale > 0.0 && messages.contains("serving the last configuration") {
            eprintln!(
                "router reports staleness {:?} into the outage: {messages}",
                stopped.elapsed()
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the router never reported the outage: stale {stale}, messages {messages}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = load.ok();
    kapi("up.sh");
    let outage = stopped.elapsed();
    let (ok, failed) = load.finish().await;
    assert!(
        failed.is_empty(),
        "client errors during the outage: {failed:?}"
    );
    assert!(during > 10, "the load ran during the outage ({during})");
    let op_url = format!("http://127.0.0.1:{operator_metrics}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric(&url, "switchyard_config_stale_seconds").await > 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the router's watches never recovered: {}",
            router_messages(&url).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let watch_errors = metric(&op_url, "switchyard_operator_watch_errors_total").await;
    assert!(
        watch_errors > 0.0,
        "the operator counted no watch failure during the outage"
    );
    eprintln!(
        "outage of {outage:?}: {ok} requests served, none failed; operator watch errors {watch_errors}"
    );

    // 3. Cut off from a server that stays up: a change made meanwhile reaches the router once
    //    it is reconnected, and until then the last configuration keeps serving.
    cut.cut();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_cut = "sk-scenario-3";
    set_tenant_key(&s, after_cut);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let http = reqwest::Client::new();
    assert_eq!(
        chat(&http, &url, rotated).await,
        Ok(200),
        "cut off, the router keeps its last configuration"
    );
    cut.restore().await;
    let took = until_rotated(&url, after_cut, rotated, Duration::from_secs(30)).await;
    eprintln!("the change made while cut off reached the router {took:?} after reconnection");
    assert_eq!(
        router.child.id(),
        router_pid,
        "the same router process throughout"
    );
}

/// [`Load`] with another key.
struct LoadWith;

impl LoadWith {
    fn start(url: &str, key: &str) -> Load {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ok = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, o, f) = (stop.clone(), ok.clone(), failed.clone());
        let (url, key) = (url.to_owned(), key.to_owned());
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !s.load(Ordering::Relaxed) {
                match chat(&http, &url, &key).await {
                    Ok(200) => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    other => f.lock().unwrap().push(format!("{other:?}")),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Load {
            stop,
            ok,
            failed,
            task,
        }
    }
}

/// Kinds the API server serves, as (apiVersion, kind), from `kubectl api-resources`.
fn served_kinds() -> std::collections::BTreeSet<(String, String)> {
    let out = kubectl_ok(&["api-resources", "--no-headers"], None);
    out.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let kind = cols.last()?;
            let version = cols.iter().rev().nth(2)?;
            Some(((*version).to_owned(), (*kind).to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_accepts_the_charts_objects_by_server_side_dry_run() {
    let _serial = serial().await;
    let Some(_kubeconfig) = cluster("the chart dry-run") else {
        return;
    };
    let python = std::env::var_os("SWITCHYARD_PYTHON")
        .map_or_else(|| repo().join(".venv/bin/python"), PathBuf::from);
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup-venv.sh (the chart is rendered with helm-python-sdk)",
        python.display()
    );
    let served = served_kinds();
    for want in [
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("v1", "ServiceAccount"),
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
    ] {
        assert!(
            served.contains(&(want.0.to_owned(), want.1.to_owned())),
            "the server does not serve {want:?}: {served:?}"
        );
    }
    let ns = format!("sy-chart-{}", std::process::id());
    let guard = NamespaceGuard(ns.clone());
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
        )),
    );
    for values in ["default", "ha"] {
        let out = Command::new(&python)
            .arg(repo().join("tests/helm/render_chart.py"))
            .args([values, &ns])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "render_chart.py {values}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let mut applied = std::collections::BTreeMap::<String, usize>::new();
        let mut skipped = std::collections::BTreeSet::new();
        for doc in &docs {
            let key = (
                doc["apiVersion"].as_str().unwrap().to_owned(),
                doc["kind"].as_str().unwrap().to_owned(),
            );
            if !served.contains(&key) {
                skipped.insert(format!("{}/{}", key.0, key.1));
                continue;
            }
            let text = serde_json::to_string(doc).unwrap();
            let got = kubectl(
                &[
                    "apply",
                    "--server-side",
                    "--dry-run=server",
                    "--field-manager=chart-dry-run",
                    "-n",
                    &ns,
                    "-f",
                    "-",
                ],
                Some(&text),
            );
            assert!(
                got.status.success(),
                "{values}: the server refused {} {}: {}",
                key.1,
                doc["metadata"]["name"],
                String::from_utf8_lossy(&got.stderr)
            );
            *applied.entry(key.1).or_default() += 1;
        }
        for kind in [
            "CustomResourceDefinition",
            "Deployment",
            "Service",
            "ServiceAccount",
        ] {
            assert!(
                applied.get(kind).copied().unwrap_or(0) > 0,
                "{values}: no {kind} in {applied:?}"
            );
        }
        eprintln!("chart {values}: dry-run accepted {applied:?}; not served here: {skipped:?}");
    }
    drop(guard);
}

/// Deletes a namespace on drop.
struct NamespaceGuard(String);

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        let _ = kubectl(
            &[
                "delete",
                "namespace",
                &self.0,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}
