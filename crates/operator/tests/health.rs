//! Active health probes run by the operator (issue 6 item 2): against the fake API server and
//! a mock provider on loopback, the operator probes each modality of a provider with
//! `healthCheck.enabled` using the credentials from its Secret, and writes the verdicts into
//! `status.health` of the status patch it sends.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::*;
use switchyard_api::LLMProvider;
use switchyard_mock::{
    Fault, FaultRule, FaultSet, MockConfig, MockHandle, MockModality, MockProvider, Trigger,
};
use switchyard_operator::{Leadership, Operator, Settings, Stores, Synced, Targets};

const KEY: &str = "sk-probe-test";

/// A mock serving text and transcription whose transcription answers 500, accepting only
/// [`KEY`].
async fn broken_audio_mock() -> MockHandle {
    let faults =
        FaultSet::rules([
            FaultRule::always(Fault::ServerError { status: 500 }).when(Trigger {
                modalities: vec![MockModality::Transcription],
                ..Trigger::default()
            }),
        ]);
    MockProvider::start(MockConfig {
        name: "p-mix".into(),
        api_keys: vec![KEY.into()],
        faults,
        ..MockConfig::default()
    })
    .await
    .unwrap()
}

fn probed_provider(endpoint: &str) -> Value {
    json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": "p-mix", "namespace": NS, "uid": "u-1"},
        "spec": {
            "api": "openai",
            "endpoint": endpoint,
            "credentials": {"secretRef": {"name": "creds", "key": "api-key"}},
            "models": [
                {"name": "mix-chat", "modalities": ["text"]},
                {"name": "mix-whisper", "modalities": ["transcription"]}
            ],
            "healthCheck": {"enabled": true, "interval": "100ms", "failureThreshold": 2},
        },
    })
}

struct Setup {
    fake: FakeApi,
    op: Arc<Operator>,
    providers: Writer<LLMProvider>,
    path: String,
}

async fn setup(endpoint: &str, probes: bool) -> Setup {
    let fake = FakeApi::start().await;
    let (ps, providers) = reflector::store::<LLMProvider>();
    let (rs, _policies) = reflector::store();
    let (ts, _tenants) = reflector::store();
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
    let op = Operator::new(
        fake.client(),
        Stores {
            providers: ps,
            policies: rs,
            tenants: ts,
        },
        Settings {
            targets: Targets::Static(Vec::new()),
            leadership: Leadership::fixed(true),
            identity: "operator-0".into(),
            clock: Arc::new(move || at),
        },
    )
    .with_probes(probes);
    fake.put(secret("creds", &["api-key"]));
    op.update_secrets(|s| {
        s.set_access(switchyard_operator::validate::SecretAccess::Synced);
        s.insert(NS, "creds", [("api-key".to_owned(), true)])
    });
    op.set_secret_values(
        NS,
        "creds",
        Some(BTreeMap::from([("api-key".to_owned(), format!("{KEY}\n"))])),
    );
    let value = probed_provider(endpoint);
    let path = object_path(&value);
    fake.put(value);
    let mut s = Setup {
        fake,
        op: Arc::new(op),
        providers,
        path,
    };
    s.echo();
    s
}

impl Setup {
    /// Feeds the stored provider (with the status the operator wrote) back into the cache.
    fn echo(&mut self) {
        let v = self.fake.get(&self.path).unwrap();
        self.providers
            .apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(v).unwrap()));
    }

    fn provider(&self) -> Arc<LLMProvider> {
        self.op.stores().providers.state().pop().unwrap()
    }

    /// `(modality, state, reason)` of each `status.health` entry of the last status patch.
    fn last_health(&self) -> Vec<(String, String, String)> {
        let Some(last) = self.fake.status_patches(&self.path).pop() else {
            return Vec::new();
        };
        let status = &last.body.unwrap()["status"];
        status["health"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| {
                        let s = |k: &str| h[k].as_str().unwrap_or_default().to_owned();
                        (s("modality"), s("state"), s("reason"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn last_probe_times(&self) -> Vec<String> {
        let last = self.fake.status_patches(&self.path).pop().unwrap();
        last.body.unwrap()["status"]["health"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["lastProbeTime"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn expected() -> Vec<(String, String, String)> {
    [
        ("text", "Healthy", "ProbeSucceeded"),
        ("transcription", "Unhealthy", "ProbeFailed"),
    ]
    .iter()
    .map(|(m, s, r)| ((*m).to_owned(), (*s).to_owned(), (*r).to_owned()))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_enabled_broken_modality_status_health_healthy_and_unhealthy() {
    let mock = broken_audio_mock().await;
    let mut s = setup(&mock.base_url(), true).await;
    let probing = s.op.clone();
    let probes = tokio::spawn(async move { probing.run_probes().await });

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let p = s.provider();
        s.op.sync_provider(&p).await.unwrap();
        s.echo();
        if s.last_health() == expected() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status.health never reached the expected verdicts; last: {:?}",
            s.last_health()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The patch went through the status subresource under the operator's field manager,
    // with the rest of the provider status alongside.
    let patch = s.fake.status_patches(&s.path).pop().unwrap();
    assert_eq!(patch.method, "PATCH");
    assert!(
        patch.query.contains("fieldManager=switchyard-operator"),
        "{}",
        patch.query
    );
    let status = &patch.body.unwrap()["status"];
    assert_eq!(cond(status, "Ready")["status"], "True");
    let message = status["health"][1]["message"].as_str().unwrap();
    assert!(message.contains("500"), "{message}");

    // Verdicts unchanged: past one interval `lastProbeTime` is refreshed all the same
    // (routers call verdicts older than three intervals stale). Status times have whole
    // seconds, so wait past the next second to see them move.
    let before = s.last_probe_times();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let p = s.provider();
    assert_eq!(s.op.sync_provider(&p).await.unwrap(), Synced::Written);
    s.echo();
    assert_eq!(s.last_health(), expected());
    let after = s.last_probe_times();
    for (b, a) in before.iter().zip(&after) {
        assert!(a > b, "lastProbeTime did not move: {b} -> {a}");
    }
    probes.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_disabled_status_has_no_health_and_mock_sees_no_probe() {
    let mock = broken_audio_mock().await;
    let s = setup(&mock.base_url(), false).await;
    let probing = s.op.clone();
    // Returns at once: nothing to run.
    tokio::time::timeout(Duration::from_secs(1), probing.run_probes())
        .await
        .unwrap();
    let p = s.provider();
    assert_eq!(s.op.sync_provider(&p).await.unwrap(), Synced::Written);
    assert!(s.last_health().is_empty());
    assert_eq!(mock.call_count(), 0);
}

fn cond<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}
