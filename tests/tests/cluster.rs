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
//! 5. applies an invalid manifest from `config/examples/invalid/` and expects the API server
//!    to refuse it with the CEL rule's message.
//!
//! Everything it created in `ai-platform` is deleted at the end; the CRDs stay.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_mock::{MockConfig, MockProvider};

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

    drop(router);
    drop(operator);
    let _ = kubectl(
        &[
            "delete",
            "-f",
            repo.join("config/examples").to_str().unwrap(),
            "--ignore-not-found",
            "--wait=false",
        ],
        None,
    );
    let _ = kubectl(
        &["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
        Some(&objects),
    );
    mock.shutdown().await;
}
