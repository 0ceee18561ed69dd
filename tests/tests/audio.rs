//! Speech to text end to end (issue 11 item 4, seed 003): `POST /v1/audio/transcriptions`
//! through a real router to Gemini on Vertex (audio inline) and to an OpenAI-compatible
//! server (multipart forwarded), with candidates chosen by the `transcription` modality's
//! probed health per provider and region.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Policy, Provider, Reply, Setup, Stack, send, serial};
use serde_json::Value;
use switchyard_mock::{Fault, FaultRule, FaultSet, MockModality, Trigger};
use tokio::time::Instant;

const BOUNDARY: &str = "e2e-audio-boundary-5d1c";

/// `millis` ms of silent 16 kHz mono 16-bit PCM WAV.
fn wav(millis: u32) -> Vec<u8> {
    let data_len = 16 * millis * 2;
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data_len).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&16_000u32.to_le_bytes());
    w.extend_from_slice(&32_000u32.to_le_bytes());
    w.extend_from_slice(&2u16.to_le_bytes());
    w.extend_from_slice(&16u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data_len.to_le_bytes());
    w.resize(44 + data_len as usize, 0);
    w
}

/// An OpenAI transcription upload: the text `fields`, then `file` as `clip.wav` when given.
fn form(fields: &[(&str, &str)], file: Option<&[u8]>) -> Vec<u8> {
    let mut b = Vec::new();
    for (k, v) in fields {
        b.extend_from_slice(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    if let Some(audio) = file {
        b.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            )
            .as_bytes(),
        );
        b.extend_from_slice(audio);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    b
}

async fn upload(stack: &Stack, body: Vec<u8>) -> Reply {
    send(
        stack
            .post("/v1/audio/transcriptions")
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(body),
    )
    .await
}

async fn transcribe(stack: &Stack, model: &str) -> Reply {
    upload(stack, form(&[("model", model)], Some(&wav(1000)))).await
}

/// The probed state of `modality` of provider `name` in `/status` (`None` when not probed).
async fn health_state(stack: &Stack, name: &str, modality: &str) -> Option<String> {
    let status = stack.status().await;
    let provider = status["providers"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?
        .clone();
    provider["status"]["health"]
        .as_array()?
        .iter()
        .find(|h| h["modality"] == modality)
        .and_then(|h| h["state"].as_str().map(str::to_owned))
}

/// Waits until every `(provider, modality, state)` holds in `/status`.
async fn wait_health(stack: &Stack, want: &[(&str, &str, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut seen = Vec::new();
        for (p, m, _) in want {
            seen.push(health_state(stack, p, m).await);
        }
        if want
            .iter()
            .zip(&seen)
            .all(|((_, _, s), got)| got.as_deref() == Some(*s))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "health never reached {want:?}; last seen {seen:?}\n{}",
            stack.router.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn audio_broken() -> FaultSet {
    FaultSet::rules([
        FaultRule::always(Fault::ServerError { status: 500 }).when(Trigger {
            modalities: vec![MockModality::Transcription],
            ..Trigger::default()
        }),
    ])
}

/// Gemini on Vertex in `region`, serving chat (`e2e-chat`) and speech to text (`e2e-stt`)
/// with the same model, probed every 200 ms, Unhealthy after one failure.
fn gemini_region(name: &str, region: &str) -> Provider {
    Provider::vertex(name, "gemini-2.5-flash")
        .region(region)
        .models(&[("e2e-chat", "text"), ("e2e-stt", "transcription")])
        .with("healthCheck: {enabled: true, interval: 200ms, failureThreshold: 1, timeout: 2s}")
}

/// Seed 003: region A answers text and fails audio. Audio goes to region B at once (no
/// attempt on A), text stays on A; when A's audio recovers both are served by A again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_follows_transcription_health_per_region_while_text_stays() {
    let _g = serial().await;
    let a = gemini_region("vertex-eu", "europe-west4").mock(|m| m.faults = audio_broken());
    let b = gemini_region("vertex-us", "us-east5");
    let stack = Stack::start(
        Setup::new()
            .provider(a)
            .provider(b)
            .policy(Policy::chat("e2e-chat", &["vertex-eu", "vertex-us"]))
            .policy(Policy::transcription(
                "e2e-stt",
                &["vertex-eu", "vertex-us"],
            )),
    )
    .await;

    wait_health(
        &stack,
        &[
            ("vertex-eu", "text", "Healthy"),
            ("vertex-eu", "transcription", "Unhealthy"),
            ("vertex-us", "text", "Healthy"),
            ("vertex-us", "transcription", "Healthy"),
        ],
    )
    .await;
    for _ in 0..3 {
        let audio = transcribe(&stack, "e2e-stt").await;
        assert_eq!(audio.status, 200, "{}", audio.body);
        assert_eq!(audio.provider().as_deref(), Some("vertex-us"));
        // Straight to B: region A was not a candidate, so nothing failed over.
        assert_eq!(audio.attempts(), Some(1));
        let v = audio.json();
        assert!(v["text"].is_string(), "{v}");
        // The mock counts inline audio at a token per 1000 bytes: 32 044 bytes of WAV.
        assert!(
            v["usage"]["input_tokens"].as_u64().unwrap_or(0) >= 32,
            "{v}"
        );
        let text = stack.chat("e2e-chat", Some("proj-1")).await;
        assert_eq!(text.status, 200, "{}", text.body);
        assert_eq!(text.provider().as_deref(), Some("vertex-eu"));
        assert_eq!(text.attempts(), Some(1));
    }
    // What reached region B was Gemini with the audio inline.
    let b_calls = stack.mock("vertex-us").calls();
    assert!(
        b_calls
            .iter()
            .any(|c| c.path.ends_with("gemini-2.5-flash:generateContent") && c.status == 200),
        "{b_calls:?}"
    );

    // Region A's audio path recovers: the next probe marks it Healthy and audio returns.
    stack.mock("vertex-eu").set_faults(FaultSet::default());
    wait_health(&stack, &[("vertex-eu", "transcription", "Healthy")]).await;
    let audio = transcribe(&stack, "e2e-stt").await;
    assert_eq!(audio.status, 200, "{}", audio.body);
    assert_eq!(audio.provider().as_deref(), Some("vertex-eu"));
    assert_eq!(audio.attempts(), Some(1));
    let text = stack.chat("e2e-chat", Some("proj-1")).await;
    assert_eq!(text.provider().as_deref(), Some("vertex-eu"));
}

/// Before any probe verdict (and with probes off) health never blocks: a broken region is
/// tried and the request fails over to the next one (fail-open plus ordinary fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_health_verdicts_audio_fails_over_by_error() {
    let _g = serial().await;
    let a = Provider::vertex("vertex-eu", "gemini-2.5-flash")
        .region("europe-west4")
        .models(&[("e2e-stt", "transcription")])
        .mock(|m| m.faults = audio_broken());
    let b =
        Provider::vertex("vertex-us", "gemini-2.5-flash").models(&[("e2e-stt", "transcription")]);
    let stack = Stack::start(
        Setup::new()
            .provider(a)
            .provider(b)
            .policy(Policy::transcription(
                "e2e-stt",
                &["vertex-eu", "vertex-us"],
            )),
    )
    .await;
    let audio = transcribe(&stack, "e2e-stt").await;
    assert_eq!(audio.status, 200, "{}", audio.body);
    assert_eq!(audio.provider().as_deref(), Some("vertex-us"));
    assert_eq!(audio.attempts(), Some(2));
    // The first model call (an OAuth `/token` exchange may come before it).
    let calls = stack.mock("vertex-eu").calls();
    let first = calls.iter().find(|c| c.path.ends_with(":generateContent"));
    assert_eq!(first.map(|c| c.status), Some(500), "{calls:?}");
}

/// An OpenAI-compatible server gets the multipart upload with its own model name and is
/// asked for JSON; `response_format: text` comes back as text/plain; bad uploads are 400s in
/// OpenAI's error shape naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_compatible_gets_multipart_and_errors_name_the_field() {
    let _g = serial().await;
    let mut stt = Provider::openai("whisper-host").models(&[("e2e-stt", "transcription")]);
    stt.upstream = Some("whisper-large-v3".to_owned());
    let stack = Stack::start(
        Setup::new()
            .provider(stt)
            .provider(Provider::openai("chat-host"))
            .policy(Policy::transcription("e2e-stt", &["whisper-host"]))
            .policy(Policy::chat("e2e-chat", &["chat-host"])),
    )
    .await;

    let json = transcribe(&stack, "e2e-stt").await;
    assert_eq!(json.status, 200, "{}", json.body);
    assert_eq!(
        json.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(json.json()["text"], "");
    let calls = stack.mock("whisper-host").calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].path, "/v1/audio/transcriptions");
    assert_eq!(calls[0].model, "whisper-large-v3");

    let text = upload(
        &stack,
        form(
            &[
                ("model", "e2e-stt"),
                ("response_format", "text"),
                ("language", "ja"),
            ],
            Some(&wav(500)),
        ),
    )
    .await;
    assert_eq!(text.status, 200, "{}", text.body);
    assert_eq!(
        text.header("content-type").as_deref(),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(text.body, "");

    let error = |r: &Reply| -> (u16, String, String) {
        let v: Value = r.json();
        (
            r.status,
            v["error"]["type"].as_str().unwrap_or_default().to_owned(),
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let no_file = upload(&stack, form(&[("model", "e2e-stt")], None)).await;
    let (status, kind, message) = error(&no_file);
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(message.contains("`file`"), "{message}");
    let no_model = upload(&stack, form(&[], Some(&wav(100)))).await;
    assert!(error(&no_model).2.contains("`model`"));
    let verbose = upload(
        &stack,
        form(
            &[("model", "e2e-stt"), ("response_format", "verbose_json")],
            Some(&wav(100)),
        ),
    )
    .await;
    assert_eq!(verbose.status, 400);
    assert!(error(&verbose).2.contains("`response_format`"));
    let json_body = send(
        stack
            .post("/v1/audio/transcriptions")
            .json(&serde_json::json!({"model": "e2e-stt"})),
    )
    .await;
    assert_eq!(json_body.status, 400);
    assert!(error(&json_body).2.contains("multipart/form-data"));
    // A chat model is not served on the transcription endpoint, nor the reverse.
    let wrong = transcribe(&stack, "e2e-chat").await;
    assert_eq!(wrong.status, 400);
    assert_eq!(wrong.json()["error"]["code"], "wrong_endpoint_for_model");
    let unknown = transcribe(&stack, "nope").await;
    assert_eq!(unknown.status, 404);
    // None of the refused uploads reached the provider.
    assert_eq!(stack.mock("whisper-host").calls().len(), 2);
}
