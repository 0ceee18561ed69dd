//! Audio helpers of the mock: reading the fields of a `multipart/form-data` upload (the
//! transcription endpoint's body) and writing a silent WAV (the speech endpoint's answer).
//!
//! The multipart reader is deliberately small: it splits on the boundary (RFC 7578 / RFC 2046
//! §5.1.1), reads each part's `Content-Disposition` name and keeps text fields as strings and
//! file parts as their length. It does not stream, decode transfer encodings or handle nested
//! multiparts — no vendor SDK sends those to this endpoint, and a full parser (multer) would be
//! a new dependency for a mock that only needs two fields.

use serde_json::{Map, Value};

/// The fields of a multipart body as a JSON object: text fields as strings, and for each file
/// part `<name>_bytes` (its length in bytes). `None` when the content type is not multipart
/// with a boundary, or the body has no part.
pub(crate) fn multipart_fields(content_type: &str, body: &[u8]) -> Option<Value> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })?;
    let delimiter = format!("--{boundary}");
    let mut fields = Map::new();
    for raw in split(body, delimiter.as_bytes()).into_iter().skip(1) {
        // After the last delimiter comes `--`.
        if raw.starts_with(b"--") {
            break;
        }
        let raw = raw.strip_prefix(b"\r\n").unwrap_or(raw);
        let Some(split_at) = find(raw, b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&raw[..split_at]);
        let content = &raw[split_at + 4..];
        let content = content.strip_suffix(b"\r\n").unwrap_or(content);
        let disposition = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .unwrap_or("");
        let Some(name) = param(disposition, "name") else {
            continue;
        };
        if param(disposition, "filename").is_some() {
            fields.insert(format!("{name}_bytes"), Value::from(content.len()));
        } else {
            fields.insert(
                name,
                Value::String(String::from_utf8_lossy(content).into_owned()),
            );
        }
    }
    (!fields.is_empty()).then_some(Value::Object(fields))
}

/// `key="value"` (or unquoted) from a header line's parameters.
fn param(line: &str, key: &str) -> Option<String> {
    line.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn split<'a>(mut hay: &'a [u8], delimiter: &[u8]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    while let Some(i) = find(hay, delimiter) {
        parts.push(&hay[..i]);
        hay = &hay[i + delimiter.len()..];
    }
    parts.push(hay);
    parts
}

/// Sample rate of the mock's audio: 16 kHz mono, 16-bit PCM, what speech models take.
const SAMPLE_RATE: u32 = 16_000;

/// A RIFF/WAVE file of `millis` ms of silence (16 kHz mono 16-bit PCM).
pub(crate) fn silent_wav(millis: u32) -> Vec<u8> {
    let samples = SAMPLE_RATE / 1000 * millis;
    let data_len = samples * 2;
    let mut w = Vec::with_capacity(44 + data_len as usize);
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data_len).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes()); // PCM
    w.extend_from_slice(&1u16.to_le_bytes()); // mono
    w.extend_from_slice(&SAMPLE_RATE.to_le_bytes());
    w.extend_from_slice(&(SAMPLE_RATE * 2).to_le_bytes()); // bytes per second
    w.extend_from_slice(&2u16.to_le_bytes()); // block align
    w.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data_len.to_le_bytes());
    w.resize(44 + data_len as usize, 0);
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_fields_text_and_file_parts() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"probe.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF1234\r\n--XyZ--\r\n";
        let v = multipart_fields("multipart/form-data; boundary=XyZ", body).unwrap();
        assert_eq!(v["model"], "whisper-1");
        assert_eq!(v["file_bytes"], 8);
    }

    #[test]
    fn multipart_fields_not_multipart_is_none() {
        assert_eq!(multipart_fields("application/json", b"{}"), None);
        assert_eq!(
            multipart_fields("multipart/form-data; boundary=a", b"junk"),
            None
        );
    }

    #[test]
    fn silent_wav_header_and_length() {
        let w = silent_wav(100);
        assert_eq!(&w[..4], b"RIFF");
        assert_eq!(&w[8..12], b"WAVE");
        assert_eq!(w.len(), 44 + 3200);
        assert!(w[44..].iter().all(|b| *b == 0));
    }
}
