//! `api: openai`: OpenAI and OpenAI-compatible servers (vLLM, Azure-style gateways, Groq…).
//!
//! Paths `{base}/v1/chat/completions`, `/v1/embeddings`, `/v1/rerank`, `/v1/audio/transcriptions`
//! (a base URL that already ends in `/v1` is not doubled), `Authorization: Bearer <key>` (omitted when no key is set).
//! Bodies and responses are the OpenAI dialect itself, so nothing is re-encoded except the
//! internal transcription request, which becomes OpenAI's multipart upload again; usage comes
//! from `usage` (with `prompt_tokens_details.cached_tokens`), read by the dispatcher.

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use switchyard_api::provider::ProviderApi;

use crate::adapter::{Adapter, BoxFuture, Call, Prepared};
use crate::upstream::{Operation, ProviderKind, TransportError};
use crate::wire::transcription::TranscriptionRequest;

/// The OpenAI adapter.
pub struct OpenAi {
    base: String,
    /// Parsed URL of each operation (by [`Operation::ALL`] position), built once: formatting
    /// and re-parsing it per request showed in profiles.
    urls: [Option<reqwest::Url>; 5],
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAi")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// `{base}/v1{path}`, with a trailing `/` or `/v1` of the base not doubled.
pub fn v1_url(base: &str, path: &str) -> String {
    let base = base.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    format!("{base}/v1{path}")
}

/// JSON content type and `accept` for SSE or JSON.
pub fn json_headers(stream: bool) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        ACCEPT,
        HeaderValue::from_static(if stream {
            "text/event-stream"
        } else {
            "application/json"
        }),
    );
    h
}

/// `value` as a header value marked sensitive.
///
/// Errors: [`TransportError::Config`] naming `what` when it is not a valid header value.
pub fn secret_header(value: &str, what: &str) -> Result<HeaderValue, TransportError> {
    let mut v = HeaderValue::try_from(value)
        .map_err(|_| TransportError::Config(format!("{what} is not a valid header value")))?;
    v.set_sensitive(true);
    Ok(v)
}

impl OpenAi {
    /// An adapter for the server at `base` with API key `key` (empty: no `Authorization`).
    ///
    /// Errors: a key that is not a valid header value.
    pub fn new(base: &str, key: String) -> Result<Self, String> {
        let auth = if key.is_empty() {
            None
        } else {
            Some(secret_header(&format!("Bearer {key}"), "api key").map_err(|e| e.to_string())?)
        };
        let urls = Operation::ALL.map(|op| {
            op.served_by(ProviderKind::OpenAi)
                .then(|| reqwest::Url::parse(&v1_url(base, op.path())).ok())
                .flatten()
        });
        Ok(OpenAi {
            base: base.to_owned(),
            urls,
            auth,
        })
    }

    fn headers(&self, stream: bool) -> HeaderMap {
        let mut h = json_headers(stream);
        if let Some(a) = &self.auth {
            h.insert(AUTHORIZATION, a.clone());
        }
        h
    }
}

impl OpenAi {
    /// `/v1/audio/transcriptions`: the internal request re-encoded as OpenAI's multipart
    /// upload ([`TranscriptionRequest::to_multipart`]), with its own content type.
    fn transcription(&self, url: reqwest::Url, body: &[u8]) -> Result<Prepared, TransportError> {
        let request: TranscriptionRequest = serde_json::from_slice(body).map_err(|e| {
            TransportError::Config(format!("transcription body does not parse: {e}"))
        })?;
        let (content_type, body) = request.to_multipart().map_err(TransportError::Config)?;
        let mut headers = self.headers(false);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::try_from(content_type)
                .map_err(|_| TransportError::Config("multipart boundary".to_owned()))?,
        );
        Ok(Prepared { url, headers, body })
    }
}

impl Adapter for OpenAi {
    fn api(&self) -> ProviderApi {
        ProviderApi::Openai
    }

    fn kind(&self, _model: &str) -> ProviderKind {
        ProviderKind::OpenAi
    }

    fn serves(&self, op: Operation, _model: &str) -> bool {
        op.served_by(ProviderKind::OpenAi)
    }

    fn prepare<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Prepared, TransportError>> {
        let position = Operation::ALL.iter().position(|o| *o == call.op);
        let url = position.and_then(|i| self.urls[i].clone()).ok_or_else(|| {
            TransportError::Config(format!(
                "{:?} is not served by an openai provider at {}",
                call.op, self.base
            ))
        });
        let prepared = url.and_then(|url| {
            if call.op == Operation::Transcription {
                return self.transcription(url, &call.body);
            }
            Ok(Prepared {
                url,
                headers: self.headers(call.stream),
                body: call.body,
            })
        });
        Box::pin(async move { prepared })
    }

    fn prepare_path(&self, path: &str, body: Bytes) -> Result<Prepared, TransportError> {
        let url = reqwest::Url::parse(&v1_url(&self.base, path))
            .map_err(|e| TransportError::Config(format!("invalid provider URL: {e}")))?;
        Ok(Prepared {
            url,
            headers: self.headers(false),
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn prepared(a: &dyn Adapter, op: Operation, stream: bool) -> Prepared {
        a.prepare(Call {
            op,
            model: "m",
            stream,
            body: Bytes::from_static(b"{}"),
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn url_base_with_or_without_v1_is_not_doubled() {
        let a = OpenAi::new("https://api.example.invalid/v1/", "sk-test".into()).unwrap();
        let p = prepared(&a, Operation::ChatCompletions, true).await;
        assert_eq!(
            p.url.as_str(),
            "https://api.example.invalid/v1/chat/completions"
        );
        assert_eq!(p.headers[AUTHORIZATION], "Bearer sk-test");
        assert!(p.headers[AUTHORIZATION].is_sensitive());
        assert_eq!(p.headers[ACCEPT], "text/event-stream");
        let a =
            crate::anthropic::Anthropic::new("https://api.example.invalid", "sk-a".into()).unwrap();
        let p = prepared(&a, Operation::Messages, false).await;
        assert_eq!(p.url.as_str(), "https://api.example.invalid/v1/messages");
        assert!(p.headers["x-api-key"].is_sensitive());
        assert_eq!(
            p.headers["anthropic-version"],
            crate::wire::anthropic::API_VERSION
        );
        assert!(p.headers.get(AUTHORIZATION).is_none());
    }

    #[tokio::test]
    async fn operation_of_other_kind_is_config_error() {
        let a = crate::anthropic::Anthropic::new("https://a.invalid", "k".into()).unwrap();
        let r = a
            .prepare(Call {
                op: Operation::Embeddings,
                model: "m",
                stream: false,
                body: Bytes::new(),
            })
            .await;
        assert!(matches!(r, Err(TransportError::Config(_))));
    }

    #[tokio::test]
    async fn transcription_is_reencoded_as_multipart_with_its_content_type() {
        let a = OpenAi::new("https://stt.example.invalid", "sk-test".into()).unwrap();
        let internal = TranscriptionRequest {
            model: "whisper-large-v3".into(),
            audio_base64: "UklGRg==".into(),
            mime_type: "audio/wav".into(),
            file_name: "a.wav".into(),
            language: None,
            prompt: Some("QANT".into()),
            response_format: Some("text".into()),
            temperature: None,
        };
        let p = a
            .prepare(Call {
                op: Operation::Transcription,
                model: "whisper-large-v3",
                stream: false,
                body: internal.to_json().unwrap(),
            })
            .await
            .unwrap();
        assert_eq!(
            p.url.as_str(),
            "https://stt.example.invalid/v1/audio/transcriptions"
        );
        let ct = p.headers[CONTENT_TYPE].to_str().unwrap().to_owned();
        let boundary = ct.strip_prefix("multipart/form-data; boundary=").unwrap();
        let body = String::from_utf8_lossy(&p.body);
        assert!(body.starts_with(&format!("--{boundary}\r\n")));
        assert!(body.contains("name=\"model\"\r\n\r\nwhisper-large-v3\r\n"));
        assert!(body.contains("name=\"prompt\"\r\n\r\nQANT\r\n"));
        assert!(body.contains("name=\"response_format\"\r\n\r\njson\r\n"));
        assert!(body.contains("filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n"));
        assert_eq!(p.headers[AUTHORIZATION], "Bearer sk-test");
        // A body that is not the internal request is a configuration error, nothing sent.
        let bad = a
            .prepare(Call {
                op: Operation::Transcription,
                model: "m",
                stream: false,
                body: Bytes::from_static(b"--raw multipart--"),
            })
            .await;
        assert!(matches!(bad, Err(TransportError::Config(_))));
    }

    #[test]
    fn debug_redacts_api_key() {
        let a = OpenAi::new("https://a.invalid", "sk-secret".into()).unwrap();
        assert!(!format!("{a:?}").contains("sk-secret"));
    }
}
