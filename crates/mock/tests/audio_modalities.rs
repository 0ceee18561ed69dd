//! Audio endpoints, served modalities, strict parameters and per-modality faults of the mock
//! (field case 26), against a real mock over loopback.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use switchyard_mock::{
    Fault, FaultRule, FaultSet, MockConfig, MockHandle, MockModality, MockProvider, Trigger,
};

async fn start(cfg: MockConfig) -> MockHandle {
    MockProvider::start(cfg).await.unwrap()
}

fn wav() -> Vec<u8> {
    let mut w = b"RIFF".to_vec();
    w.resize(64, 0);
    w
}

fn multipart(model: &str, file: &[u8]) -> (String, Vec<u8>) {
    let boundary = "b0undary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

async fn transcribe(mock: &MockHandle, file: &[u8]) -> reqwest::Response {
    let (content_type, body) = multipart("whisper-1", file);
    reqwest::Client::new()
        .post(format!("{}/audio/transcriptions", mock.openai_base_url()))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn post(mock: &MockHandle, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", mock.openai_base_url()))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn transcription_multipart_returns_empty_text_and_records_model() {
    let mock = start(MockConfig::default()).await;
    let resp = transcribe(&mock, &wav()).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, json!({"text": ""}));
    let calls = mock.calls();
    assert_eq!(calls[0].path, "/v1/audio/transcriptions");
    assert_eq!(calls[0].model, "whisper-1");
}

#[tokio::test]
async fn transcription_without_file_or_not_multipart_is_400() {
    let mock = start(MockConfig::default()).await;
    assert_eq!(transcribe(&mock, b"").await.status(), 400);
    let resp = post(&mock, "/audio/transcriptions", json!({"model": "w"})).await;
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn speech_voice_required_and_checked_against_known_voices() {
    let mock = start(MockConfig {
        voices: vec!["v2".into()],
        ..MockConfig::default()
    })
    .await;
    let ok = post(
        &mock,
        "/audio/speech",
        json!({"model": "tts", "input": "hi", "voice": "v2"}),
    )
    .await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["content-type"], "audio/wav");
    let audio = ok.bytes().await.unwrap();
    assert_eq!(&audio[..4], b"RIFF");
    let missing = post(
        &mock,
        "/audio/speech",
        json!({"model": "tts", "input": "hi"}),
    )
    .await;
    assert_eq!(missing.status(), 400);
    let unknown = post(
        &mock,
        "/audio/speech",
        json!({"model": "tts", "input": "hi", "voice": "v9"}),
    )
    .await;
    assert_eq!(unknown.status(), 400);
    let err: Value = unknown.json().await.unwrap();
    assert_eq!(err["error"]["param"], "voice");
    assert!(err["error"]["message"].as_str().unwrap().contains("v9"));
}

#[tokio::test]
async fn modalities_limit_paths_others_404() {
    let mock = start(MockConfig {
        modalities: vec![MockModality::Transcription],
        ..MockConfig::default()
    })
    .await;
    assert_eq!(transcribe(&mock, &wav()).await.status(), 200);
    let chat = post(
        &mock,
        "/chat/completions",
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(chat.status(), 404);
    let emb = post(&mock, "/embeddings", json!({"model": "e", "input": ["x"]})).await;
    assert_eq!(emb.status(), 404);
}

#[tokio::test]
async fn reject_max_tokens_on_embeddings_but_not_chat() {
    let mock = start(MockConfig {
        reject_max_tokens: true,
        ..MockConfig::default()
    })
    .await;
    let bad = post(
        &mock,
        "/embeddings",
        json!({"model": "e", "input": ["x"], "max_tokens": 1}),
    )
    .await;
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.unwrap();
    assert_eq!(err["error"]["param"], "max_tokens");
    let good = post(&mock, "/embeddings", json!({"model": "e", "input": ["x"]})).await;
    assert_eq!(good.status(), 200);
    let chat = post(
        &mock,
        "/chat/completions",
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(chat.status(), 200);
}

#[tokio::test]
async fn modality_fault_breaks_audio_only() {
    let faults =
        FaultSet::rules([
            FaultRule::always(Fault::ServerError { status: 500 }).when(Trigger {
                modalities: vec![MockModality::Transcription, MockModality::Speech],
                ..Trigger::default()
            }),
        ]);
    let mock = start(MockConfig {
        faults,
        ..MockConfig::default()
    })
    .await;
    assert_eq!(transcribe(&mock, &wav()).await.status(), 500);
    let speech = post(
        &mock,
        "/audio/speech",
        json!({"model": "tts", "input": "hi", "voice": "v1"}),
    )
    .await;
    assert_eq!(speech.status(), 500);
    let chat = post(
        &mock,
        "/chat/completions",
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(chat.status(), 200);
}
