//! Shared availability signals (field cases 7 and 8): Retry-After pauses and open circuit
//! breakers as deadlines that only ever move later, shared by every replica.
//!
//! With Redis a deadline lives in the `{prefix}:signals` hash (field `pause|<scope>` or
//! `breaker|<provider>`, value ms since the Unix epoch) and each raise is published on the
//! `{prefix}:signals` channel as `<field>|<ms>`. Every replica keeps a local copy merged with
//! the same max rule, so a signal heard twice (pub/sub and the catch-up load after a
//! reconnect) is announced once, and the local copy answers during an outage.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use tokio::sync::{broadcast, oneshot};

use crate::local::wall_now;
use crate::{Backend, QuotaStore, Shared, StoreMode, enter_fallback, lock};

/// Buffered signals per subscriber before the slowest one skips (it can reload).
const CHANNEL_DEPTH: usize = 256;

/// What a signal stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignalKind {
    /// A Retry-After / cooldown pause of a scope (provider, quota group, model on provider).
    Pause,
    /// A provider's circuit breaker is open.
    BreakerOpen,
}

impl SignalKind {
    const fn tag(self) -> &'static str {
        match self {
            SignalKind::Pause => "pause",
            SignalKind::BreakerOpen => "breaker",
        }
    }
}

/// A deadline shared by every replica: `subject` (a pause scope or a provider name) is
/// stopped until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// Pause or open breaker.
    pub kind: SignalKind,
    /// The pause scope or provider name, as the publisher gave it.
    pub subject: String,
    /// When it ends (millisecond resolution).
    pub until: DateTime<Utc>,
}

fn field(kind: SignalKind, subject: &str) -> String {
    format!("{}|{subject}", kind.tag())
}

/// `pause|scope` (+ `|ms` in messages) back into a signal; the subject may contain `|`.
fn parse(field: &str, until_ms: i64) -> Option<Signal> {
    let (tag, subject) = field.split_once('|')?;
    let kind = match tag {
        "pause" => SignalKind::Pause,
        "breaker" => SignalKind::BreakerOpen,
        _ => return None,
    };
    Some(Signal {
        kind,
        subject: subject.to_owned(),
        until: DateTime::from_timestamp_millis(until_ms)?,
    })
}

fn parse_message(payload: &str) -> Option<Signal> {
    let (field, ms) = payload.rsplit_once('|')?;
    parse(field, ms.parse().ok()?)
}

/// This replica's copy of the signals and the broadcast its subscribers read.
#[derive(Debug)]
pub(crate) struct LocalSignals {
    known: Mutex<HashMap<String, i64>>,
    tx: broadcast::Sender<Signal>,
}

impl LocalSignals {
    pub(crate) fn new() -> Self {
        LocalSignals {
            known: Mutex::new(HashMap::new()),
            tx: broadcast::Sender::new(CHANNEL_DEPTH),
        }
    }

    /// Raises the local deadline; announces and returns `true` only when it moved later.
    fn merge(&self, field: &str, until_ms: i64) -> bool {
        {
            let mut known = lock(&self.known);
            match known.get_mut(field) {
                Some(cur) if *cur >= until_ms => return false,
                Some(cur) => *cur = until_ms,
                None => {
                    known.insert(field.to_owned(), until_ms);
                }
            }
        }
        if let Some(signal) = parse(field, until_ms) {
            let _ = self.tx.send(signal);
        }
        true
    }

    fn active(&self, now_ms: i64) -> Vec<Signal> {
        let mut known = lock(&self.known);
        known.retain(|_, until| *until > now_ms);
        known.iter().filter_map(|(f, u)| parse(f, *u)).collect()
    }
}

impl QuotaStore {
    /// Pauses `scope` until `until` on every replica (a Retry-After or cooldown). Keeps the
    /// later deadline: a shorter pause never shortens a longer one (field case 7). Returns
    /// whether the shared deadline moved.
    pub async fn publish_pause(&self, scope: &str, until: DateTime<Utc>) -> bool {
        self.publish(SignalKind::Pause, scope, until).await
    }

    /// Marks `provider`'s breaker open until `until` on every replica; same max rule.
    pub async fn publish_breaker_open(&self, provider: &str, until: DateTime<Utc>) -> bool {
        self.publish(SignalKind::BreakerOpen, provider, until).await
    }

    async fn publish(&self, kind: SignalKind, subject: &str, until: DateTime<Utc>) -> bool {
        let field = field(kind, subject);
        let ms = until.timestamp_millis();
        if let Backend::Redis(r) = &self.shared.backend
            && *self.shared.mode.borrow() == StoreMode::Redis
        {
            // Our own subscription hears the announcement and updates the local copy.
            match r.remote.publish(&field, ms).await {
                Ok(changed) => return changed,
                Err(e) => enter_fallback(&self.shared, r, "publish", &e),
            }
        }
        self.shared.signals.merge(&field, ms)
    }

    /// The signals still in force, for a replica that starts or restarts (field case 8:
    /// a restarted replica honours a pause published before it started). Read from Redis
    /// when it answers, else from this replica's copy.
    pub async fn load_signals(&self) -> Vec<Signal> {
        if let Backend::Redis(r) = &self.shared.backend
            && *self.shared.mode.borrow() == StoreMode::Redis
        {
            match r.remote.load_signals().await {
                Ok(all) => {
                    for (f, ms) in &all {
                        self.shared.signals.merge(f, *ms);
                    }
                }
                Err(e) => enter_fallback(&self.shared, r, "load_signals", &e),
            }
        }
        self.shared.signals.active(wall_now().timestamp_millis())
    }

    /// Signals as they are published by any replica (this one included), each once per raise.
    /// A subscriber that falls more than 256 behind skips the oldest; after a Redis
    /// reconnect, signals missed meanwhile are announced again from the shared hash.
    pub fn subscribe(&self) -> impl Stream<Item = Signal> + Send + 'static {
        let rx = self.shared.signals.tx.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(s) => return Some((s, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}

/// Keeps a pub/sub connection subscribed, merging what it hears; after each (re)subscription
/// it catches up from the shared hash. Reports the first subscription on `ready`.
pub(crate) async fn listen(
    weak: Weak<Shared>,
    client: redis::Client,
    retry: Duration,
    ready: oneshot::Sender<Result<(), redis::RedisError>>,
) {
    let mut ready = Some(ready);
    loop {
        let Some(channel) = weak.upgrade().and_then(|s| match &s.backend {
            Backend::Redis(r) => Some(r.remote.channel.clone()),
            Backend::InProcess(_) => None,
        }) else {
            return;
        };
        let subscribed = match client.get_async_pubsub().await {
            Ok(mut ps) => match ps.subscribe(&channel).await {
                Ok(()) => Ok(ps),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match subscribed {
            Ok(ps) => {
                if let Some(shared) = weak.upgrade()
                    && let Backend::Redis(r) = &shared.backend
                    && let Ok(all) = r.remote.load_signals().await
                {
                    for (f, ms) in &all {
                        shared.signals.merge(f, *ms);
                    }
                }
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Ok(()));
                }
                let mut messages = ps.into_on_message();
                while let Some(msg) = messages.next().await {
                    let Some(shared) = weak.upgrade() else { return };
                    if let Ok(payload) = msg.get_payload::<String>()
                        && let Some(sig) = parse_message(&payload)
                    {
                        shared
                            .signals
                            .merge(&field(sig.kind, &sig.subject), sig.until.timestamp_millis());
                    }
                }
            }
            Err(e) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
        tokio::time::sleep(retry).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_message_subject_with_bars_round_trips() {
        let s = parse_message("pause|provider/a|b|1700000000123").unwrap();
        assert_eq!(s.kind, SignalKind::Pause);
        assert_eq!(s.subject, "provider/a|b");
        assert_eq!(s.until.timestamp_millis(), 1_700_000_000_123);
        assert!(parse_message("nonsense").is_none());
        assert!(parse_message("other|x|5").is_none());
    }
}
