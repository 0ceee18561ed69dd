//! Speech to text: the internal request the router hands to an adapter for
//! [`crate::upstream::Operation::Transcription`], and its encoding as OpenAI's
//! `multipart/form-data` upload.
//!
//! The client sends OpenAI's multipart form (`file`, `model`, `language`, `prompt`,
//! `response_format`, `temperature`; <https://platform.openai.com/docs/api-reference/audio/createTranscription>).
//! The router parses it once into [`TranscriptionRequest`], a small JSON object that goes
//! through dispatch like an embeddings body (only `model` is replaced per provider); each
//! adapter then encodes it for its API: the OpenAI adapter as a multipart form again
//! ([`TranscriptionRequest::to_multipart`]), the Vertex adapter as a Gemini
//! `generateContent` with the audio as `inlineData`
//! ([`crate::vertex::gemini::encode_transcription`]).
//!
//! Every adapter answers in one shape, `{"text": "...", "usage": {...}}` (OpenAI's `json`
//! response format); the router turns it into `text/plain` when the client asked for
//! `response_format: text`. Upstream the OpenAI adapter therefore always asks for `json`.
//!
//! Rejected: forwarding the client's multipart bytes untouched to OpenAI-compatible servers
//! (the model must be replaced per provider, and Gemini needs the audio anyway, so one parse
//! serves both); holding the audio as raw bytes in the internal body (it is JSON like every
//! other body the dispatcher passes around; base64 costs a third more memory for the life of
//! one request).

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One transcription request, as the router hands it to an adapter (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptionRequest {
    /// Upstream model name (replaced by the dispatcher per provider).
    pub model: String,
    /// The audio file's bytes, standard base64.
    pub audio_base64: String,
    /// Media type of the audio (`audio/wav`, `audio/mpeg`, …), from the upload's part header
    /// or the file name's extension.
    pub mime_type: String,
    /// File name of the upload (OpenAI-compatible servers use its extension to pick a decoder).
    pub file_name: String,
    /// ISO-639-1 language of the speech, when the client gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Spelling and style hints, or the previous segment's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The client's `response_format` (`json` or `text`); adapters always ask upstream for
    /// JSON, the router renders the client's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<String>,
    /// Sampling temperature, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
}

/// Media type of an audio file by its extension (the formats OpenAI's endpoint accepts, plus
/// the ones Gemini lists), `application/octet-stream` when unknown.
pub fn mime_for_file_name(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "wav" => "audio/wav",
        "mp3" | "mpga" | "mpeg" => "audio/mpeg",
        "m4a" | "mp4" => "audio/mp4",
        "ogg" | "oga" => "audio/ogg",
        "flac" => "audio/flac",
        "webm" => "audio/webm",
        "aac" => "audio/aac",
        "aiff" | "aif" => "audio/aiff",
        _ => "application/octet-stream",
    }
}

impl TranscriptionRequest {
    /// The request as JSON bytes.
    ///
    /// Errors: none in practice (every member serialises); the serde error otherwise.
    pub fn to_json(&self) -> Result<Bytes, serde_json::Error> {
        serde_json::to_vec(self).map(Bytes::from)
    }

    /// The request as OpenAI's `multipart/form-data` upload: `(content type with boundary,
    /// body)`. Fields `model`, `file` (with its file name and media type), `response_format:
    /// json`, and `language`, `prompt`, `temperature` when set. The boundary is random and
    /// checked not to occur in the audio (RFC 7578 §4.1).
    ///
    /// Errors: `audio_base64` is not base64.
    pub fn to_multipart(&self) -> Result<(String, Bytes), String> {
        let audio = base64::engine::general_purpose::STANDARD
            .decode(&self.audio_base64)
            .map_err(|e| format!("audio_base64 is not base64: {e}"))?;
        let boundary = loop {
            let b = format!("switchyard-{:032x}", rand::random::<u128>());
            if !contains(&audio, b.as_bytes()) {
                break b;
            }
        };
        let mut body = Vec::with_capacity(audio.len() + 1024);
        let mut field = |name: &str, value: &str| {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
                )
                .as_bytes(),
            );
        };
        field("model", &self.model);
        field("response_format", "json");
        if let Some(l) = &self.language {
            field("language", l);
        }
        if let Some(p) = &self.prompt {
            field("prompt", p);
        }
        if let Some(t) = self.temperature {
            field("temperature", &t.to_string());
        }
        let file_name = quoted(&self.file_name);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\nContent-Type: {}\r\n\r\n",
                self.mime_type
            )
            .as_bytes(),
        );
        body.extend_from_slice(&audio);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        Ok((
            format!("multipart/form-data; boundary={boundary}"),
            Bytes::from(body),
        ))
    }
}

/// A file name safe inside a quoted `filename=` parameter (quotes, backslashes and line
/// breaks replaced, as browsers do).
fn quoted(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '"' | '\\' | '\r' | '\n' => '_',
            c => c,
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> TranscriptionRequest {
        TranscriptionRequest {
            model: "whisper-1".into(),
            audio_base64: base64::engine::general_purpose::STANDARD.encode(b"RIFF\x00\x01audio"),
            mime_type: "audio/wav".into(),
            file_name: "call \"7\".wav".into(),
            language: Some("ja".into()),
            prompt: None,
            response_format: Some("text".into()),
            temperature: Some(0.2),
        }
    }

    #[test]
    fn multipart_has_every_field_and_the_audio_bytes() {
        let (ct, body) = request().to_multipart().unwrap();
        let boundary = ct
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap()
            .to_owned();
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.ends_with(&format!("\r\n--{boundary}--\r\n")));
        assert!(text.contains("name=\"model\"\r\n\r\nwhisper-1\r\n"));
        // Upstream always answers JSON; the router renders the client's format.
        assert!(text.contains("name=\"response_format\"\r\n\r\njson\r\n"));
        assert!(text.contains("name=\"language\"\r\n\r\nja\r\n"));
        assert!(text.contains("name=\"temperature\"\r\n\r\n0.2\r\n"));
        assert!(!text.contains("name=\"prompt\""));
        assert!(text.contains(
            "name=\"file\"; filename=\"call _7_.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\u{0}\u{1}audio\r\n"
        ));
    }

    #[test]
    fn json_round_trips_and_bad_base64_is_an_error() {
        let r = request();
        let back: TranscriptionRequest = serde_json::from_slice(&r.to_json().unwrap()).unwrap();
        assert_eq!(back, r);
        let bad = TranscriptionRequest {
            audio_base64: "not base64!".into(),
            ..r
        };
        assert!(bad.to_multipart().unwrap_err().contains("audio_base64"));
    }

    #[test]
    fn mime_by_extension() {
        assert_eq!(mime_for_file_name("a.WAV"), "audio/wav");
        assert_eq!(mime_for_file_name("a.mp3"), "audio/mpeg");
        assert_eq!(mime_for_file_name("noext"), "application/octet-stream");
    }
}
