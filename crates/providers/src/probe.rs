//! Active health probes (DESIGN §4.8, seed 003, field case 26): per provider and modality, a
//! tiny real request in the provider's own wire format, classified by
//! [`switchyard_core::health::ProbeOutcome::from_status`] and fed to a [`HealthBoard`].
//!
//! Probe per modality (`openai` kind unless noted):
//!
//! | modality        | request                                                                  |
//! |-----------------|--------------------------------------------------------------------------|
//! | `text`          | `/v1/chat/completions`, one user word, `max_tokens: 1`; `anthropic` kind: `/v1/messages`, `max_tokens: 1` |
//! | `image`         | the text probe with a 1×1 PNG part (`image_url` data URL / Anthropic base64 `image` block) |
//! | `audio`         | the text probe with an `input_audio` part: 0.25 s of silent WAV           |
//! | `embedding`     | `/v1/embeddings`, `input: ["ping"]` — one item, no `max_tokens`           |
//! | `rerank`        | `/v1/rerank`, one query, one document                                     |
//! | `transcription` | the adapter's transcription call with 0.25 s of silent WAV: `/v1/audio/transcriptions` multipart `model` + `file` (+ `response_format: json`); Gemini on Vertex `generateContent` with the clip as `inlineData` |
//! | `speech`        | `/v1/audio/speech`, `input: "ok"` in the configured voice                  |
//!
//! Each probe asks for exactly what the modality's endpoint takes and nothing more, so that
//! a strict provider (one that refuses `max_tokens` on embeddings, or has no default voice)
//! is not "unhealthy" because of the probe; when a provider still refuses the probe's shape
//! the 4xx becomes [`ProbeOutcome::ProbeRejected`], a probe configuration problem. A probe that
//! cannot be built (no model serves the modality, a speech probe without a voice, a modality
//! the provider's API kind has no endpoint for) is not sent and reported the same way.
//!
//! Success means a 2xx with a complete body (JSON where JSON is expected); latency runs from
//! sending to the last body byte. [`plan`], [`probe_once`] and [`run`] need only an
//! [`UpstreamClient`], a [`HealthBoard`] and a [`Clock`] — not the server or the standalone
//! mode — so another process (the operator) can run the same probes; [`jobs_of`] and
//! [`run_for_app`] adapt them to the router's own snapshot.
//!
//! Rejected alternatives: `GET /v1/models` as the probe (a provider lists models while its
//! audio path is broken — the failure seed 003 describes); one probe per provider (the same
//! failure); streaming probes (time to first token is the dispatcher's measure; a probe wants
//! the cheapest complete answer). Transcription probes are the dispatcher's own internal request
//! ([`crate::wire::transcription`]) sent through the adapter, so a probe exercises exactly the
//! encoding client traffic gets (a Gemini region whose audio path is broken fails the probe,
//! seed 003).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderValue;
use serde_json::{Value, json};
use switchyard_api::duration;
use switchyard_api::provider::{LLMProviderSpec, Modality};
use switchyard_core::health::{HealthConfig, ProbeOutcome};
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::health::HealthBoard;
use crate::upstream::{Operation, ProviderKind, TransportError, UpstreamClient};

/// Default time between probes (the CRD's documented default).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Default consecutive failures before Unhealthy.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// Default latency above which a success is Degraded: a 1-token answer takes well under a
/// second on a healthy provider; five is slow enough that users notice.
pub const DEFAULT_LATENCY_THRESHOLD: Duration = Duration::from_secs(5);
/// Default probe timeout: twice the latency threshold, still far below the interval.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest interval honoured, so a typo such as `1ms` cannot turn probes into load.
pub const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// Largest probe answer read (a speech probe returns a short clip).
const MAX_PROBE_BODY: usize = 4 * 1024 * 1024;
/// Provider error messages are cut to this many characters in status.
const MAX_DETAIL: usize = 200;
/// Length of the silent clip sent to transcription and audio-in-chat probes.
const PROBE_AUDIO_MILLIS: u32 = 250;
/// A 1×1 transparent PNG.
const PROBE_PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// What to probe for one modality of one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The modality probed.
    pub modality: Modality,
    /// Upstream model name sent; `None` when no model of the provider serves the modality.
    pub model: Option<String>,
    /// Voice of speech probes.
    pub voice: Option<String>,
    /// Bound on one probe, sending to last byte.
    pub timeout: Duration,
    /// Thresholds of the state machine (failures, latency, staleness).
    pub health: HealthConfig,
}

/// Every probe of one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePlan {
    /// Time between probes of each modality.
    pub interval: Duration,
    /// One target per probed modality, in the order of the spec.
    pub targets: Vec<ProbeTarget>,
}

/// The modalities a model handles, `text` when it declares none (the CRD default).
fn model_modalities(declared: &[Modality]) -> &[Modality] {
    if declared.is_empty() {
        &[Modality::Text]
    } else {
        declared
    }
}

/// The probe plan of a provider spec, or `None` when `healthCheck` is absent or disabled.
///
/// Modalities: `healthCheck.modalities`, else every modality of `models[]` in first-seen
/// order. Model: `probes[].model` (a public name, mapped to its upstream name), else the first
/// model that handles the modality. Thresholds: per-modality `probes[]` entry, then the
/// `healthCheck` field, then the defaults above; staleness is three intervals.
pub fn plan(spec: &LLMProviderSpec) -> Option<ProbePlan> {
    let hc = spec.health_check.as_ref().filter(|h| h.enabled)?;
    let interval = duration::or(hc.interval.as_deref(), DEFAULT_INTERVAL).max(MIN_INTERVAL);
    let threshold = hc.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD);
    let latency = duration::or(hc.latency_threshold.as_deref(), DEFAULT_LATENCY_THRESHOLD);
    let timeout = duration::or(hc.timeout.as_deref(), DEFAULT_TIMEOUT);
    let mut modalities: Vec<Modality> = hc.modalities.clone();
    if modalities.is_empty() {
        for m in &spec.models {
            for modality in model_modalities(&m.modalities) {
                if !modalities.contains(modality) {
                    modalities.push(*modality);
                }
            }
        }
    }
    let upstream = |m: &switchyard_api::provider::ProviderModel| {
        m.upstream_name.clone().unwrap_or_else(|| m.name.clone())
    };
    let targets = modalities
        .into_iter()
        .map(|modality| {
            let settings = hc.probes.iter().find(|p| p.modality == modality);
            let model = match settings.and_then(|s| s.model.as_deref()) {
                Some(name) => spec.models.iter().find(|m| m.name == name).map(upstream),
                None => spec
                    .models
                    .iter()
                    .find(|m| model_modalities(&m.modalities).contains(&modality))
                    .map(upstream),
            };
            let latency = duration::or(
                settings.and_then(|s| s.latency_threshold.as_deref()),
                latency,
            );
            ProbeTarget {
                modality,
                model,
                voice: settings.and_then(|s| s.voice.clone()),
                timeout: duration::or(settings.and_then(|s| s.timeout.as_deref()), timeout),
                health: HealthConfig::for_interval(interval, threshold, latency),
            }
        })
        .collect();
    Some(ProbePlan { interval, targets })
}

/// The result of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// The modality probed.
    pub modality: Modality,
    /// The classified outcome.
    pub outcome: ProbeOutcome,
    /// HTTP status, when an answer came.
    pub status: Option<u16>,
    /// Time from sending to the end of the answer (or to the failure).
    pub elapsed: Duration,
}

/// A built probe request: API path, content type, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRequest {
    /// Path after `/v1`, e.g. `/embeddings`.
    pub path: &'static str,
    /// Content type of `body`.
    pub content_type: String,
    /// The request body.
    pub body: Bytes,
    /// Whether a success must be a JSON body.
    pub expects_json: bool,
}

/// A RIFF/WAVE file of `millis` ms of silence, 16 kHz mono 16-bit PCM.
pub fn silent_wav(millis: u32) -> Vec<u8> {
    const RATE: u32 = 16_000;
    let data_len = RATE / 1000 * millis * 2;
    let mut w = Vec::with_capacity(44 + data_len as usize);
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data_len).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes()); // fmt chunk length
    w.extend_from_slice(&1u16.to_le_bytes()); // PCM
    w.extend_from_slice(&1u16.to_le_bytes()); // mono
    w.extend_from_slice(&RATE.to_le_bytes());
    w.extend_from_slice(&(RATE * 2).to_le_bytes()); // bytes per second
    w.extend_from_slice(&2u16.to_le_bytes()); // block align
    w.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data_len.to_le_bytes());
    w.resize(44 + data_len as usize, 0);
    w
}

fn json_request(path: &'static str, body: &Value) -> ProbeRequest {
    ProbeRequest {
        path,
        content_type: "application/json".to_owned(),
        body: Bytes::from(body.to_string()),
        expects_json: true,
    }
}

/// The probe request of `target` for a provider of `kind`, or why none can be sent.
///
/// Errors: a description of the missing piece (no model, no voice, no endpoint for the
/// modality in this API kind); it is reported as a probe configuration problem.
pub fn build_request(kind: ProviderKind, target: &ProbeTarget) -> Result<ProbeRequest, String> {
    let model = target
        .model
        .as_deref()
        .ok_or_else(|| format!("no model of the provider serves {:?}", target.modality))?;
    let wav = || base64::engine::general_purpose::STANDARD.encode(silent_wav(PROBE_AUDIO_MILLIS));
    let png_url = || format!("data:image/png;base64,{PROBE_PNG_BASE64}");
    match (kind, target.modality) {
        (ProviderKind::OpenAi, Modality::Text) => Ok(json_request(
            "/chat/completions",
            &json!({"model": model, "max_tokens": 1,
                    "messages": [{"role": "user", "content": "ping"}]}),
        )),
        (ProviderKind::OpenAi, Modality::Image) => Ok(json_request(
            "/chat/completions",
            &json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "ping"},
                {"type": "image_url", "image_url": {"url": png_url()}}]}]}),
        )),
        (ProviderKind::OpenAi, Modality::Audio) => Ok(json_request(
            "/chat/completions",
            &json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "ping"},
                {"type": "input_audio", "input_audio": {"data": wav(), "format": "wav"}}]}]}),
        )),
        (ProviderKind::OpenAi, Modality::Embedding) => Ok(json_request(
            "/embeddings",
            &json!({"model": model, "input": ["ping"]}),
        )),
        (ProviderKind::OpenAi, Modality::Rerank) => Ok(json_request(
            "/rerank",
            &json!({"model": model, "query": "ping", "documents": ["pong"]}),
        )),
        (ProviderKind::OpenAi, Modality::Transcription) => {
            let request = crate::wire::transcription::TranscriptionRequest {
                model: model.to_owned(),
                audio_base64: wav(),
                mime_type: "audio/wav".to_owned(),
                file_name: "probe.wav".to_owned(),
                language: None,
                prompt: None,
                response_format: None,
                temperature: None,
            };
            Ok(ProbeRequest {
                path: "/audio/transcriptions",
                content_type: "application/json".to_owned(),
                body: request.to_json().map_err(|e| e.to_string())?,
                expects_json: true,
            })
        }
        (ProviderKind::OpenAi, Modality::Speech) => {
            let voice = target.voice.as_deref().ok_or_else(|| {
                "speech probes need healthCheck.probes[].voice (providers differ in voices and \
                 some have no default)"
                    .to_owned()
            })?;
            Ok(ProbeRequest {
                expects_json: false,
                ..json_request(
                    "/audio/speech",
                    &json!({"model": model, "input": "ok", "voice": voice}),
                )
            })
        }
        (ProviderKind::Anthropic, Modality::Text) => Ok(json_request(
            "/messages",
            &json!({"model": model, "max_tokens": 1,
                    "messages": [{"role": "user", "content": "ping"}]}),
        )),
        (ProviderKind::Anthropic, Modality::Image) => Ok(json_request(
            "/messages",
            &json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PROBE_PNG_BASE64}},
                {"type": "text", "text": "ping"}]}]}),
        )),
        (ProviderKind::Anthropic, m) => Err(format!(
            "the anthropic API has no endpoint for {m:?}; remove it from healthCheck.modalities"
        )),
    }
}

/// The provider's error message from an OpenAI- or Anthropic-shaped error body, else the
/// start of the body, cut to [`MAX_DETAIL`] characters.
fn error_detail(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("detail"))
        })
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    message.trim().chars().take(MAX_DETAIL).collect()
}

fn transport_detail(e: &TransportError, timeout: Duration) -> String {
    match e {
        TransportError::Timeout => format!("timed out after {} ms", timeout.as_millis()),
        other => other.to_string(),
    }
}

/// Sends one probe for `target` through `client` and classifies the answer. Never fails:
/// transport errors and timeouts are [`ProbeOutcome::Failure`]s, an unbuildable probe or a
/// shape-refusing 4xx a [`ProbeOutcome::ProbeRejected`].
pub async fn probe_once(client: &UpstreamClient, target: &ProbeTarget) -> ProbeResult {
    let result = |outcome, status, elapsed| ProbeResult {
        modality: target.modality,
        outcome,
        status,
        elapsed,
    };
    let kind = client.kind(target.model.as_deref().unwrap_or(""));
    let request = match build_request(kind, target) {
        Ok(r) => r,
        Err(detail) => {
            return result(
                ProbeOutcome::ProbeRejected {
                    status: None,
                    detail,
                },
                None,
                Duration::ZERO,
            );
        }
    };
    let Ok(content_type) = HeaderValue::try_from(request.content_type.as_str()) else {
        let detail = "probe content type is not a header value".to_owned();
        return result(
            ProbeOutcome::ProbeRejected {
                status: None,
                detail,
            },
            None,
            Duration::ZERO,
        );
    };
    let started = tokio::time::Instant::now();
    let exchange = async {
        // Chat and transcription probes go through the adapter (Vertex and Bedrock encode and
        // sign them; the OpenAI adapter writes the multipart upload); the other modalities call
        // their OpenAI-style path.
        let chat = match request.path {
            "/chat/completions" => Some(Operation::ChatCompletions),
            "/messages" => Some(Operation::Messages),
            "/audio/transcriptions" => Some(Operation::Transcription),
            _ => None,
        };
        let response = match chat {
            Some(op) => {
                let model = target.model.as_deref().unwrap_or("");
                client.send(op, model, request.body, false).await?
            }
            None => {
                client
                    .send_to_path(request.path, content_type, request.body, target.timeout)
                    .await?
            }
        };
        let status = response.status.as_u16();
        let body = response.collect(MAX_PROBE_BODY).await?;
        Ok::<_, TransportError>((status, body))
    };
    // The client's own timeout covers the body too; this outer bound also covers a
    // connection pool that cannot hand out a connection.
    let answered = tokio::time::timeout(target.timeout, exchange).await;
    let elapsed = started.elapsed();
    match answered {
        Err(_) => result(
            ProbeOutcome::Failure {
                detail: transport_detail(&TransportError::Timeout, target.timeout),
            },
            None,
            elapsed,
        ),
        Ok(Err(e)) => result(
            ProbeOutcome::Failure {
                detail: transport_detail(&e, target.timeout),
            },
            None,
            elapsed,
        ),
        Ok(Ok((status, body))) => {
            let outcome = if (200..300).contains(&status) {
                if request.expects_json && serde_json::from_slice::<Value>(&body).is_err() {
                    ProbeOutcome::Failure {
                        detail: format!("HTTP {status} with a body that is not JSON"),
                    }
                } else {
                    ProbeOutcome::Success { latency: elapsed }
                }
            } else {
                ProbeOutcome::from_status(status, elapsed, &error_detail(&body))
            };
            result(outcome, Some(status), elapsed)
        }
    }
}

/// Every target of `plan`, probed concurrently.
pub async fn probe_all(client: &UpstreamClient, plan: &ProbePlan) -> Vec<ProbeResult> {
    futures::future::join_all(plan.targets.iter().map(|t| probe_once(client, t))).await
}

/// One provider to probe: its key (`namespace/name`, the board's key), client and plan.
#[derive(Debug, Clone)]
pub struct ProbeJob {
    /// `namespace/name`.
    pub provider: String,
    /// The provider's upstream client (credentials, pool).
    pub client: UpstreamClient,
    /// What to probe and how often.
    pub plan: Arc<ProbePlan>,
}

/// Longest sleep of the loop between looks at `jobs`, so new or changed providers are picked
/// up within a second.
const MAX_TICK: Duration = Duration::from_secs(1);

/// Probes every job's targets on their interval, forever, recording each result on `board`
/// as it arrives. `jobs` is called on every tick and returns the providers to probe now (so a
/// configuration reload takes effect without restarting the loop); providers no longer listed
/// are dropped from the board (their traffic is then unfiltered, fail-open). One probe per
/// (provider, modality) is in flight at most; a probe slower than the interval delays the next.
/// Dropping the future cancels the probes in flight.
pub async fn run<F>(board: &HealthBoard, clock: Clock, jobs: F)
where
    F: Fn() -> Vec<ProbeJob>,
{
    type Key = (String, Modality);
    let mut next_due: HashMap<Key, switchyard_core::time::Instant> = HashMap::new();
    let mut in_flight: HashSet<Key> = HashSet::new();
    let mut tasks: JoinSet<(HealthConfig, ProbeResult)> = JoinSet::new();
    let mut task_keys: HashMap<tokio::task::Id, Key> = HashMap::new();
    loop {
        let current = jobs();
        let listed: HashSet<Key> = current
            .iter()
            .flat_map(|j| {
                j.plan
                    .targets
                    .iter()
                    .map(|t| (j.provider.clone(), t.modality))
            })
            .collect();
        board.retain(|provider, modality| listed.contains(&(provider.to_owned(), modality)));
        next_due.retain(|k, _| listed.contains(k));
        let now = clock.now();
        let mut tick = MAX_TICK;
        for job in &current {
            tick = tick.min(job.plan.interval);
            for target in &job.plan.targets {
                let key = (job.provider.clone(), target.modality);
                if in_flight.contains(&key) || next_due.get(&key).is_some_and(|due| *due > now) {
                    continue;
                }
                next_due.insert(key.clone(), now + job.plan.interval);
                in_flight.insert(key.clone());
                let client = job.client.clone();
                let target = target.clone();
                let handle = tasks.spawn(async move {
                    let result = probe_once(&client, &target).await;
                    (target.health, result)
                });
                task_keys.insert(handle.id(), key);
            }
        }
        tokio::select! {
            Some(done) = tasks.join_next_with_id() => {
                let id = match &done {
                    Ok((id, _)) => *id,
                    Err(e) => e.id(),
                };
                let Some(key) = task_keys.remove(&id) else { continue };
                in_flight.remove(&key);
                // A panicked probe (none is expected) records nothing; the next is due anyway.
                if let Ok((_, (cfg, result))) = done
                    && listed.contains(&key)
                {
                    board.record(&key.0, key.1, &cfg, &result.outcome, clock.now(), clock.wall());
                }
            }
            () = tokio::time::sleep(tick.max(MIN_INTERVAL)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: Value) -> LLMProviderSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn plan_disabled_or_absent_is_none() {
        let s = spec(json!({"api": "openai", "endpoint": "http://x", "models": [{"name": "m"}]}));
        assert_eq!(plan(&s), None);
        let s = spec(
            json!({"api": "openai", "endpoint": "http://x", "models": [{"name": "m"}],
                            "healthCheck": {"enabled": false}}),
        );
        assert_eq!(plan(&s), None);
    }

    #[test]
    fn plan_defaults_first_model_per_modality_and_overrides() {
        let s = spec(json!({"api": "openai", "endpoint": "http://x",
            "models": [
                {"name": "chat", "upstreamName": "chat-up"},
                {"name": "stt", "modalities": ["transcription"]},
                {"name": "tts-a", "modalities": ["speech"]},
                {"name": "tts-b", "modalities": ["speech"]}],
            "healthCheck": {"enabled": true, "interval": "20s", "failureThreshold": 2,
                "latencyThreshold": "2s",
                "probes": [{"modality": "speech", "model": "tts-b", "voice": "v2",
                            "latencyThreshold": "4s", "timeout": "3s"}]}}));
        let p = plan(&s).unwrap();
        assert_eq!(p.interval, Duration::from_secs(20));
        let modalities: Vec<Modality> = p.targets.iter().map(|t| t.modality).collect();
        assert_eq!(
            modalities,
            [Modality::Text, Modality::Transcription, Modality::Speech]
        );
        assert_eq!(p.targets[0].model.as_deref(), Some("chat-up"));
        assert_eq!(
            p.targets[0].health.latency_threshold,
            Duration::from_secs(2)
        );
        assert_eq!(p.targets[0].health.stale_after, Duration::from_secs(60));
        assert_eq!(p.targets[0].timeout, DEFAULT_TIMEOUT);
        assert_eq!(p.targets[1].model.as_deref(), Some("stt"));
        assert_eq!(p.targets[2].model.as_deref(), Some("tts-b"));
        assert_eq!(p.targets[2].voice.as_deref(), Some("v2"));
        assert_eq!(p.targets[2].timeout, Duration::from_secs(3));
        assert_eq!(
            p.targets[2].health.latency_threshold,
            Duration::from_secs(4)
        );
        assert_eq!(p.targets[2].health.failure_threshold, 2);
    }

    #[test]
    fn plan_explicit_modality_without_model_has_none() {
        let s = spec(
            json!({"api": "openai", "endpoint": "http://x", "models": [{"name": "m"}],
            "healthCheck": {"enabled": true, "modalities": ["embedding"]}}),
        );
        let p = plan(&s).unwrap();
        assert_eq!(p.targets.len(), 1);
        assert_eq!(p.targets[0].model, None);
        assert!(
            build_request(ProviderKind::OpenAi, &p.targets[0])
                .unwrap_err()
                .contains("no model")
        );
    }

    fn target(modality: Modality) -> ProbeTarget {
        ProbeTarget {
            modality,
            model: Some("m".into()),
            voice: None,
            timeout: DEFAULT_TIMEOUT,
            health: HealthConfig::default(),
        }
    }

    fn body(r: &ProbeRequest) -> Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn build_request_embedding_one_item_without_max_tokens() {
        let r = build_request(ProviderKind::OpenAi, &target(Modality::Embedding)).unwrap();
        assert_eq!(r.path, "/embeddings");
        let b = body(&r);
        assert_eq!(b["input"], json!(["ping"]));
        assert!(b.get("max_tokens").is_none());
    }

    #[test]
    fn build_request_text_one_token_in_each_dialect() {
        let r = build_request(ProviderKind::OpenAi, &target(Modality::Text)).unwrap();
        assert_eq!(r.path, "/chat/completions");
        assert_eq!(body(&r)["max_tokens"], 1);
        let r = build_request(ProviderKind::Anthropic, &target(Modality::Text)).unwrap();
        assert_eq!(r.path, "/messages");
        assert_eq!(body(&r)["max_tokens"], 1);
        assert!(build_request(ProviderKind::Anthropic, &target(Modality::Speech)).is_err());
    }

    #[test]
    fn build_request_speech_needs_voice_and_sends_it() {
        assert!(
            build_request(ProviderKind::OpenAi, &target(Modality::Speech))
                .unwrap_err()
                .contains("voice")
        );
        let mut t = target(Modality::Speech);
        t.voice = Some("v2".into());
        let r = build_request(ProviderKind::OpenAi, &t).unwrap();
        assert_eq!(r.path, "/audio/speech");
        assert_eq!(body(&r)["voice"], "v2");
        assert!(!r.expects_json);
    }

    #[test]
    fn build_request_transcription_is_the_internal_request_with_wav() {
        let r = build_request(ProviderKind::OpenAi, &target(Modality::Transcription)).unwrap();
        assert_eq!(r.path, "/audio/transcriptions");
        assert_eq!(r.content_type, "application/json");
        let req: crate::wire::transcription::TranscriptionRequest =
            serde_json::from_slice(&r.body).unwrap();
        assert_eq!(req.model, "m");
        assert_eq!(req.mime_type, "audio/wav");
        let wav = base64::engine::general_purpose::STANDARD
            .decode(&req.audio_base64)
            .unwrap();
        assert_eq!(wav, silent_wav(PROBE_AUDIO_MILLIS));
        // The OpenAI adapter turns it into the multipart upload with the clip.
        let (ct, body) = req.to_multipart().unwrap();
        assert!(ct.starts_with("multipart/form-data; boundary="));
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("name=\"model\"\r\n\r\nm\r\n"));
        assert!(text.contains("filename=\"probe.wav\""));
        assert!(text.contains("RIFF"));
    }

    #[test]
    fn silent_wav_is_riff_pcm_of_requested_length() {
        let w = silent_wav(250);
        assert_eq!(&w[..4], b"RIFF");
        assert_eq!(&w[8..16], b"WAVEfmt ");
        assert_eq!(w.len(), 44 + 8000);
        assert_eq!(u32::from_le_bytes([w[4], w[5], w[6], w[7]]), 36 + 8000);
    }

    #[test]
    fn error_detail_reads_vendor_error_message() {
        assert_eq!(
            error_detail(
                br#"{"error":{"message":"Unknown voice 'v9'","type":"invalid_request_error"}}"#
            ),
            "Unknown voice 'v9'"
        );
        assert_eq!(error_detail(b"plain text"), "plain text");
        assert_eq!(error_detail(&[b'x'; 500]).len(), MAX_DETAIL);
    }
}
