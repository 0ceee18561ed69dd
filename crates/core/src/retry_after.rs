//! Retry hints: how long a provider asked us to stay away.
//!
//! A provider tells us when to come back in several places, and this module reads all of them:
//!
//! | source                                   | form                                   | example            |
//! |------------------------------------------|----------------------------------------|--------------------|
//! | `retry-after` (RFC 9110 §10.2.3)         | delta-seconds (we also accept decimals) or HTTP-date | `5`, `1.5`, `Sun, 06 Nov 1994 08:49:37 GMT` |
//! | `retry-after-ms` (OpenAI, Azure)         | decimal milliseconds                   | `250`              |
//! | `x-ratelimit-reset-{requests,tokens,input-tokens,output-tokens}` (OpenAI, Groq, compatibles) | Go-style duration | `1m30s`, `6m0s`, `20ms`, `1.5s` |
//! | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset` | RFC 3339 timestamp | `2026-11-30T09:00:00Z` |
//! | any other `x-ratelimit-reset[-*]`, `ratelimit-reset` (IETF draft) | seconds, Go duration, epoch s/ms, RFC 3339 | `33011.38`, `1741305600000` |
//! | Gemini/Vertex body `error.details[@type=…RetryInfo].retryDelay` | protobuf JSON duration | `30s`, `1.5s` |
//! | error message text                       | "try again in 20s", "retry in 1m30s", "in 500ms" | |
//!
//! **Combining.** An *explicit* hint (`retry-after`, `retry-after-ms`, and in a body Gemini's
//! `RetryInfo` or a "try again in" phrase) is the provider's own answer for this refusal, and
//! the longest explicit hint wins: DESIGN §4.4 treats Retry-After as a lower bound, so when two
//! explicit sources disagree only the later honours both. *Vendor reset headers* are used only
//! when no explicit hint exists ([`retry_after`] = explicit, else resets), because they describe
//! bucket state, not this refusal: `x-ratelimit-reset-requests` is the time until the bucket is
//! back to *full*, which can be a minute when the next request fits in a second. Taking the
//! longest of everything would turn a `Retry-After: 5` next to a full-window reset into a 60 s
//! wait and break field case 1's +10 % bound. Among resets, one counts only when its dimension is
//! actually exhausted: `x-ratelimit-reset-tokens: 6m0s` next to
//! `x-ratelimit-remaining-tokens: 9000` is not why we were refused, so a reset header counts when
//! its matching `remaining` header is absent, unparsable or zero; the longest such reset wins.
//!
//! **Only on error responses.** Reset headers ride on every success response too, where they
//! are bucket-calibration data for the quota broker (DESIGN §3 step 8), not a request to back off.
//! Call [`retry_after`] only for a refused attempt (429, 503, 529 …); the classifier does this.
//!
//! **Bounds.** Dates in the past become zero. Absurd values are capped at [`MAX_RETRY_HINT`]
//! (30 days) rather than dropped, so a multi-day hint (field case 3d: `Retry-After: 1209600`, two
//! weeks) still reads as "exhausted" to the classifier instead of looking like a short pause.
//! Negative numbers, NaN-like text and garbage are ignored (treated as no hint), never a panic.
//!
//! Alternatives rejected: trusting only `retry-after` (misses OpenAI's and Anthropic's richer
//! headers, case 1 variant H); taking the *shortest* hint (violates the lower-bound rule);
//! `humantime` for Go durations (it has no decimals such as `1.5s`, and accepts forms Go never
//! emits), so a small exact parser lives here.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use http::HeaderMap;
use serde_json::Value;

/// Largest hint we keep: 30 days. Anything longer is capped to this, which is still far above
/// the exhaustion threshold in [`crate::classify`], so the class does not change.
pub const MAX_RETRY_HINT: Duration = Duration::from_secs(30 * 24 * 3600);

/// For a reset header, the name of its matching `remaining` header; `None` for other headers.
///
/// * `x-ratelimit-reset[-<dim>]` ↔ `x-ratelimit-remaining[-<dim>]` (OpenAI, Groq, Cerebras's
///   `-requests-day`/`-tokens-minute`, OpenRouter's unsuffixed one);
/// * `anthropic-ratelimit-<dim>-reset` ↔ `anthropic-ratelimit-<dim>-remaining`;
/// * `ratelimit-reset` ↔ `ratelimit-remaining` (IETF draft RateLimit header fields).
fn remaining_header_for(name: &str) -> Option<String> {
    if let Some(dim) = name.strip_prefix("x-ratelimit-reset") {
        return (dim.is_empty() || dim.starts_with('-'))
            .then(|| format!("x-ratelimit-remaining{dim}"));
    }
    if name.starts_with("anthropic-ratelimit-") {
        return name
            .strip_suffix("-reset")
            .map(|stem| format!("{stem}-remaining"));
    }
    (name == "ratelimit-reset").then(|| "ratelimit-remaining".to_owned())
}

/// Reads the retry hints in `headers`: the explicit hint when there is one, else the vendor
/// reset headers (module docs, "Combining"); capped at [`MAX_RETRY_HINT`].
///
/// Meant for error responses only (see module docs). `now_wall` is the wall-clock time the
/// response arrived, used to turn HTTP-dates and RFC 3339 reset timestamps into delays; a date in
/// the past yields [`Duration::ZERO`] (the provider says "now", which is still a hint).
/// Returns `None` when no header carries a parsable hint.
pub fn retry_after(headers: &HeaderMap, now_wall: DateTime<Utc>) -> Option<Duration> {
    explicit_retry_after(headers, now_wall).or_else(|| rate_limit_reset(headers, now_wall))
}

/// The longest explicit hint: `retry-after` (every occurrence) and `retry-after-ms`, capped at
/// [`MAX_RETRY_HINT`]. `None` when neither parses.
pub fn explicit_retry_after(headers: &HeaderMap, now_wall: DateTime<Utc>) -> Option<Duration> {
    let seconds = headers
        .get_all(http::header::RETRY_AFTER)
        .into_iter()
        .filter_map(|v| {
            v.to_str()
                .ok()
                .and_then(|v| parse_retry_after_value(v, now_wall))
        });
    let millis = headers
        .get_all("retry-after-ms")
        .into_iter()
        .filter_map(|v| v.to_str().ok().and_then(parse_retry_after_ms));
    seconds.chain(millis).max().map(cap)
}

/// The longest credible vendor reset: every `x-ratelimit-reset[-*]`,
/// `anthropic-ratelimit-*-reset` and `ratelimit-reset` header whose matching `remaining`
/// header is absent, unparsable or zero; capped at [`MAX_RETRY_HINT`]. `None` when none counts.
pub fn rate_limit_reset(headers: &HeaderMap, now_wall: DateTime<Utc>) -> Option<Duration> {
    headers
        .iter()
        .filter(|(name, _)| {
            remaining_header_for(name.as_str())
                .is_some_and(|remaining| dimension_exhausted(headers, &remaining))
        })
        .filter_map(|(_, v)| v.to_str().ok().and_then(|v| parse_reset_value(v, now_wall)))
        .max()
        .map(cap)
}

/// Parses one `Retry-After` value: delta-seconds (`"5"`, and the non-standard but common
/// `"1.5"`) or an HTTP-date (IMF-fixdate, RFC 850 or asctime, via `httpdate`).
///
/// Returns the delay from `now_wall`, zero for a date in the past, `None` for garbage or a
/// negative number. Not capped (the caller decides); see [`retry_after`].
pub fn parse_retry_after_value(value: &str, now_wall: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Some(d) = parse_decimal(value, NANOS_PER_SEC) {
        return Some(d);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(until(system_to_chrono(at)?, now_wall))
}

/// Parses `retry-after-ms`: decimal milliseconds (`"250"`, `"12.5"`). `None` for garbage.
pub fn parse_retry_after_ms(value: &str) -> Option<Duration> {
    parse_decimal(value.trim(), NANOS_PER_MILLI)
}

/// Parses a Go `time.Duration` string as OpenAI's `x-ratelimit-reset-*` headers send it
/// (`"1m30s"`, `"6m0s"`, `"20ms"`, `"1.5s"`, `"2h"`, `"0"`), also protobuf JSON durations
/// (`"30s"`, `"1.500s"`).
///
/// Units: `h`, `m`, `s`, `ms`, `us`/`µs`/`μs`, `ns`; each number may have a fraction. A leading
/// `+` is accepted; a negative duration, a missing unit (except the bare `"0"`) or any other text
/// gives `None`. Overflow saturates at about 584 years rather than failing.
pub fn parse_go_duration(value: &str) -> Option<Duration> {
    let s = value.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let (number, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per_unit: u128 = match unit {
            "h" => 3600 * NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "s" => NANOS_PER_SEC,
            "ms" => NANOS_PER_MILLI,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        total = total.saturating_add(decimal_nanos(number, nanos_per_unit)?);
        rest = tail;
    }
    Some(nanos_to_duration(total))
}

/// Parses an RFC 3339 timestamp (Anthropic's `anthropic-ratelimit-*-reset`) into the delay from
/// `now_wall`; zero when it is in the past, `None` when it does not parse.
pub fn parse_reset_timestamp(value: &str, now_wall: DateTime<Utc>) -> Option<Duration> {
    let at = DateTime::parse_from_rfc3339(value.trim()).ok()?;
    Some(until(at.with_timezone(&Utc), now_wall))
}

/// Parses any reset-header value we have seen in the wild, in this order: Go duration
/// (`6m0s`), bare number (seconds to wait; a Unix epoch in seconds when ≥ 10⁹, in
/// milliseconds when ≥ 10¹²), RFC 3339, HTTP-date. `None` when none fits.
pub fn parse_reset_value(value: &str, now_wall: DateTime<Utc>) -> Option<Duration> {
    let v = value.trim();
    if let Some(d) = parse_go_duration(v) {
        return Some(d);
    }
    if let Some(d) = parse_decimal(v, NANOS_PER_SEC) {
        // Some compatibles send an epoch here: 10^12 and up is milliseconds (OpenRouter),
        // 10^9 and up is seconds. Neither is ever a delay (10^9 s is 31 years).
        if d >= Duration::from_secs(1_000_000_000_000) {
            let ms = i64::try_from(d.as_secs()).ok()?;
            let at = DateTime::<Utc>::from_timestamp_millis(ms)?;
            return Some(until(at, now_wall));
        }
        if d >= Duration::from_secs(1_000_000_000) {
            let at = DateTime::<Utc>::from_timestamp(i64::try_from(d.as_secs()).ok()?, 0)?;
            return Some(until(at, now_wall));
        }
        return Some(d);
    }
    if let Some(d) = parse_reset_timestamp(v, now_wall) {
        return Some(d);
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(until(system_to_chrono(at)?, now_wall))
}

/// Retry hint carried in a JSON error body: Gemini/Vertex `RetryInfo.retryDelay` anywhere under
/// `error.details` (also inside a top-level array, as `streamGenerateContent` sends errors), or
/// a "try again in …" phrase in the error message (OpenAI, Gemini, Bedrock). Longest wins;
/// capped at [`MAX_RETRY_HINT`]. `None` when the body has no hint.
pub fn retry_hint_from_body(body: &Value) -> Option<Duration> {
    let body = match body {
        Value::Array(items) => items.first()?,
        other => other,
    };
    let mut best: Option<Duration> = None;
    let mut offer = |d: Option<Duration>| {
        if let Some(d) = d {
            best = Some(best.map_or(d, |b| b.max(d)));
        }
    };
    let error = body.get("error");
    let details = error
        .and_then(|e| e.get("details"))
        .and_then(Value::as_array);
    for detail in details.into_iter().flatten() {
        let is_retry_info = detail
            .get("@type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"));
        if is_retry_info {
            offer(detail.get("retryDelay").and_then(protobuf_duration));
        }
    }
    let messages = [
        error.and_then(|e| e.get("message")),
        body.get("message"),
        body.get("Message"),
        error.filter(|e| e.is_string()),
    ];
    for message in messages.into_iter().flatten() {
        offer(message.as_str().and_then(retry_hint_from_message));
    }
    best.map(cap)
}

/// Finds a "try again in 20s" style hint in free text. Recognises the phrases "try again in",
/// "try again after", "retry in", "retry after", "wait" followed by a Go duration (`20s`,
/// `1m30s`, `500ms`, `23.5s`) or a number and a unit word (`20 seconds`, `2 minutes`,
/// `1 hour`, `500 milliseconds`). The longest occurrence wins; `None` when there is none.
pub fn retry_hint_from_message(message: &str) -> Option<Duration> {
    const MARKERS: [&str; 5] = [
        "try again in ",
        "try again after ",
        "retry in ",
        "retry after ",
        "wait ",
    ];
    let lower = message.to_ascii_lowercase();
    let mut best: Option<Duration> = None;
    for marker in MARKERS {
        for (at, _) in lower.match_indices(marker) {
            let tail = &lower[at + marker.len()..];
            if let Some(d) = duration_phrase(tail) {
                best = Some(best.map_or(d, |b| b.max(d)));
            }
        }
    }
    best
}

/// Finds a calendar date in free text ("… usage limits. You will regain access on 2026-12-14 at
/// 00:00 UTC", "… until 2026-12-14T00:00:00Z") and returns the delay until it. Accepted forms:
/// RFC 3339, `YYYY-MM-DD`, optionally followed by ` at HH:MM` or ` HH:MM:SS`; times without a
/// zone are read as UTC; a date alone means its start. Only future dates count (a past date
/// says nothing about when access returns); `None` otherwise.
pub fn reset_date_in_message(message: &str, now_wall: DateTime<Utc>) -> Option<Duration> {
    let bytes = message.as_bytes();
    let mut best: Option<Duration> = None;
    let mut i = 0;
    while i + 10 <= bytes.len() {
        if looks_like_date(&bytes[i..i + 10]) && (i == 0 || !bytes[i - 1].is_ascii_digit()) {
            // `looks_like_date` checked these 10 bytes are ASCII, so slicing is on char bounds.
            let tail = &message[i..];
            if let Some(at) = date_at_start(tail).filter(|at| *at > now_wall) {
                let d = until(at, now_wall);
                best = Some(best.map_or(d, |b| b.max(d)));
            }
            i += 10;
        } else {
            i += 1;
        }
    }
    best.map(cap)
}

const NANOS_PER_SEC: u128 = 1_000_000_000;
const NANOS_PER_MILLI: u128 = 1_000_000;

fn cap(d: Duration) -> Duration {
    d.min(MAX_RETRY_HINT)
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// True when the `remaining` header for a dimension is absent, garbage or zero: only then is
/// that dimension's reset a credible "come back at" (module docs).
fn dimension_exhausted(headers: &HeaderMap, remaining_name: &str) -> bool {
    match header_str(headers, remaining_name).map(|v| v.trim().parse::<f64>()) {
        Some(Ok(remaining)) => remaining.is_nan() || remaining <= 0.0,
        _ => true,
    }
}

/// Delay from `now` to `at`, zero when `at` has passed.
fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}

fn system_to_chrono(at: SystemTime) -> Option<DateTime<Utc>> {
    let since_epoch = at.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let secs = i64::try_from(since_epoch.as_secs()).ok()?;
    DateTime::<Utc>::from_timestamp(secs, since_epoch.subsec_nanos())
}

/// A non-negative decimal number of `unit`s (`"5"`, `"1.5"`, `".5"`) into a duration.
fn parse_decimal(s: &str, nanos_per_unit: u128) -> Option<Duration> {
    decimal_nanos(s, nanos_per_unit).map(nanos_to_duration)
}

/// Exact decimal → nanoseconds, without floats: `int·unit + frac·unit/10^digits`.
/// Fraction digits beyond 18 are checked but ignored (below a nanosecond for every unit used).
fn decimal_nanos(s: &str, nanos_per_unit: u128) -> Option<u128> {
    let (int_part, frac_part) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut int_value: u128 = 0;
    for b in int_part.bytes() {
        int_value = int_value
            .saturating_mul(10)
            .saturating_add(u128::from(b - b'0'));
    }
    let mut frac_value: u128 = 0;
    let mut scale: u128 = 1;
    for b in frac_part.bytes().take(18) {
        frac_value = frac_value * 10 + u128::from(b - b'0');
        scale *= 10;
    }
    Some(
        int_value
            .saturating_mul(nanos_per_unit)
            .saturating_add(frac_value * nanos_per_unit / scale),
    )
}

fn nanos_to_duration(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 10^9 and always fits.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Duration::new(secs, sub)
}

/// Protobuf JSON `Duration`: a string like `"30s"`, or (defensively) an object
/// `{"seconds": 30, "nanos": 0}`.
fn protobuf_duration(v: &Value) -> Option<Duration> {
    match v {
        Value::String(s) => parse_go_duration(s),
        Value::Object(o) => {
            let secs = match o.get("seconds") {
                Some(Value::String(s)) => s.trim().parse::<u64>().ok()?,
                Some(v) => v.as_u64()?,
                None => 0,
            };
            let nanos = o.get("nanos").and_then(Value::as_u64).unwrap_or(0);
            let nanos = u32::try_from(nanos.min(999_999_999)).ok()?;
            Some(Duration::new(secs, nanos))
        }
        _ => None,
    }
}

/// Duration at the start of `tail` (already lower-case): `1m30s`, `23.5s.`, `20 seconds`.
fn duration_phrase(tail: &str) -> Option<Duration> {
    let token_end = tail.find(|c: char| c.is_whitespace()).unwrap_or(tail.len());
    let token = tail[..token_end].trim_end_matches(['.', ',', ';', ':', ')', '!']);
    if let Some(d) = parse_go_duration(token) {
        return Some(d);
    }
    let unit_word = tail[token_end..].trim_start();
    let word_end = unit_word
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(unit_word.len());
    let nanos_per_unit = match &unit_word[..word_end] {
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600 * NANOS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
        "s" | "sec" | "secs" | "second" | "seconds" => NANOS_PER_SEC,
        "ms" | "millisecond" | "milliseconds" => NANOS_PER_MILLI,
        _ => return None,
    };
    parse_decimal(token, nanos_per_unit)
}

fn looks_like_date(b: &[u8]) -> bool {
    b.len() == 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
}

/// Parses the date (and optional time) at the start of `s`, which begins with `YYYY-MM-DD`.
fn date_at_start(s: &str) -> Option<DateTime<Utc>> {
    let date = NaiveDate::parse_from_str(s.get(..10)?, "%Y-%m-%d").ok()?;
    let rest = s.get(10..).unwrap_or("");
    if rest.starts_with('T') || rest.starts_with('t') {
        let end = s
            .find(|c: char| c.is_whitespace() || c == ',' || c == ')')
            .unwrap_or(s.len());
        let token = s[..end].trim_end_matches('.');
        if let Ok(at) = DateTime::parse_from_rfc3339(token) {
            return Some(at.with_timezone(&Utc));
        }
    }
    let after = rest.trim_start();
    let after = after.strip_prefix("at ").map_or(after, str::trim_start);
    let time = after
        .get(..8)
        .and_then(|t| NaiveTime::parse_from_str(t, "%H:%M:%S").ok())
        .or_else(|| {
            after
                .get(..5)
                .and_then(|t| NaiveTime::parse_from_str(t, "%H:%M").ok())
        })
        .unwrap_or(NaiveTime::MIN);
    Some(date.and_time(time).and_utc())
}
