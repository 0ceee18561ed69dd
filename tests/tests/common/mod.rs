//! Shared end-to-end harness: in-process mock providers, a manifest folder wiring them, and a
//! real `switchyard standalone` process on loopback.
//!
//! Shape of one test:
//! ```text
//! let stack = Stack::start(Setup::new()
//!     .provider(Provider::openai("p-a"))
//!     .provider(Provider::openai("p-b"))
//!     .policy(Policy::chat("e2e-chat", &["p-a", "p-b"]))).await;
//! let reply = stack.chat("e2e-chat", Some("proj-1")).await;
//! assert_eq!(reply.provider().as_deref(), Some("p-a"));
//! assert_eq!(stack.mock("p-b").call_count(), 0);
//! ```
//!
//! The router is a child process (`switchyard standalone --listen 127.0.0.1:0`), found through
//! `SWITCHYARD_BIN` or next to the test binary in the target dir; its address is read from the
//! `switchyard listening on http://ADDR` line it prints to stderr. The child is killed when the
//! [`Router`] is dropped (also on panic), and its captured output is printed when a test fails.
//!
//! Mock providers run on the test's own tokio runtime, so every test uses the multi-thread
//! flavour and never blocks a worker (subprocesses go through `tokio::process`).
//!
//! Timing: every test of a binary takes [`serial`] first. The machine has 2 cores shared with
//! other builds; running one router at a time keeps the sub-second assertions (failover at the
//! first-token timeout, cancellation within 1 s) about the router and not about CPU contention.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use switchyard_mock::{MockConfig, MockHandle, MockProvider};
use tokio::time::Instant;

/// API key of the test tenant, stored as a secret file.
pub(crate) const KEY: &str = "sk-test";
/// Header carrying the project key (policy `spec.affinity.header`).
pub(crate) const PROJECT_HEADER: &str = "x-project-id";
/// Namespace written into every manifest.
pub(crate) const NAMESPACE: &str = "e2e";
/// How long the router gets to print its address and answer `/readyz`.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Lines of router output kept for failure reports.
const LOG_LINES: usize = 400;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serialises the tests of one test binary (see the module docs).
pub(crate) async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

// ---------------------------------------------------------------------------------------------
// Setup description
// ---------------------------------------------------------------------------------------------

/// Wire protocol of a mock-backed LLMProvider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `api: openai`.
    Openai,
    /// `api: anthropic`.
    Anthropic,
    /// `api: vertex` against the mock's Vertex paths, with the test service-account key and
    /// the mock's OAuth token endpoint.
    Vertex,
    /// `api: bedrock` against the mock's Bedrock paths, SigV4-signed with the test keys.
    Bedrock,
}

impl Api {
    fn as_str(self) -> &'static str {
        match self {
            Api::Openai => "openai",
            Api::Anthropic => "anthropic",
            Api::Vertex => "vertex",
            Api::Bedrock => "bedrock",
        }
    }
}

/// One LLMProvider backed by one in-process mock.
#[derive(Debug, Clone)]
pub(crate) struct Provider {
    /// Resource name, also the mock's name.
    pub(crate) name: String,
    /// Wire protocol.
    pub(crate) api: Api,
    /// Mock configuration (faults, timing, output size).
    pub(crate) mock: MockConfig,
    /// `spec.region`.
    pub(crate) region: Option<String>,
    /// Models served: (public name, modality).
    pub(crate) models: Vec<(String, String)>,
    /// Extra YAML lines under `spec:` (two-space indentation is added), e.g.
    /// `circuitBreaker: {consecutiveFailures: 1000}`.
    pub(crate) extra: Vec<String>,
    /// List prices of every model, USD per million input and output tokens.
    pub(crate) pricing: Option<(String, String)>,
    /// `upstreamName` of every model (a Vertex or Bedrock model id), when set.
    pub(crate) upstream: Option<String>,
    /// For `vertex` and `bedrock`: the `credentials:` value written instead of the test
    /// credentials (`""` writes none, e.g. for IRSA or the metadata server).
    pub(crate) credentials: Option<String>,
    /// `contextWindow` of every model.
    pub(crate) context_window: Option<u32>,
}

impl Provider {
    /// An OpenAI-compatible provider serving `e2e-chat` (text).
    pub(crate) fn openai(name: &str) -> Self {
        Self::new(name, Api::Openai)
    }

    /// An Anthropic provider serving `e2e-chat` (text).
    pub(crate) fn anthropic(name: &str) -> Self {
        Self::new(name, Api::Anthropic)
    }

    /// A Vertex AI provider serving `e2e-chat` as `model` (a `claude-…` id is Claude on
    /// Vertex, anything else Gemini); the mock checks OAuth tokens of the test account.
    pub(crate) fn vertex(name: &str, model: &str) -> Self {
        let mut p = Self::new(name, Api::Vertex);
        p.mock.google_auth = Some(switchyard_mock::GoogleAuthConfig::default());
        p.upstream = Some(model.to_owned());
        p.region = Some("us-east5".to_owned());
        p
    }

    /// A Bedrock provider serving `e2e-chat` as `model` (an Anthropic id uses InvokeModel,
    /// anything else Converse); the mock checks SigV4 with the test keys.
    pub(crate) fn bedrock(name: &str, model: &str) -> Self {
        let mut p = Self::new(name, Api::Bedrock);
        p.mock.aws_auth = Some(switchyard_mock::AwsAuthConfig::default());
        p.upstream = Some(model.to_owned());
        p.region = Some("us-east-1".to_owned());
        p
    }

    fn new(name: &str, api: Api) -> Self {
        Self {
            name: name.to_owned(),
            api,
            mock: MockConfig {
                name: name.to_owned(),
                ..MockConfig::default()
            },
            region: None,
            models: vec![("e2e-chat".to_owned(), "text".to_owned())],
            extra: Vec::new(),
            pricing: None,
            upstream: None,
            credentials: None,
            context_window: None,
        }
    }

    /// Replaces the test credentials of a `vertex` or `bedrock` provider with `yaml` (the
    /// value of `credentials:`; empty for none).
    pub(crate) fn credentials(mut self, yaml: &str) -> Self {
        self.credentials = Some(yaml.to_owned());
        self
    }

    /// Sets every model's list prices (USD per million input / output tokens).
    pub(crate) fn pricing(mut self, input: &str, output: &str) -> Self {
        self.pricing = Some((input.to_owned(), output.to_owned()));
        self
    }

    /// Sets every model's `contextWindow` (tokens).
    pub(crate) fn context_window(mut self, tokens: u32) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Replaces the served models: `(public name, modality)`.
    pub(crate) fn models(mut self, models: &[(&str, &str)]) -> Self {
        self.models = models
            .iter()
            .map(|(m, k)| ((*m).to_owned(), (*k).to_owned()))
            .collect();
        self
    }

    /// Changes the mock's configuration.
    pub(crate) fn mock(mut self, f: impl FnOnce(&mut MockConfig)) -> Self {
        f(&mut self.mock);
        self
    }

    /// Sets `spec.region`.
    pub(crate) fn region(mut self, region: &str) -> Self {
        self.region = Some(region.to_owned());
        self
    }

    /// Adds a YAML line under `spec:`.
    pub(crate) fn with(mut self, line: &str) -> Self {
        self.extra.push(line.to_owned());
        self
    }
}

/// One RoutingPolicy.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Resource name.
    pub(crate) name: String,
    /// Public model name.
    pub(crate) model: String,
    /// `chat`, `embedding`, `rerank` or `transcription`.
    pub(crate) service_type: String,
    /// Provider names in priority order.
    pub(crate) providers: Vec<String>,
    /// Extra YAML lines under `spec:`.
    pub(crate) extra: Vec<String>,
}

impl Policy {
    /// A chat policy named like its model, affinity from `x-project-id`.
    pub(crate) fn chat(model: &str, providers: &[&str]) -> Self {
        Self::new(model, "chat", providers)
            .set("affinity", &format!("{{header: {PROJECT_HEADER}}}"))
    }

    /// An embedding policy (default strategy: power of two choices).
    pub(crate) fn embedding(model: &str, providers: &[&str]) -> Self {
        Self::new(model, "embedding", providers)
    }

    /// A rerank policy (default strategy: power of two choices).
    pub(crate) fn rerank(model: &str, providers: &[&str]) -> Self {
        Self::new(model, "rerank", providers)
    }

    /// A transcription policy (`/v1/audio/transcriptions`; default strategy: sticky chain,
    /// providers in priority order).
    pub(crate) fn transcription(model: &str, providers: &[&str]) -> Self {
        Self::new(model, "transcription", providers)
    }

    fn new(model: &str, service_type: &str, providers: &[&str]) -> Self {
        Self {
            name: model.to_owned(),
            model: model.to_owned(),
            service_type: service_type.to_owned(),
            providers: providers.iter().map(|p| (*p).to_owned()).collect(),
            extra: Vec::new(),
        }
    }

    /// Adds a YAML line under `spec:`.
    pub(crate) fn with(mut self, line: &str) -> Self {
        self.extra.push(line.to_owned());
        self
    }

    /// Sets `key: value` under `spec:`, replacing an earlier line for the same key.
    pub(crate) fn set(mut self, key: &str, value: &str) -> Self {
        let prefix = format!("{key}:");
        self.extra.retain(|l| !l.starts_with(&prefix));
        self.extra.push(format!("{key}: {value}"));
        self
    }
}

/// Everything one test runs against.
#[derive(Debug, Clone, Default)]
pub(crate) struct Setup {
    /// Providers, each with its own mock.
    pub(crate) providers: Vec<Provider>,
    /// Routing policies.
    pub(crate) policies: Vec<Policy>,
    /// Extra YAML lines under the TenantQuota's `spec:`.
    pub(crate) tenant_extra: Vec<String>,
    /// Extra environment for the router process.
    pub(crate) env: Vec<(String, String)>,
    /// Extra YAML documents appended to the manifests (e.g. more TenantQuotas).
    pub(crate) docs: Vec<String>,
    /// Extra `name → key` API keys written to the secrets folder (`e2e-keys/<name>`).
    pub(crate) keys: Vec<(String, String)>,
}

impl Setup {
    /// An empty setup.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds a provider.
    pub(crate) fn provider(mut self, p: Provider) -> Self {
        self.providers.push(p);
        self
    }

    /// Adds a policy.
    pub(crate) fn policy(mut self, p: Policy) -> Self {
        self.policies.push(p);
        self
    }

    /// Adds a YAML line under the tenant's `spec:`.
    pub(crate) fn tenant(mut self, line: &str) -> Self {
        self.tenant_extra.push(line.to_owned());
        self
    }

    /// Adds an environment variable for the router.
    pub(crate) fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Appends a YAML document to the manifests.
    pub(crate) fn doc(mut self, yaml: &str) -> Self {
        self.docs.push(yaml.to_owned());
        self
    }

    /// Adds an API key secret `e2e-keys/<name>` holding `key`.
    pub(crate) fn key(mut self, name: &str, key: &str) -> Self {
        self.keys.push((name.to_owned(), key.to_owned()));
        self
    }
}

/// The manifests of a setup, given the mocks' addresses (multi-document YAML).
pub(crate) fn manifests(setup: &Setup, addrs: &BTreeMap<String, SocketAddr>) -> String {
    let mut out = String::new();
    for p in &setup.providers {
        let addr = addrs[&p.name];
        let _ = writeln!(
            out,
            "---\napiVersion: switchyard.dev/v1alpha1\nkind: LLMProvider\nmetadata: {{name: {}, namespace: {NAMESPACE}}}\nspec:\n  api: {}\n  endpoint: http://{addr}",
            p.name,
            p.api.as_str()
        );
        if let Some(r) = &p.region {
            let _ = writeln!(out, "  region: {r}");
        }
        match p.api {
            Api::Vertex => {
                let _ = writeln!(
                    out,
                    "  vertex: {{projectId: switchyard-test, tokenUrl: \"http://{addr}/token\", metadataUrl: \"http://{addr}\"}}"
                );
                let creds = p
                    .credentials
                    .as_deref()
                    .unwrap_or("{secretRef: {name: vertex-sa, key: key.json}}");
                if !creds.is_empty() {
                    let _ = writeln!(out, "  credentials: {creds}");
                }
            }
            Api::Bedrock => {
                let creds = p.credentials.as_deref().unwrap_or(
                    "{secretRef: {name: aws-e2e, key: secret}, accessKeyIdRef: {name: aws-e2e, key: id}}",
                );
                if !creds.is_empty() {
                    let _ = writeln!(out, "  credentials: {creds}");
                }
            }
            Api::Openai | Api::Anthropic => {}
        }
        out.push_str("  models:\n");
        for (m, modality) in &p.models {
            let price = p.pricing.as_ref().map_or(String::new(), |(i, o)| {
                format!(", pricing: {{inputPerMillion: \"{i}\", outputPerMillion: \"{o}\"}}")
            });
            let upstream = p
                .upstream
                .as_ref()
                .map_or(String::new(), |u| format!(", upstreamName: \"{u}\""));
            let window = p
                .context_window
                .map_or(String::new(), |w| format!(", contextWindow: {w}"));
            let _ = writeln!(
                out,
                "    - {{name: {m}, modalities: [{modality}]{price}{upstream}{window}}}"
            );
        }
        for l in &p.extra {
            let _ = writeln!(out, "  {l}");
        }
    }
    for p in &setup.policies {
        let _ = writeln!(
            out,
            "---\napiVersion: switchyard.dev/v1alpha1\nkind: RoutingPolicy\nmetadata: {{name: {}, namespace: {NAMESPACE}}}\nspec:\n  model: {}\n  serviceType: {}\n  providers:",
            p.name, p.model, p.service_type
        );
        for name in &p.providers {
            let _ = writeln!(out, "    - {{name: {name}}}");
        }
        for l in &p.extra {
            let _ = writeln!(out, "  {l}");
        }
    }
    let _ = writeln!(
        out,
        "---\napiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: e2e-tenant, namespace: {NAMESPACE}}}\nspec:\n  apiKeys:\n    - name: default\n      secretRef: {{name: e2e-keys, key: default}}"
    );
    for l in &setup.tenant_extra {
        let _ = writeln!(out, "  {l}");
    }
    for d in &setup.docs {
        let _ = writeln!(out, "---\n{}", d.trim_end());
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Running stack
// ---------------------------------------------------------------------------------------------

/// Mocks + manifests + router, torn down on drop.
#[derive(Debug)]
pub(crate) struct Stack {
    /// The router process.
    pub(crate) router: Router,
    /// Mocks by provider name.
    pub(crate) mocks: BTreeMap<String, MockHandle>,
    /// The manifest folder (kept alive for the router's lifetime).
    pub(crate) dir: tempfile::TempDir,
    /// HTTP client (no proxy, no pooling surprises).
    pub(crate) http: reqwest::Client,
    /// When [`Stack::reset_mocks`] last ran (or the stack started): zero of the mocks' clocks.
    pub(crate) epoch: Instant,
    /// The router's extra environment (replicas get it too).
    pub(crate) env: Vec<(String, String)>,
}

impl Stack {
    /// Starts the mocks, writes the manifests and secrets, spawns the router and waits for
    /// `/readyz`.
    pub(crate) async fn start(setup: Setup) -> Stack {
        let mut mocks = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        for p in &setup.providers {
            let handle = MockProvider::start(p.mock.clone())
                .await
                .unwrap_or_else(|e| panic!("mock {} failed to start: {e}", p.name));
            addrs.insert(p.name.clone(), handle.addr());
            mocks.insert(p.name.clone(), handle);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest_dir = dir.path().join("manifests");
        let secrets_dir = dir.path().join("secrets");
        std::fs::create_dir_all(&manifest_dir).unwrap();
        std::fs::create_dir_all(secrets_dir.join("e2e-keys")).unwrap();
        std::fs::write(secrets_dir.join("e2e-keys/default"), KEY).unwrap();
        for (name, key) in &setup.keys {
            std::fs::write(secrets_dir.join("e2e-keys").join(name), key).unwrap();
        }
        // Vendor credentials: the mock's test service-account key and test AWS keys.
        std::fs::create_dir_all(secrets_dir.join("vertex-sa")).unwrap();
        std::fs::write(
            secrets_dir.join("vertex-sa/key.json"),
            switchyard_mock::TEST_SA_KEY_JSON,
        )
        .unwrap();
        std::fs::write(
            secrets_dir.join("vertex-sa/untrusted.json"),
            include_str!("../../../crates/mock/testdata/vertex-test-sa-untrusted.json"),
        )
        .unwrap();
        std::fs::write(secrets_dir.join("vertex-sa/garbage.json"), "{not a key").unwrap();
        std::fs::create_dir_all(secrets_dir.join("aws-e2e")).unwrap();
        std::fs::write(
            secrets_dir.join("aws-e2e/id"),
            switchyard_mock::TEST_AWS_ACCESS_KEY_ID,
        )
        .unwrap();
        std::fs::write(
            secrets_dir.join("aws-e2e/secret"),
            switchyard_mock::TEST_AWS_SECRET_ACCESS_KEY,
        )
        .unwrap();
        std::fs::write(manifest_dir.join("e2e.yaml"), manifests(&setup, &addrs)).unwrap();
        let router = Router::spawn(&manifest_dir, &secrets_dir, &setup.env).await;
        let mut stack = Stack {
            router,
            mocks,
            dir,
            http: client(),
            epoch: Instant::now(),
            env: setup.env.clone(),
        };
        stack.reset_mocks();
        stack
    }

    /// Clears every mock's call log and restarts the mocks' clocks together (and
    /// [`Stack::epoch`]), so `CallRecord::at` of different mocks compare to within microseconds and
    /// [`Stack::since_epoch`] reads the same clock. Configured faults are reinstalled and their
    /// time windows restart now.
    pub(crate) fn reset_mocks(&mut self) {
        self.epoch = Instant::now();
        for m in self.mocks.values() {
            m.reset();
        }
    }

    /// Starts another router process on the same manifests and secrets (a replica), with
    /// `env` on top of the setup's environment.
    pub(crate) async fn spawn_replica(&self, env: &[(String, String)]) -> Router {
        let manifests = self.dir.path().join("manifests");
        let secrets = self.dir.path().join("secrets");
        let mut all = self.env.clone();
        all.extend(env.iter().cloned());
        Router::spawn(&manifests, &secrets, &all).await
    }

    /// Time since [`Stack::epoch`] (the mocks' clock).
    pub(crate) fn since_epoch(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Rewrites the manifest folder from `setup` (same mocks, found by provider name), as an
    /// operator editing the files would; the router's watcher picks the change up.
    pub(crate) fn rewrite_manifests(&self, setup: &Setup) {
        let addrs: BTreeMap<String, SocketAddr> = self
            .mocks
            .iter()
            .map(|(name, m)| (name.clone(), m.addr()))
            .collect();
        self.write_manifest_text(&manifests(setup, &addrs));
    }

    /// Replaces the manifest file with `text` (which may be invalid, to test reload errors).
    pub(crate) fn write_manifest_text(&self, text: &str) {
        let path = self.dir.path().join("manifests/e2e.yaml");
        // Write then rename, so the watcher never reads a half-written file.
        let tmp = self.dir.path().join("e2e.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// The mock behind a provider.
    pub(crate) fn mock(&self, name: &str) -> &MockHandle {
        self.mocks
            .get(name)
            .unwrap_or_else(|| panic!("no mock named {name}"))
    }

    /// Calls received by a mock on one path.
    pub(crate) fn calls_on(&self, name: &str, path: &str) -> usize {
        self.mock(name)
            .calls()
            .iter()
            .filter(|c| c.path == path)
            .count()
    }

    /// `http://ADDR` + path.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.router.base_url)
    }

    /// A POST with the test key as a bearer token.
    pub(crate) fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(self.url(path)).bearer_auth(KEY)
    }

    /// A GET with the test key.
    pub(crate) fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(self.url(path)).bearer_auth(KEY)
    }

    /// Non-streaming OpenAI chat with one short user message.
    pub(crate) async fn chat(&self, model: &str, project: Option<&str>) -> Reply {
        self.chat_body(model, project, chat_body(model, "hello there", false))
            .await
    }

    /// OpenAI chat with a given body.
    pub(crate) async fn chat_body(
        &self,
        _model: &str,
        project: Option<&str>,
        body: Value,
    ) -> Reply {
        let mut req = self.post("/v1/chat/completions").json(&body);
        if let Some(p) = project {
            req = req.header(PROJECT_HEADER, p);
        }
        send(req).await
    }

    /// Streams a request to the end and returns its timed events.
    pub(crate) async fn stream(
        &self,
        path: &str,
        project: Option<&str>,
        body: Value,
    ) -> StreamReply {
        let mut req = self.post(path).json(&body);
        if let Some(p) = project {
            req = req.header(PROJECT_HEADER, p);
        }
        stream(req).await
    }

    /// `GET /status` as JSON.
    pub(crate) async fn status(&self) -> Value {
        let r = send(self.http.get(self.url("/status"))).await;
        assert_eq!(r.status, 200, "GET /status: {}", r.body);
        r.json()
    }

    /// `GET /metrics` as text.
    pub(crate) async fn metrics(&self) -> String {
        let r = send(self.http.get(self.url("/metrics"))).await;
        assert_eq!(r.status, 200, "GET /metrics: {}", r.body);
        r.body
    }
}

/// A plain reqwest client for loopback.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// An OpenAI chat body with one user message.
pub(crate) fn chat_body(model: &str, text: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    })
}

/// An Anthropic messages body with one user message.
pub(crate) fn messages_body(model: &str, text: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    })
}

// ---------------------------------------------------------------------------------------------
// Router process
// ---------------------------------------------------------------------------------------------

/// A running `switchyard standalone`; killed on drop.
#[derive(Debug)]
pub(crate) struct Router {
    child: Child,
    /// Bound address printed by the router.
    pub(crate) addr: SocketAddr,
    /// `http://ADDR`.
    pub(crate) base_url: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// Path of the `switchyard` binary: `SWITCHYARD_BIN`, else `<target>/<profile>/switchyard` next to
/// this test binary's `deps/` folder.
pub(crate) fn switchyard_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "SWITCHYARD_BIN={} does not name a file",
            p.display()
        );
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    // …/target/<profile>/deps/<test-binary> → …/target/<profile>/switchyard
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in <target>/<profile>/deps");
    let bin = profile_dir.join(format!("switchyard{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the switchyard binary was not found at {}: run `cargo build -p switchyard` first \
         (scripts/test.sh does), or set SWITCHYARD_BIN",
        bin.display()
    );
    warn_if_stale(&bin);
    bin
}

/// `cargo test` does not rebuild another package's binary: say so (in the captured output shown
/// on failure) when a source file of the crates behind it is newer than the binary.
fn warn_if_stale(bin: &Path) {
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return;
    };
    let crates = workspace_root().join("crates");
    let mut stack = vec![crates];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                if !path.ends_with("target")
                    && !path.ends_with("tests")
                    && !path.ends_with("benches")
                {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|x| x == "rs")
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t > built)
            {
                eprintln!(
                    "WARNING: {} is newer than {}; run `cargo build -p switchyard` to test the current code",
                    path.display(),
                    bin.display()
                );
                return;
            }
        }
    }
}

fn drain(
    reader: impl Read + Send + 'static,
    log: Arc<Mutex<Vec<String>>>,
    tx: Option<std::sync::mpsc::Sender<String>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if let Some(tx) = &tx {
                let _ = tx.send(line.clone());
            }
            let mut l = log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if l.len() >= LOG_LINES {
                l.remove(0);
            }
            l.push(line);
        }
    });
}

/// The address in a `switchyard listening on http://ADDR` line, if the line is one.
pub(crate) fn parse_listen_line(line: &str) -> Option<SocketAddr> {
    let marker = "switchyard listening on http://";
    let rest = &line[line.find(marker)? + marker.len()..];
    let token: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    token.trim_end_matches(['.', ':']).parse().ok()
}

impl Router {
    /// Spawns `switchyard standalone` on an ephemeral port and waits until `/readyz` is 200.
    pub(crate) async fn spawn(
        manifests: &Path,
        secrets: &Path,
        env: &[(String, String)],
    ) -> Router {
        let bin = switchyard_bin();
        let mut cmd = Command::new(&bin);
        cmd.arg("standalone")
            .arg("--manifests")
            .arg(manifests)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--secrets-dir")
            .arg(secrets)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Plain log lines in failure reports.
        cmd.env("NO_COLOR", "1");
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {}: {e}", bin.display()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(err) = child.stderr.take() {
            drain(err, log.clone(), Some(tx.clone()));
        }
        if let Some(out) = child.stdout.take() {
            drain(out, log.clone(), Some(tx));
        }
        // From here on the child is killed on every path (Drop), including a failed start.
        let mut router = Router {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            base_url: String::new(),
            log,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = tokio::task::spawn_blocking(move || {
            while let Ok(line) = rx.recv_timeout(START_TIMEOUT) {
                if let Some(a) = parse_listen_line(&line) {
                    return Some(a);
                }
            }
            None
        })
        .await
        .unwrap();
        let Some(addr) = addr else {
            let status = router.child.try_wait().ok().flatten();
            panic!(
                "router did not print `switchyard listening on http://ADDR` within {START_TIMEOUT:?} \
                 (exit status: {status:?}); output:\n{}",
                router.output()
            );
        };
        router.addr = addr;
        router.base_url = format!("http://{addr}");
        let http = client();
        loop {
            let ready = http
                .get(format!("{}/readyz", router.base_url))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .map(|r| r.status().as_u16());
            if let Ok(200) = ready {
                break;
            }
            if Instant::now() > deadline {
                panic!(
                    "router at {addr} not ready within {START_TIMEOUT:?} (last /readyz: {ready:?}); output:\n{}",
                    router.output()
                );
            }
            if let Ok(Some(status)) = router.child.try_wait() {
                panic!(
                    "router exited early ({status}); output:\n{}",
                    router.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        router
    }

    /// The router's captured output (last lines).
    pub(crate) fn output(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .join("\n")
    }

    /// Whether the process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- router output (last {LOG_LINES} lines) ----\n{}\n---- end ----",
                self.output()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------------

/// A fully read non-streaming reply.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// HTTP status.
    pub(crate) status: u16,
    /// Response headers.
    pub(crate) headers: HeaderMap,
    /// Body text.
    pub(crate) body: String,
    /// From send to the end of the body.
    pub(crate) elapsed: Duration,
}

impl Reply {
    /// The body as JSON (panics with the body when it is not).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// A header as text.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        header(&self.headers, name)
    }

    /// Name of the provider in `x-switchyard-provider` (without its `namespace/` prefix).
    pub(crate) fn provider(&self) -> Option<String> {
        self.header("x-switchyard-provider")
            .map(|v| provider_name(&v))
    }

    /// `x-switchyard-attempts`.
    pub(crate) fn attempts(&self) -> Option<u32> {
        self.header("x-switchyard-attempts")?.parse().ok()
    }

    /// OpenAI answer text (`choices[0].message.content`).
    pub(crate) fn text(&self) -> String {
        self.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// A provider name from `x-switchyard-provider`, which reads `namespace/name`.
pub(crate) fn provider_name(header: &str) -> String {
    header.rsplit('/').next().unwrap_or(header).to_owned()
}

/// A header as text.
pub(crate) fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)?.to_str().ok().map(str::to_owned)
}

/// Sends a request and reads the whole body.
pub(crate) async fn send(req: reqwest::RequestBuilder) -> Reply {
    let t0 = Instant::now();
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await.unwrap_or_default();
    Reply {
        status,
        headers,
        body,
        elapsed: t0.elapsed(),
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SseEvent {
    /// `event:` field, if any.
    pub(crate) event: Option<String>,
    /// `data:` lines joined with `\n`.
    pub(crate) data: String,
    /// When the event's terminating blank line arrived, from the request's send.
    pub(crate) at: Duration,
}

impl SseEvent {
    /// The data as JSON, if it is.
    pub(crate) fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data).ok()
    }
}

/// A streamed reply.
#[derive(Debug, Clone)]
pub(crate) struct StreamReply {
    /// HTTP status.
    pub(crate) status: u16,
    /// Response headers.
    pub(crate) headers: HeaderMap,
    /// Complete events, in order.
    pub(crate) events: Vec<SseEvent>,
    /// Comment lines (`: keep-alive`) seen.
    pub(crate) comments: usize,
    /// Bytes after the last complete event (a half event when the stream was cut).
    pub(crate) trailing: String,
    /// The transport error that ended the body, if any.
    pub(crate) error: Option<String>,
    /// The whole body as received.
    pub(crate) raw: String,
    /// From send to the end of the body.
    pub(crate) elapsed: Duration,
    /// From send to the response headers.
    pub(crate) headers_at: Duration,
}

/// Parses complete SSE blocks out of `buf`, leaving an incomplete tail in place.
pub(crate) fn parse_sse(
    buf: &mut String,
    at: Duration,
    events: &mut Vec<SseEvent>,
    comments: &mut usize,
) {
    loop {
        let normalized = buf.replace("\r\n", "\n");
        if normalized.len() != buf.len() {
            *buf = normalized;
        }
        let Some(end) = buf.find("\n\n") else { return };
        let block: String = buf.drain(..end + 2).collect();
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if line.starts_with(':') {
                *comments += 1;
            } else if let Some(v) = line.strip_prefix("event:") {
                event = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if event.is_some() || !data.is_empty() {
            events.push(SseEvent {
                event,
                data: data.join("\n"),
                at,
            });
        }
    }
}

/// Sends a request and reads its SSE body to the end, stamping each event.
pub(crate) async fn stream(req: reqwest::RequestBuilder) -> StreamReply {
    let t0 = Instant::now();
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    let headers_at = t0.elapsed();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut raw = String::new();
    let mut events = Vec::new();
    let mut comments = 0;
    let mut error = None;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                raw.push_str(&text);
                buf.push_str(&text);
                parse_sse(&mut buf, t0.elapsed(), &mut events, &mut comments);
            }
            Err(e) => {
                error = Some(format!("{e:?}"));
                break;
            }
        }
    }
    StreamReply {
        status,
        headers,
        events,
        comments,
        trailing: buf,
        error,
        raw,
        elapsed: t0.elapsed(),
        headers_at,
    }
}

impl StreamReply {
    /// Name of the provider in `x-switchyard-provider` (without its `namespace/` prefix).
    pub(crate) fn provider(&self) -> Option<String> {
        header(&self.headers, "x-switchyard-provider").map(|v| provider_name(&v))
    }

    /// Data payloads other than `[DONE]`, as JSON; panics on a payload that is not exactly one
    /// JSON object (field case 19b).
    pub(crate) fn payloads(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.data != "[DONE]" && !e.data.is_empty())
            .map(|e| {
                let v: Value = serde_json::from_str(&e.data).unwrap_or_else(|err| {
                    panic!("data payload is not one JSON value ({err}): {:?}", e.data)
                });
                assert!(v.is_object(), "data payload is not an object: {v}");
                v
            })
            .collect()
    }

    /// OpenAI chunks whose delta carries a role.
    pub(crate) fn openai_role_chunks(&self) -> usize {
        self.payloads()
            .iter()
            .filter(|v| {
                v["choices"][0]["delta"]
                    .get("role")
                    .is_some_and(|r| !r.is_null())
            })
            .count()
    }

    /// Concatenated OpenAI delta content.
    pub(crate) fn openai_text(&self) -> String {
        self.payloads()
            .iter()
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Number of OpenAI chunks carrying non-empty content.
    pub(crate) fn openai_content_chunks(&self) -> usize {
        self.payloads()
            .iter()
            .filter(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
            .count()
    }

    /// `finish_reason`s seen, in order.
    pub(crate) fn openai_finish_reasons(&self) -> Vec<String> {
        self.payloads()
            .iter()
            .filter_map(|v| v["choices"][0]["finish_reason"].as_str().map(str::to_owned))
            .collect()
    }

    /// Payloads that carry an `error` object (OpenAI-style error event).
    pub(crate) fn error_payloads(&self) -> Vec<Value> {
        self.payloads()
            .into_iter()
            .filter(|v| v.get("error").is_some() || v["type"] == "error")
            .collect()
    }

    /// Whether the stream ended with `data: [DONE]`.
    pub(crate) fn has_done(&self) -> bool {
        self.events.iter().any(|e| e.data == "[DONE]")
    }

    /// Names of Anthropic events (`event:` field, else the payload's `type`).
    pub(crate) fn anthropic_event_names(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| {
                e.event.clone().unwrap_or_else(|| {
                    e.json()
                        .and_then(|v| v["type"].as_str().map(str::to_owned))
                        .unwrap_or_default()
                })
            })
            .collect()
    }

    /// Count of Anthropic events with this name.
    pub(crate) fn anthropic_count(&self, name: &str) -> usize {
        self.anthropic_event_names()
            .iter()
            .filter(|n| *n == name)
            .count()
    }

    /// Concatenated Anthropic text deltas.
    pub(crate) fn anthropic_text(&self) -> String {
        self.payloads()
            .iter()
            .filter(|v| v["type"] == "content_block_delta")
            .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
            .collect()
    }

    /// When the first content (OpenAI content delta or Anthropic text delta) arrived.
    pub(crate) fn first_content_at(&self) -> Option<Duration> {
        self.events
            .iter()
            .find(|e| {
                e.json().is_some_and(|v| {
                    v["choices"][0]["delta"]["content"]
                        .as_str()
                        .is_some_and(|s| !s.is_empty())
                        || v["type"] == "content_block_delta"
                })
            })
            .map(|e| e.at)
    }

    /// Short description for assertion messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "status {} headers {:?} error {:?} trailing {:?}\nbody:\n{}",
            self.status, self.headers, self.error, self.trailing, self.raw
        )
    }
}

// ---------------------------------------------------------------------------------------------
// /status helpers (tolerant of the exact layout: they look for the resource by name)
// ---------------------------------------------------------------------------------------------

fn object_name(v: &Value) -> Option<&str> {
    v.get("name")
        .and_then(Value::as_str)
        .or_else(|| v.get("metadata")?.get("name")?.as_str())
}

fn find_objects<'a>(v: &'a Value, pred: &dyn Fn(&Value) -> bool, out: &mut Vec<&'a Value>) {
    if pred(v) {
        out.push(v);
    }
    match v {
        Value::Array(a) => a.iter().for_each(|x| find_objects(x, pred, out)),
        Value::Object(o) => o.values().for_each(|x| find_objects(x, pred, out)),
        _ => {}
    }
}

/// One provider's entry in a policy's status.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WeightEntry {
    /// Provider name.
    pub(crate) name: String,
    /// Availability in [0, 1].
    pub(crate) availability: f64,
    /// Cascade weight.
    pub(crate) weight: f64,
    /// Whether the provider may serve this policy.
    pub(crate) eligible: bool,
    /// Why not, when not.
    pub(crate) reason: Option<String>,
}

/// The per-provider weights of a policy in a `/status` document: the `providers` list (with
/// `weight`) of the object named `policy` (or of its `status`).
pub(crate) fn policy_weights(status: &Value, policy: &str) -> Option<Vec<WeightEntry>> {
    let mut found = Vec::new();
    find_objects(
        status,
        &|v| object_name(v) == Some(policy) && weights_list(v).is_some(),
        &mut found,
    );
    let list = weights_list(found.first()?)?;
    Some(
        list.iter()
            .map(|p| WeightEntry {
                name: object_name(p).unwrap_or_default().to_owned(),
                availability: p["availability"].as_f64().unwrap_or(f64::NAN),
                weight: p["weight"].as_f64().unwrap_or(f64::NAN),
                eligible: p["eligible"].as_bool().unwrap_or(true),
                reason: p["reason"].as_str().map(str::to_owned),
            })
            .collect(),
    )
}

fn weights_list(v: &Value) -> Option<&Vec<Value>> {
    let direct = v.get("providers").and_then(Value::as_array);
    let nested = v.get("status")?.get("providers").and_then(Value::as_array);
    [direct, nested]
        .into_iter()
        .flatten()
        .find(|l| l.iter().any(|p| p.get("weight").is_some()))
}

/// Weight of one provider under one policy.
pub(crate) fn weight_of(status: &Value, policy: &str, provider: &str) -> Option<f64> {
    policy_weights(status, policy)?
        .into_iter()
        .find(|w| w.name == provider)
        .map(|w| w.weight)
}

/// Availability of a provider: the LLMProvider status if present, else its entry under any
/// policy.
pub(crate) fn availability_of(status: &Value, provider: &str) -> Option<f64> {
    let mut found = Vec::new();
    find_objects(
        status,
        &|v| {
            object_name(v) == Some(provider)
                && (v.get("availability").is_some_and(Value::is_number)
                    || v.get("status")
                        .and_then(|s| s.get("availability"))
                        .is_some_and(Value::is_number))
        },
        &mut found,
    );
    let v = found.first()?;
    v.get("status")
        .and_then(|s| s.get("availability"))
        .or_else(|| v.get("availability"))?
        .as_f64()
}

/// The `lastWindow` object of a provider's status, if present.
pub(crate) fn last_window_of(status: &Value, provider: &str) -> Option<Value> {
    let mut found = Vec::new();
    find_objects(
        status,
        &|v| {
            object_name(v) == Some(provider)
                && (v.get("lastWindow").is_some()
                    || v.get("status").and_then(|s| s.get("lastWindow")).is_some())
        },
        &mut found,
    );
    let v = found.first()?;
    v.get("status")
        .and_then(|s| s.get("lastWindow"))
        .or_else(|| v.get("lastWindow"))
        .cloned()
}

// ---------------------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------------------

/// Polls `check` every `every` until it returns `Some` or `timeout` passes.
pub(crate) async fn wait_for<T, F, Fut>(
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Counts per value.
pub(crate) fn histogram<I: IntoIterator<Item = String>>(items: I) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in items {
        *m.entry(i).or_insert(0) += 1;
    }
    m
}

/// Whether the test runs under CI (`CI=true` or `CI=1`).
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Root of the workspace (parent of this crate's manifest dir).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// The official SDKs as clients: the venv and the client scripts in tests/python.
// ---------------------------------------------------------------------------------------------

/// The venv's python (`<repo>/.venv`, or `SWITCHYARD_PYTHON`); `None` (a skip with a note)
/// when missing outside CI, a failure under CI.
pub(crate) fn python() -> Option<PathBuf> {
    let p = std::env::var_os("SWITCHYARD_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    if p.is_file() {
        return Some(p);
    }
    let msg = format!(
        "python venv with the SDKs not found at {}: run scripts/setup-venv.sh (or set SWITCHYARD_PYTHON)",
        p.display()
    );
    assert!(!in_ci(), "{msg}");
    eprintln!("SKIPPED: {msg}");
    None
}

/// Runs `tests/python/<script>` with `args` and extra `env` (no proxies, no ambient cloud
/// credentials) and returns the JSON line it prints last.
pub(crate) async fn run_script(
    python: &std::path::Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let path = workspace_root().join("tests/python").join(script);
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&path)
        .args(args)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        // No ambient cloud credentials or config may leak into the clients.
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("client script timed out")
        .expect("client script did not start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{script} printed no JSON line ({e}):\n{stdout}\n{stderr}"))
}

/// The facts of one check, asserting that the check itself ran without an exception.
pub(crate) fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    let c = &report["checks"][name];
    assert!(
        c["ok"] == true,
        "SDK check `{name}` failed: {}\n{}",
        c["error"],
        c["trace"].as_str().unwrap_or_default()
    );
    c
}
