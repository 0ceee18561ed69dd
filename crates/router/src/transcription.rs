//! `POST /v1/audio/transcriptions`: OpenAI's multipart upload parsed into the internal
//! [`TranscriptionRequest`], its quota estimate, and the answer in the client's
//! `response_format` (seed 003: speech to text on Gemini per region, and on OpenAI-compatible
//! servers).
//!
//! **Fields** (<https://platform.openai.com/docs/api-reference/audio/createTranscription>):
//! `file` (required; its format is known by the file name's extension, else by the part's
//! `Content-Type`: flac, m4a, mp3, mp4, mpeg, mpga, oga, ogg, wav, webm, aac, aiff), `model`
//! (required), `language`, `prompt`, `response_format` (`json`, the default, or `text`),
//! `temperature` (0 to 1). Refused with a 400 naming the field: `response_format`
//! `verbose_json`, `srt`, `vtt` (segments and timestamps that Gemini does not return),
//! `timestamp_granularities[]` and `include[]` (which need them), `stream: true`. Other
//! fields are ignored. The body is read within the router's body limit before it is parsed.
//!
//! **Estimate** (what the broker reserves before sending; the provider's reported usage is
//! charged afterwards): audio counts [`AUDIO_TOKENS_PER_SECOND`] tokens per second, Gemini's
//! published rate. The duration is read from a WAV header; for compressed formats it is
//! assumed from [`ASSUMED_COMPRESSED_BYTES_PER_SECOND`] (32 kbit/s, the low end of speech
//! codecs, so the estimate errs high and the excess is credited back). The prompt adds a
//! token per four bytes, the instruction [`INSTRUCTION_TOKENS`]. The output allowance is
//! [`OUTPUT_TOKENS_PER_SECOND`] per second of audio plus [`OUTPUT_TOKENS_BASE`] (fast speech
//! is about four words a second). The route's calibration ratio is not applied: it learns
//! text tokenizer error, which says nothing about audio.
//!
//! **Usage** of the answer: `usage.type: tokens` (`input_tokens`, `output_tokens`: OpenAI's
//! gpt-4o transcribe models, and Gemini through the Vertex adapter) is charged as reported;
//! `usage.type: duration` (`seconds`, whisper-1) is charged as input tokens at
//! [`AUDIO_TOKENS_PER_SECOND`]; no usage means the estimate is charged.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::Value;

use crate::estimate::Estimate;
use crate::request::ApiError;
use crate::wire::transcription::{TranscriptionRequest, mime_for_file_name};
use crate::wire::usage::{NormalizedUsage, UsageSource};

/// Tokens per second of audio (Gemini: "each second of audio is represented as 32 tokens").
pub const AUDIO_TOKENS_PER_SECOND: u64 = 32;
/// Bytes per second assumed for audio whose duration cannot be read (32 kbit/s).
pub const ASSUMED_COMPRESSED_BYTES_PER_SECOND: u64 = 4_000;
/// Tokens of the transcription instruction the Vertex adapter adds.
pub const INSTRUCTION_TOKENS: u64 = 48;
/// Output tokens allowed per second of audio.
pub const OUTPUT_TOKENS_PER_SECOND: u64 = 6;
/// Output tokens allowed on top of the per-second allowance.
pub const OUTPUT_TOKENS_BASE: u64 = 16;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// Parses the multipart upload `body` (already bounded by the body limit) sent with
/// `content_type` into the internal request. Returns the request as a JSON object (the
/// dispatcher's [`crate::request::ClientBody::Json`]) and the duration of the audio in
/// seconds (read from a WAV header, else assumed; see the module docs).
///
/// Errors: a 400 `invalid_request` naming the field that is missing or invalid, or saying
/// the body is not `multipart/form-data`.
pub async fn parse(
    content_type: Option<&str>,
    body: Bytes,
) -> Result<(serde_json::Map<String, Value>, f64), ApiError> {
    let not_multipart = || {
        invalid(
            "the request body must be multipart/form-data with the fields `file` and `model` \
             (OpenAI's audio transcription upload)",
        )
    };
    let content_type = content_type.ok_or_else(not_multipart)?;
    if !content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        return Err(not_multipart());
    }
    let boundary = multer::parse_boundary(content_type).map_err(|e| {
        invalid(format!(
            "the multipart/form-data content type is invalid: {e}"
        ))
    })?;
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    let malformed = |e: multer::Error| invalid(format!("the multipart body is malformed: {e}"));

    let mut model: Option<String> = None;
    let mut file: Option<(Bytes, Option<String>, Option<String>)> = None;
    let mut language = None;
    let mut prompt = None;
    let mut response_format = None;
    let mut temperature = None;
    while let Some(field) = form.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or_default().to_owned();
        if name == "file" {
            let file_name = field.file_name().map(str::to_owned);
            let part_type = field.content_type().map(|m| m.essence_str().to_owned());
            let data = field.bytes().await.map_err(malformed)?;
            file = Some((data, file_name, part_type));
            continue;
        }
        let text = field.text().await.map_err(malformed)?;
        match name.as_str() {
            "model" => model = Some(text),
            "language" => language = Some(text).filter(|t| !t.is_empty()),
            "prompt" => prompt = Some(text).filter(|t| !t.is_empty()),
            "response_format" => response_format = Some(text),
            "temperature" => {
                let t: f64 = text.trim().parse().map_err(|_| {
                    invalid(format!("`temperature` must be a number, got {text:?}"))
                })?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(invalid(format!(
                        "`temperature` must be between 0 and 1, got {t}"
                    )));
                }
                temperature = Some(t);
            }
            "stream" if text.trim() == "true" => {
                return Err(invalid(
                    "`stream` is not supported for transcriptions here; omit it or send false",
                ));
            }
            n if n.starts_with("timestamp_granularities") || n.starts_with("include") => {
                return Err(invalid(format!(
                    "`{n}` is not supported: it needs segments, timestamps or log probabilities, \
                     which not every provider of this route returns"
                )));
            }
            _ => {}
        }
    }
    let model = model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| invalid("`model` is required"))?;
    let (audio, file_name, part_type) = file.ok_or_else(|| {
        invalid("`file` is required: the audio file to transcribe, as a file part")
    })?;
    if audio.is_empty() {
        return Err(invalid("`file` is empty"));
    }
    match response_format.as_deref() {
        None | Some("json" | "text") => {}
        Some(other) => {
            return Err(invalid(format!(
                "`response_format` {other:?} is not supported: use `json` or `text`"
            )));
        }
    }
    let file_name = file_name.unwrap_or_else(|| "audio".to_owned());
    let mime_type = match mime_for_file_name(&file_name) {
        "application/octet-stream" => part_type
            .filter(|t| t.starts_with("audio/") || t.starts_with("video/"))
            .ok_or_else(|| {
                invalid(format!(
                    "`file` {file_name:?} is of an unknown format: name it with one of the \
                     extensions flac, m4a, mp3, mp4, mpeg, mpga, oga, ogg, wav, webm, aac, aiff, \
                     or send the part with an audio/* Content-Type"
                ))
            })?,
        known => known.to_owned(),
    };
    let seconds = wav_seconds(&audio).unwrap_or_else(|| {
        u64::try_from(audio.len()).unwrap_or(u64::MAX) as f64
            / ASSUMED_COMPRESSED_BYTES_PER_SECOND as f64
    });
    let request = TranscriptionRequest {
        model,
        audio_base64: base64::engine::general_purpose::STANDARD.encode(&audio),
        mime_type,
        file_name,
        language,
        prompt,
        response_format,
        temperature,
    };
    match serde_json::to_value(&request) {
        Ok(Value::Object(map)) => Ok((map, seconds)),
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the transcription request could not be encoded",
        )),
    }
}

/// Duration of a RIFF/WAVE file in seconds from its `fmt ` byte rate and `data` chunk size;
/// `None` when `bytes` is not such a file.
pub fn wav_seconds(bytes: &[u8]) -> Option<f64> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let mut pos = 12;
    let mut byte_rate: Option<u32> = None;
    while pos + 8 <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().ok()?);
        let body = pos + 8;
        if id == b"fmt " && body + 12 <= bytes.len() {
            byte_rate = Some(u32::from_le_bytes(
                bytes[body + 8..body + 12].try_into().ok()?,
            ));
        } else if id == b"data" {
            let rate = byte_rate.filter(|r| *r > 0)?;
            // A streamed WAV may carry a placeholder length: count what is there.
            let available = bytes.len() - body;
            let len = usize::try_from(len).ok()?.min(available);
            return Some(len as f64 / f64::from(rate));
        }
        pos = body + usize::try_from(len).ok()? + (len as usize & 1);
    }
    None
}

/// The estimate of a transcription of `seconds` of audio with `prompt` (module docs).
pub fn estimate(seconds: f64, prompt: Option<&str>) -> Estimate {
    let secs = seconds.max(0.0).ceil();
    // `secs` is a whole non-negative number; far below u64::MAX for any body within limits.
    let whole = if secs.is_finite() && secs < 1e12 {
        secs as u64
    } else {
        u64::MAX / 1024
    };
    let prompt_tokens = prompt.map_or(0, |p| u64::try_from(p.len() / 4).unwrap_or(u64::MAX));
    let input = whole
        .saturating_mul(AUDIO_TOKENS_PER_SECOND)
        .saturating_add(prompt_tokens)
        .saturating_add(INSTRUCTION_TOKENS)
        .max(1);
    Estimate {
        raw_input_tokens: input,
        input_tokens: input,
        output_tokens: whole
            .saturating_mul(OUTPUT_TOKENS_PER_SECOND)
            .saturating_add(OUTPUT_TOKENS_BASE),
        spend_micro_usd: 0,
        // Not a tokenizer count: never used to calibrate the route's text estimates.
        bounded_bytes: 0,
    }
}

/// Reads the adapter's JSON answer: checks it has a `text` string and returns its usage
/// (module docs), `None` when it reports none.
///
/// Errors: the body is not JSON or has no `text` string.
pub fn usage_of(body: &[u8]) -> Result<Option<NormalizedUsage>, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("provider response does not parse: {e}"))?;
    if !v.get("text").is_some_and(Value::is_string) {
        return Err("provider transcription response has no `text` string".to_owned());
    }
    let Some(usage) = v.get("usage") else {
        return Ok(None);
    };
    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
    let reported = |input: u64, output: u64| NormalizedUsage {
        input_uncached: input,
        cache_read: 0,
        cache_write: 0,
        output,
        source: UsageSource::Reported,
    };
    Ok(match usage.get("type").and_then(Value::as_str) {
        Some("duration") => {
            let secs = usage.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
            let secs = if secs.is_finite() && secs > 0.0 && secs < 1e12 {
                secs.ceil() as u64
            } else {
                0
            };
            Some(reported(secs.saturating_mul(AUDIO_TOKENS_PER_SECOND), 0))
        }
        _ if usage.get("input_tokens").is_some() => {
            Some(reported(n("input_tokens"), n("output_tokens")))
        }
        _ => None,
    })
}

/// The client's response for the adapter's JSON answer `body`: the JSON itself for
/// `response_format: json` (the default), the transcript as `text/plain` for `text`.
pub fn client_response(request: &serde_json::Map<String, Value>, body: Bytes) -> Response {
    let wants_text = request.get("response_format").and_then(Value::as_str) == Some("text");
    let (bytes, content_type) = if wants_text {
        let text = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default();
        (Bytes::from(text), "text/plain; charset=utf-8")
    } else {
        (body, "application/json")
    };
    let mut response = Response::new(Body::from(bytes));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDARY: &str = "xYzBoundary";

    fn form(fields: &[(&str, &str)], file: Option<(&str, &[u8], &str)>) -> Bytes {
        let mut b = Vec::new();
        for (k, v) in fields {
            b.extend_from_slice(
                format!(
                    "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"
                )
                .as_bytes(),
            );
        }
        if let Some((name, data, ct)) = file {
            b.extend_from_slice(
                format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: {ct}\r\n\r\n").as_bytes(),
            );
            b.extend_from_slice(data);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
        Bytes::from(b)
    }

    fn ct() -> Option<&'static str> {
        Some("multipart/form-data; boundary=xYzBoundary")
    }

    fn wav(seconds: u32) -> Vec<u8> {
        switchyard_providers::probe::silent_wav(seconds * 1000)
    }

    #[tokio::test]
    async fn parses_every_field_and_reads_the_wav_duration() {
        let audio = wav(3);
        let body = form(
            &[
                ("model", "stt"),
                ("language", "ja"),
                ("prompt", "QANT"),
                ("response_format", "text"),
                ("temperature", "0.5"),
                ("unknown_field", "ignored"),
            ],
            Some(("call.wav", &audio, "application/octet-stream")),
        );
        let (map, seconds) = parse(ct(), body).await.unwrap();
        assert!((seconds - 3.0).abs() < 1e-9, "{seconds}");
        let r: TranscriptionRequest = serde_json::from_value(Value::Object(map)).unwrap();
        assert_eq!(r.model, "stt");
        assert_eq!(r.mime_type, "audio/wav");
        assert_eq!(r.file_name, "call.wav");
        assert_eq!(r.language.as_deref(), Some("ja"));
        assert_eq!(r.prompt.as_deref(), Some("QANT"));
        assert_eq!(r.response_format.as_deref(), Some("text"));
        assert_eq!(r.temperature, Some(0.5));
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&r.audio_base64)
            .unwrap();
        assert_eq!(decoded, audio);
    }

    async fn error(content_type: Option<&str>, body: Bytes) -> String {
        let e = parse(content_type, body).await.unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, "invalid_request");
        e.message
    }

    #[tokio::test]
    async fn missing_or_invalid_fields_are_400s_naming_the_field() {
        let audio = wav(1);
        let file = Some(("a.wav", audio.as_slice(), "audio/wav"));
        assert!(error(ct(), form(&[], file)).await.contains("`model`"));
        assert!(
            error(ct(), form(&[("model", "m")], None))
                .await
                .contains("`file`")
        );
        assert!(
            error(
                ct(),
                form(&[("model", "m"), ("response_format", "verbose_json")], file)
            )
            .await
            .contains("`response_format`")
        );
        assert!(
            error(ct(), form(&[("model", "m"), ("temperature", "2")], file))
                .await
                .contains("`temperature`")
        );
        assert!(
            error(ct(), form(&[("model", "m"), ("temperature", "hot")], file))
                .await
                .contains("`temperature`")
        );
        assert!(
            error(ct(), form(&[("model", "m"), ("stream", "true")], file))
                .await
                .contains("`stream`")
        );
        assert!(
            error(
                ct(),
                form(&[("model", "m")], Some(("a.xyz", b"data", "text/plain")))
            )
            .await
            .contains("unknown format")
        );
        assert!(
            error(Some("application/json"), Bytes::from_static(b"{}"))
                .await
                .contains("multipart/form-data")
        );
        assert!(
            error(None, Bytes::new())
                .await
                .contains("multipart/form-data")
        );
        assert!(
            error(ct(), Bytes::from_static(b"--xYzBoundary\r\ngarbage"))
                .await
                .contains("malformed")
        );
    }

    #[tokio::test]
    async fn unknown_extension_takes_an_audio_part_type() {
        let body = form(&[("model", "m")], Some(("blob", b"ID3....", "audio/mpeg")));
        let (map, seconds) = parse(ct(), body).await.unwrap();
        assert_eq!(map["mime_type"], "audio/mpeg");
        // 7 bytes at the assumed 4000 B/s.
        assert!((seconds - 7.0 / 4000.0).abs() < 1e-12);
    }

    #[test]
    fn estimate_counts_audio_seconds_prompt_and_output_allowance() {
        let e = estimate(10.0, Some("twelve bytes"));
        assert_eq!(e.input_tokens, 10 * 32 + 3 + INSTRUCTION_TOKENS);
        assert_eq!(e.output_tokens, 10 * 6 + 16);
        // A quarter second counts as one second.
        assert_eq!(estimate(0.25, None).input_tokens, 32 + INSTRUCTION_TOKENS);
    }

    #[test]
    fn wav_duration_from_header() {
        assert_eq!(wav_seconds(&wav(2)), Some(2.0));
        assert_eq!(wav_seconds(b"ID3 not a wav"), None);
    }

    #[test]
    fn usage_in_tokens_or_duration() {
        let tokens = usage_of(br#"{"text":"hi","usage":{"type":"tokens","input_tokens":70,"output_tokens":5,"total_tokens":75}}"#)
            .unwrap()
            .unwrap();
        assert_eq!((tokens.input_uncached, tokens.output), (70, 5));
        assert_eq!(tokens.source, UsageSource::Reported);
        let duration = usage_of(br#"{"text":"hi","usage":{"type":"duration","seconds":2.5}}"#)
            .unwrap()
            .unwrap();
        assert_eq!((duration.input_uncached, duration.output), (96, 0));
        assert_eq!(usage_of(br#"{"text":""}"#).unwrap(), None);
        assert!(usage_of(br#"{"nope":1}"#).is_err());
    }

    #[tokio::test]
    async fn text_format_is_plain_text() {
        let mut req = serde_json::Map::new();
        req.insert("response_format".into(), Value::from("text"));
        let r = client_response(&req, Bytes::from_static(br#"{"text":"hello world"}"#));
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        let body = axum::body::to_bytes(r.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"hello world");
        let r = client_response(
            &serde_json::Map::new(),
            Bytes::from_static(br#"{"text":"x"}"#),
        );
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
    }
}
