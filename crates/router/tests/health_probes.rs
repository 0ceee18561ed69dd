//! Active health probes per provider and modality (DESIGN §4.8, field case 26), over real HTTP
//! on loopback against the mock provider: each modality probed in its own wire shape, probe
//! 4xx kept apart from unavailability, a broken audio path that leaves text healthy and
//! routable, and fail-open when the board has nothing or only stale verdicts.

// Test helpers outside #[test] fns are not covered by clippy.toml allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_api::loader::Manifests;
use switchyard_api::provider::{HealthState as ApiHealthState, Modality, health_reason};
use switchyard_api::{LLMProvider, RoutingPolicy};
use switchyard_core::health::{HealthState, ProbeOutcome};
use switchyard_mock::{
    Fault, FaultRule, FaultSet, MockConfig, MockHandle, MockModality, MockProvider, Trigger,
};
use switchyard_router::app::App;
use switchyard_router::config::{RoutingTable, SecretSource};
use switchyard_router::health::HealthBoard;
use switchyard_router::probe::{self, ProbeResult};
use switchyard_router::state::Runtime;
use switchyard_router::status;

async fn mock(
    name: &str,
    modalities: &[MockModality],
    tweak: impl FnOnce(&mut MockConfig),
) -> MockHandle {
    let mut cfg = MockConfig {
        name: name.to_owned(),
        modalities: modalities.to_vec(),
        ..MockConfig::default()
    };
    tweak(&mut cfg);
    MockProvider::start(cfg).await.unwrap()
}

fn provider(name: &str, endpoint: &str, models: Value, health: Value) -> LLMProvider {
    serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "LLMProvider",
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"api": "openai", "endpoint": endpoint, "models": models, "healthCheck": health}
    }))
    .unwrap()
}

fn chat_policy(model: &str, provider: &str) -> RoutingPolicy {
    serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "RoutingPolicy",
        "metadata": {"name": model, "namespace": "default", "generation": 1},
        "spec": {"model": model, "serviceType": "chat", "providers": [{"name": provider}]}
    }))
    .unwrap()
}

fn table(providers: Vec<LLMProvider>, policies: Vec<RoutingPolicy>) -> RoutingTable {
    let m = Manifests {
        providers,
        policies,
        tenants: Vec::new(),
        sources: BTreeMap::new(),
        warnings: Vec::new(),
    };
    RoutingTable::build(&m, &SecretSource::default())
}

/// Probes every target of every provider in `table` once, records the results on `board`,
/// and returns them by provider key.
async fn probe_table_once(
    table: &RoutingTable,
    board: &HealthBoard,
    app: &App,
) -> BTreeMap<String, Vec<ProbeResult>> {
    let mut all = BTreeMap::new();
    for job in probe::jobs_of(table) {
        let results = probe::probe_all(&job.client, &job.plan).await;
        for (target, r) in job.plan.targets.iter().zip(&results) {
            board.record(
                &job.provider,
                r.modality,
                &target.health,
                &r.outcome,
                app.clock.now(),
                app.clock.wall(),
            );
        }
        all.insert(job.provider.clone(), results);
    }
    all
}

fn health_of(doc: &status::StatusDocument, name: &str) -> Vec<(Modality, ApiHealthState, String)> {
    doc.providers
        .iter()
        .find(|p| p.name == name)
        .unwrap()
        .status
        .health
        .iter()
        .map(|h| (h.modality, h.state, h.reason.clone().unwrap_or_default()))
        .collect()
}

fn condition<'a>(
    doc: &'a status::StatusDocument,
    name: &str,
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    doc.providers
        .iter()
        .find(|p| p.name == name)
        .unwrap()
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
}

#[tokio::test]
async fn case26_each_provider_probed_in_its_own_shape_reports_healthy() {
    let txt = mock("p-txt", &[MockModality::Text], |_| {}).await;
    let stt = mock("p-stt", &[MockModality::Transcription], |c| {
        c.reject_max_tokens = true
    })
    .await;
    let tts = mock("p-tts", &[MockModality::Speech], |c| {
        c.voices = vec!["v2".into()]
    })
    .await;
    let emb = mock("p-emb", &[MockModality::Embedding], |c| {
        c.reject_max_tokens = true
    })
    .await;
    let on = json!({"enabled": true, "interval": "10s"});
    let t = table(
        vec![
            provider(
                "p-txt",
                &txt.base_url(),
                json!([{"name": "chat-1"}]),
                on.clone(),
            ),
            provider(
                "p-stt",
                &stt.base_url(),
                json!([{"name": "whisper-1", "modalities": ["transcription"]}]),
                on.clone(),
            ),
            provider(
                "p-tts",
                &tts.base_url(),
                json!([{"name": "tts-1", "modalities": ["speech"]}]),
                json!({"enabled": true, "probes": [{"modality": "speech", "voice": "v2"}]}),
            ),
            provider(
                "p-emb",
                &emb.base_url(),
                json!([{"name": "emb-1", "modalities": ["embedding"]}]),
                on,
            ),
        ],
        Vec::new(),
    );
    let runtime = Runtime::new(t);
    let app = App::new(runtime.clone(), 1 << 20);
    let live = runtime.live();
    let results = probe_table_once(&live.table, &runtime.health, &app).await;

    let expected = [
        ("default/p-txt", Modality::Text),
        ("default/p-stt", Modality::Transcription),
        ("default/p-tts", Modality::Speech),
        ("default/p-emb", Modality::Embedding),
    ];
    for (key, modality) in expected {
        let r = &results[key];
        assert_eq!(r.len(), 1, "{key} probes only the modality it serves");
        assert_eq!(r[0].modality, modality);
        assert!(
            matches!(r[0].outcome, ProbeOutcome::Success { .. }),
            "{key}: {:?}",
            r[0]
        );
        assert_eq!(r[0].status, Some(200));
        let now = app.clock.now();
        assert_eq!(
            runtime.health.state(key, modality, now),
            HealthState::Healthy
        );
        assert!(runtime.health.admits(key, modality, now));
    }

    // Each probe used its modality's own endpoint, and only that one.
    let paths = |m: &MockHandle| m.calls().iter().map(|c| c.path.clone()).collect::<Vec<_>>();
    assert_eq!(paths(&txt), ["/v1/chat/completions"]);
    assert_eq!(paths(&stt), ["/v1/audio/transcriptions"]);
    assert_eq!(paths(&tts), ["/v1/audio/speech"]);
    assert_eq!(paths(&emb), ["/v1/embeddings"]);
    // The probes carried their models (the first model serving each modality).
    assert_eq!(stt.calls()[0].model, "whisper-1");
    assert_eq!(tts.calls()[0].model, "tts-1");
    assert_eq!(emb.calls()[0].model, "emb-1");
    // A 1-token text probe.
    assert_eq!(txt.calls()[0].tokens_streamed, 1);

    let doc = status::snapshot(&app);
    for name in ["p-txt", "p-stt", "p-tts", "p-emb"] {
        let h = health_of(&doc, name);
        assert_eq!(h.len(), 1, "{name}");
        assert_eq!(h[0].1, ApiHealthState::Healthy, "{name}");
        assert_eq!(h[0].2, health_reason::PROBE_SUCCEEDED, "{name}");
        let c = condition(&doc, name, health_reason::CONDITION_PROBES_VALID).unwrap();
        assert_eq!(c.status, "True", "{name}");
    }
}

#[tokio::test]
async fn case26_probe_shape_rejected_is_probe_config_problem_not_unavailability() {
    // P-STT serves transcription only and its chat path 404s; P-TTS knows voice v2 only.
    let stt = mock("p-stt", &[MockModality::Transcription], |c| {
        c.reject_max_tokens = true
    })
    .await;
    let tts = mock("p-tts", &[MockModality::Speech], |c| {
        c.voices = vec!["v2".into()]
    })
    .await;
    let t = table(
        vec![
            // Misconfigured: asks for a text probe on a transcription-only server.
            provider(
                "p-stt",
                &stt.base_url(),
                json!([{"name": "whisper-1", "modalities": ["transcription", "text"]}]),
                json!({"enabled": true, "failureThreshold": 1}),
            ),
            // Misconfigured: a voice the provider does not have.
            provider(
                "p-tts",
                &tts.base_url(),
                json!([{"name": "tts-1", "modalities": ["speech"]}]),
                json!({"enabled": true, "failureThreshold": 1,
                       "probes": [{"modality": "speech", "voice": "v9"}]}),
            ),
        ],
        Vec::new(),
    );
    let runtime = Runtime::new(t);
    let app = App::new(runtime.clone(), 1 << 20);
    let live = runtime.live();
    // Several rounds: far past the failure threshold of 1.
    let mut last = BTreeMap::new();
    for _ in 0..3 {
        last = probe_table_once(&live.table, &runtime.health, &app).await;
    }
    let stt_results = &last["default/p-stt"];
    let text = stt_results
        .iter()
        .find(|r| r.modality == Modality::Text)
        .unwrap();
    assert_eq!(text.status, Some(404));
    assert!(matches!(
        text.outcome,
        ProbeOutcome::ProbeRejected {
            status: Some(404),
            ..
        }
    ));
    let transcription = stt_results
        .iter()
        .find(|r| r.modality == Modality::Transcription)
        .unwrap();
    assert!(matches!(
        transcription.outcome,
        ProbeOutcome::Success { .. }
    ));
    let speech = &last["default/p-tts"][0];
    assert_eq!(speech.status, Some(400));
    match &speech.outcome {
        ProbeOutcome::ProbeRejected { status, detail } => {
            assert_eq!(*status, Some(400));
            assert!(detail.contains("v9"), "{detail}");
        }
        other => panic!("expected a probe-config rejection, got {other:?}"),
    }

    let now = app.clock.now();
    // Never Unhealthy, never blocking.
    assert_eq!(
        runtime.health.state("default/p-stt", Modality::Text, now),
        HealthState::Unknown
    );
    assert!(runtime.health.admits("default/p-stt", Modality::Text, now));
    assert_eq!(
        runtime.health.state("default/p-tts", Modality::Speech, now),
        HealthState::Unknown
    );
    assert!(
        runtime
            .health
            .admits("default/p-tts", Modality::Speech, now)
    );
    // The modality the provider does serve is healthy beside the rejected probe.
    assert_eq!(
        runtime
            .health
            .state("default/p-stt", Modality::Transcription, now),
        HealthState::Healthy
    );

    let doc = status::snapshot(&app);
    let h = health_of(&doc, "p-stt");
    assert!(h.contains(&(
        Modality::Text,
        ApiHealthState::Unknown,
        health_reason::PROBE_REJECTED.to_owned()
    )));
    assert!(h.contains(&(
        Modality::Transcription,
        ApiHealthState::Healthy,
        health_reason::PROBE_SUCCEEDED.to_owned()
    )));
    let h = health_of(&doc, "p-tts");
    assert_eq!(
        h,
        [(
            Modality::Speech,
            ApiHealthState::Unknown,
            health_reason::PROBE_REJECTED.to_owned()
        )]
    );
    for name in ["p-stt", "p-tts"] {
        let c = condition(&doc, name, health_reason::CONDITION_PROBES_VALID).unwrap();
        assert_eq!(c.status, "False", "{name}");
        assert_eq!(c.reason, health_reason::PROBE_REJECTED);
        assert!(
            c.message.contains("not provider unavailability"),
            "{}",
            c.message
        );
        // Availability and readiness are untouched by the probe's problem.
        let ready = condition(&doc, name, "Ready").unwrap();
        assert_eq!(ready.status, "True");
    }
    let p = doc.providers.iter().find(|p| p.name == "p-tts").unwrap();
    assert_eq!(p.status.availability, Some(1.0));
}

#[tokio::test]
async fn case26_speech_probe_without_voice_not_sent_and_reported() {
    let tts = mock("p-tts", &[MockModality::Speech], |c| {
        c.voices = vec!["v2".into()]
    })
    .await;
    let t = table(
        vec![provider(
            "p-tts",
            &tts.base_url(),
            json!([{"name": "tts-1", "modalities": ["speech"]}]),
            json!({"enabled": true}),
        )],
        Vec::new(),
    );
    let runtime = Runtime::new(t);
    let app = App::new(runtime.clone(), 1 << 20);
    let results = probe_table_once(&runtime.live().table, &runtime.health, &app).await;
    let r = &results["default/p-tts"][0];
    assert!(
        matches!(r.outcome, ProbeOutcome::ProbeRejected { status: None, .. }),
        "{r:?}"
    );
    assert_eq!(tts.call_count(), 0, "nothing is sent without a voice");
    assert!(
        runtime
            .health
            .admits("default/p-tts", Modality::Speech, app.clock.now())
    );
    let problems = runtime.health.probe_problems("default/p-tts");
    assert_eq!(problems.len(), 1);
    assert!(problems[0].1.contains("voice"), "{}", problems[0].1);
}

#[tokio::test]
async fn case26_run2_audio_broken_text_stays_healthy_and_routable() {
    // P-MIX serves text and audio; its audio paths answer 500, text is fine.
    let broken_audio = FaultSet::rules([FaultRule::always(Fault::ServerError { status: 500 })
        .when(Trigger {
            modalities: vec![MockModality::Transcription, MockModality::Speech],
            ..Trigger::default()
        })]);
    let mix = mock("p-mix", &[], |c| c.faults = broken_audio).await;
    // Another provider whose transcription works: where audio traffic should go instead.
    let stt = mock("p-stt", &[MockModality::Transcription], |_| {}).await;
    let t = table(
        vec![
            provider(
                "p-mix",
                &mix.base_url(),
                json!([
                    {"name": "mix-chat", "modalities": ["text"]},
                    {"name": "mix-whisper", "modalities": ["transcription"]},
                    {"name": "mix-tts", "modalities": ["speech"]}
                ]),
                json!({"enabled": true, "interval": "1s", "failureThreshold": 2,
                       "probes": [{"modality": "speech", "voice": "v2"}]}),
            ),
            provider(
                "p-stt",
                &stt.base_url(),
                json!([{"name": "whisper-1", "modalities": ["transcription"]}]),
                json!({"enabled": true, "interval": "1s", "failureThreshold": 2}),
            ),
        ],
        vec![chat_policy("mix-chat", "p-mix")],
    );
    let runtime = Runtime::new(t);
    // This test sends requests without a key: the process opts into anonymous access.
    let app = App::with_options(
        runtime.clone(),
        1 << 20,
        switchyard_store::QuotaStore::in_process(),
        switchyard_router::app::ServeOptions {
            allow_anonymous: true,
            ..Default::default()
        },
    );
    // The probe loop standalone runs, on the router's own board.
    let probes = tokio::spawn(probe::run_for_app(app.clone()));

    let key = "default/p-mix";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = app.clock.now();
        if runtime.health.state(key, Modality::Transcription, now) == HealthState::Unhealthy
            && runtime.health.state(key, Modality::Speech, now) == HealthState::Unhealthy
            && runtime.health.state(key, Modality::Text, now) == HealthState::Healthy
            && runtime
                .health
                .state("default/p-stt", Modality::Transcription, now)
                == HealthState::Healthy
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "states never settled: {:?}",
            runtime.health.status(key, now)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = app.clock.now();
    assert!(runtime.health.admits(key, Modality::Text, now));
    assert!(runtime.health.admits_all(key, &[Modality::Text], now));
    assert!(!runtime.health.admits(key, Modality::Transcription, now));
    assert!(!runtime.health.admits(key, Modality::Speech, now));
    // The candidate filter: transcription goes to the other provider, text stays on P-MIX.
    let both = vec!["default/p-mix", "default/p-stt"];
    assert_eq!(
        runtime
            .health
            .prefer_admitted(both.clone(), |k| k, &[Modality::Transcription], now),
        ["default/p-stt"]
    );
    assert_eq!(
        runtime
            .health
            .prefer_admitted(vec!["default/p-mix"], |k| k, &[Modality::Text], now),
        ["default/p-mix"]
    );

    let doc = status::snapshot(&app);
    let h = health_of(&doc, "p-mix");
    assert!(h.contains(&(
        Modality::Text,
        ApiHealthState::Healthy,
        health_reason::PROBE_SUCCEEDED.to_owned()
    )));
    assert!(h.contains(&(
        Modality::Transcription,
        ApiHealthState::Unhealthy,
        health_reason::PROBE_FAILED.to_owned()
    )));
    assert!(h.contains(&(
        Modality::Speech,
        ApiHealthState::Unhealthy,
        health_reason::PROBE_FAILED.to_owned()
    )));
    // A broken modality is unavailability, not a probe configuration problem.
    let c = condition(&doc, "p-mix", health_reason::CONDITION_PROBES_VALID).unwrap();
    assert_eq!(c.status, "True");
    let table = status::render_table(&doc);
    assert!(
        table.contains("health: text=Healthy transcription=Unhealthy(ProbeFailed) speech=Unhealthy(ProbeFailed)"),
        "{table}"
    );

    // Text requests still route to P-MIX and succeed (availability of text unaffected).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(switchyard_router::server::serve(
        app.clone(),
        listener,
        std::future::pending(),
    ));
    let http = reqwest::Client::new();
    for _ in 0..5 {
        let resp = http
            .post(format!("http://{addr}/v1/chat/completions"))
            .json(&json!({"model": "mix-chat", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert!(body["choices"][0]["message"]["content"].is_string());
    }
    let chat_calls = mix
        .calls()
        .iter()
        .filter(|c| c.path == "/v1/chat/completions" && c.model == "mix-chat" && c.status == 200)
        .count();
    assert!(
        chat_calls >= 5,
        "text traffic reached P-MIX ({chat_calls} successful chat calls)"
    );
    server.abort();
    probes.abort();
}

#[tokio::test]
async fn board_fail_open_when_empty_or_stale() {
    // Nothing probed: everything admitted.
    let board = HealthBoard::new();
    let t0 = switchyard_core::time::Instant::from_millis(1_000);
    for m in [
        Modality::Text,
        Modality::Transcription,
        Modality::Speech,
        Modality::Embedding,
    ] {
        assert!(board.admits("default/p-any", m, t0));
    }
    // An unhealthy verdict blocks while fresh and stops blocking once stale (3 intervals).
    let plan_spec: LLMProvider = provider(
        "p-stale",
        "http://127.0.0.1:9",
        json!([{"name": "m"}]),
        json!({"enabled": true, "interval": "1s", "failureThreshold": 1}),
    );
    let plan = probe::plan(&plan_spec.spec).unwrap();
    let cfg = &plan.targets[0].health;
    let wall = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let failure = ProbeOutcome::Failure {
        detail: "connection refused".into(),
    };
    board.record("default/p-stale", Modality::Text, cfg, &failure, t0, wall);
    assert!(!board.admits(
        "default/p-stale",
        Modality::Text,
        t0 + Duration::from_secs(3)
    ));
    let stale = t0 + Duration::from_millis(3_001);
    assert!(board.admits("default/p-stale", Modality::Text, stale));
    assert_eq!(
        board.state("default/p-stale", Modality::Text, stale),
        HealthState::Unknown
    );
}

#[tokio::test]
async fn probe_unreachable_provider_fails_then_unhealthy_at_threshold() {
    // A port nothing listens on: connection refused counts as failure.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let t = table(
        vec![provider(
            "p-dead",
            &dead,
            json!([{"name": "m"}]),
            json!({"enabled": true, "failureThreshold": 2, "timeout": "2s"}),
        )],
        Vec::new(),
    );
    let runtime = Runtime::new(t);
    let app = App::new(runtime.clone(), 1 << 20);
    let live = runtime.live();
    let first = probe_table_once(&live.table, &runtime.health, &app).await;
    assert!(matches!(
        first["default/p-dead"][0].outcome,
        ProbeOutcome::Failure { .. }
    ));
    let now = app.clock.now();
    assert_eq!(
        runtime.health.state("default/p-dead", Modality::Text, now),
        HealthState::Degraded
    );
    assert!(runtime.health.admits("default/p-dead", Modality::Text, now));
    probe_table_once(&live.table, &runtime.health, &app).await;
    let now = app.clock.now();
    assert_eq!(
        runtime.health.state("default/p-dead", Modality::Text, now),
        HealthState::Unhealthy
    );
    assert!(!runtime.health.admits("default/p-dead", Modality::Text, now));
}
