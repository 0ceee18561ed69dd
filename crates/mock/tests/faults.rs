//! Fault injection, admin API and configuration tests against a real mock over loopback.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_mock::{
    ConfigFile, Fault, FaultRule, FaultSet, MockArgs, MockConfig, MockHandle, MockProvider,
    RateLimitConfig, Trigger,
};

async fn start(cfg: MockConfig) -> MockHandle {
    MockProvider::start(cfg).await.unwrap()
}

fn with_faults(faults: FaultSet) -> MockConfig {
    MockConfig {
        faults,
        ..MockConfig::default()
    }
}

fn chat_req() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]})
}

fn anthropic_req() -> Value {
    json!({"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}]})
}

async fn post_chat(mock: &MockHandle) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(&chat_req())
        .send()
        .await
        .unwrap()
}

async fn post_messages(mock: &MockHandle) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/messages", mock.base_url()))
        .json(&anthropic_req())
        .send()
        .await
        .unwrap()
}

fn rate_limited(retry_after: Option<u64>) -> Fault {
    Fault::RateLimited {
        retry_after,
        http_date: false,
        retry_after_ms: None,
        reset_requests: None,
        reset_tokens: None,
    }
}

/// Polls the mock until call `i` is marked cancelled, for at most `within`.
async fn wait_cancelled(mock: &MockHandle, i: usize, within: Duration) -> bool {
    let start = tokio::time::Instant::now();
    while start.elapsed() < within {
        if mock
            .calls()
            .get(i)
            .is_some_and(|c| c.cancelled_at.is_some())
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn rate_limited_rules_answer_each_attempt_with_its_own_retry_after() {
    let http_date = Fault::RateLimited {
        retry_after: Some(15),
        http_date: true,
        retry_after_ms: None,
        reset_requests: None,
        reset_tokens: None,
    };
    let reset_only = Fault::RateLimited {
        retry_after: None,
        http_date: false,
        retry_after_ms: Some(40_000),
        reset_requests: Some("1m30s".to_owned()),
        reset_tokens: None,
    };
    let mock = start(with_faults(FaultSet::rules([
        FaultRule::next(1, rate_limited(Some(5))),
        FaultRule::next(1, http_date),
        FaultRule::next(1, reset_only),
    ])))
    .await;

    let r1 = post_chat(&mock).await;
    assert_eq!(r1.status(), 429);
    assert_eq!(r1.headers()["retry-after"], "5");
    assert_eq!(r1.headers()["x-ratelimit-remaining-requests"], "0");
    let body: Value = r1.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(body["error"]["message"].is_string());

    let r2 = post_chat(&mock).await;
    assert_eq!(r2.status(), 429);
    let date = httpdate::parse_http_date(r2.headers()["retry-after"].to_str().unwrap()).unwrap();
    #[allow(clippy::disallowed_methods)] // comparing against a wall-clock header
    let ahead = date
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(
        (13..=16).contains(&ahead.as_secs()),
        "http-date {ahead:?} ahead"
    );

    let r3 = post_chat(&mock).await;
    assert_eq!(r3.status(), 429);
    assert!(r3.headers().get("retry-after").is_none());
    assert_eq!(r3.headers()["retry-after-ms"], "40000");
    assert_eq!(r3.headers()["x-ratelimit-reset-requests"], "1m30s");

    assert_eq!(post_chat(&mock).await.status(), 200);
    let statuses: Vec<u16> = mock.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [429, 429, 429, 200]);
}

#[tokio::test]
async fn anthropic_rate_limited_uses_anthropic_error_shape_and_rfc3339_reset() {
    let fault = Fault::RateLimited {
        retry_after: Some(20),
        http_date: false,
        retry_after_ms: None,
        reset_requests: Some("40s".to_owned()),
        reset_tokens: None,
    };
    let mock = start(with_faults(FaultSet::fail_all(fault))).await;
    let resp = post_messages(&mock).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "20");
    assert_eq!(
        resp.headers()["anthropic-ratelimit-requests-remaining"],
        "0"
    );
    let reset = resp.headers()["anthropic-ratelimit-requests-reset"]
        .to_str()
        .unwrap()
        .to_owned();
    let reset = chrono::DateTime::parse_from_rfc3339(&reset).unwrap();
    let ahead = reset
        .signed_duration_since(chrono::Utc::now())
        .num_seconds();
    assert!((38..=41).contains(&ahead), "reset {ahead} s ahead");
    assert!(resp.headers().contains_key("request-id"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn status_faults_map_to_statuses_and_both_dialects() {
    let cases: Vec<(Fault, u16, &str, &str)> = vec![
        (
            Fault::InsufficientQuota { retry_after: None },
            429,
            "insufficient_quota",
            "billing_error",
        ),
        (
            Fault::UsageLimit {
                until: Some("2026-12-14".into()),
            },
            400,
            "invalid_request_error",
            "invalid_request_error",
        ),
        (
            Fault::PaymentRequired,
            402,
            "insufficient_quota",
            "billing_error",
        ),
        (
            Fault::ServiceUnavailable {
                retry_after: Some(3),
            },
            503,
            "server_error",
            "overloaded_error",
        ),
        (
            Fault::Overloaded {
                status: 529,
                retry_after: None,
            },
            529,
            "server_error",
            "overloaded_error",
        ),
        (
            Fault::ServerError { status: 500 },
            500,
            "server_error",
            "api_error",
        ),
        (
            Fault::InvalidParameter {
                param: "temperature".into(),
                message: None,
            },
            400,
            "invalid_request_error",
            "invalid_request_error",
        ),
        (
            rate_limited(Some(1_209_600)),
            429,
            "requests",
            "rate_limit_error",
        ),
    ];
    for (fault, status, oa_type, an_type) in cases {
        let mock = start(with_faults(FaultSet::fail_all(fault.clone()))).await;
        let oa = post_chat(&mock).await;
        assert_eq!(oa.status(), status, "{fault:?}");
        let body: Value = oa.json().await.unwrap();
        assert_eq!(body["error"]["type"], oa_type, "{fault:?}");
        let an = post_messages(&mock).await;
        assert_eq!(an.status(), status);
        let body: Value = an.json().await.unwrap();
        assert_eq!(body["error"]["type"], an_type, "{fault:?}");
        match &fault {
            Fault::InsufficientQuota { .. } => {
                let oa: Value = post_chat(&mock).await.json().await.unwrap();
                assert_eq!(oa["error"]["code"], "insufficient_quota");
            }
            Fault::UsageLimit { .. } => {
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("2026-12-14")
                );
            }
            Fault::InvalidParameter { .. } => {
                let oa: Value = post_chat(&mock).await.json().await.unwrap();
                assert_eq!(oa["error"]["param"], "temperature");
            }
            Fault::RateLimited { .. } => {
                assert_eq!(post_chat(&mock).await.headers()["retry-after"], "1209600");
            }
            _ => {}
        }
        mock.shutdown().await;
    }
}

#[tokio::test]
async fn generic_status_fault_carries_custom_type_code_and_headers() {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert("x-custom".to_owned(), "yes".to_owned());
    let mock = start(with_faults(FaultSet::fail_all(Fault::Status {
        status: 418,
        error_type: Some("teapot_error".into()),
        code: Some("short_and_stout".into()),
        message: Some("I am a teapot".into()),
        headers,
    })))
    .await;
    let resp = post_chat(&mock).await;
    assert_eq!(resp.status(), 418);
    assert_eq!(resp.headers()["x-custom"], "yes");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "short_and_stout");
    assert_eq!(body["error"]["message"], "I am a teapot");
}

#[tokio::test]
async fn reset_before_response_gives_transport_error_and_no_status() {
    let mock = start(with_faults(FaultSet::rules([FaultRule::next(
        1,
        Fault::ResetBeforeResponse,
    )])))
    .await;
    let err = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(&chat_req())
        .send()
        .await
        .unwrap_err();
    assert!(err.status().is_none(), "{err}");
    // The next request gets a fresh connection and succeeds.
    assert_eq!(post_chat(&mock).await.status(), 200);
    let calls = mock.calls();
    assert_eq!(calls[0].status, 0);
    assert_eq!(calls[0].fault, ["reset_before_response"]);
}

#[tokio::test]
async fn hang_after_headers_sends_headers_then_nothing_and_records_cancel() {
    let mock = start(with_faults(FaultSet::fail_all(Fault::HangAfterHeaders))).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let next = tokio::time::timeout(Duration::from_millis(400), body.next()).await;
    assert!(next.is_err(), "no body bytes expected");
    drop(body);
    assert!(
        wait_cancelled(&mock, 0, Duration::from_secs(1)).await,
        "cancel recorded"
    );
}

#[tokio::test]
async fn hang_keep_alive_sends_only_comments_and_role_deltas() {
    let mock = start(with_faults(FaultSet::fail_all(Fault::HangKeepAlive {
        interval_ms: 100,
    })))
    .await;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let until = tokio::time::Instant::now() + Duration::from_millis(550);
    while let Ok(Some(chunk)) = tokio::time::timeout_at(until, body.next()).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    drop(body);
    let beats = text.matches(": keep-alive\n\n").count();
    assert!((2..=6).contains(&beats), "beats {beats}: {text}");
    assert!(!text.contains("token"), "no content expected");
    for line in text.lines().filter(|l| l.starts_with("data: ")) {
        let v: Value = serde_json::from_str(&line[6..]).unwrap();
        assert_eq!(
            v["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
    }
    assert!(
        wait_cancelled(&mock, 0, Duration::from_secs(1)).await,
        "cancel recorded"
    );
    assert_eq!(mock.calls()[0].tokens_streamed, 0);
}

#[tokio::test]
async fn hang_no_headers_never_answers_and_records_cancel() {
    let mock = start(with_faults(FaultSet::fail_all(Fault::HangNoHeaders))).await;
    let sent = tokio::time::timeout(Duration::from_millis(400), post_chat(&mock)).await;
    assert!(sent.is_err(), "no headers expected");
    assert_eq!(mock.calls()[0].status, 0);
    assert!(
        wait_cancelled(&mock, 0, Duration::from_secs(1)).await,
        "cancel recorded"
    );
}

#[tokio::test]
async fn latency_and_slow_first_token_faults_delay_the_answer() {
    let mock = start(with_faults(FaultSet::rules([
        FaultRule::always(Fault::Latency { ms: 200 }),
        FaultRule::always(Fault::SlowFirstToken { ms: 300 }),
    ])))
    .await;
    let t0 = tokio::time::Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    let headers = t0.elapsed();
    let text = resp.text().await.unwrap();
    let done = t0.elapsed();
    assert!(
        headers >= Duration::from_millis(200),
        "headers at {headers:?}"
    );
    assert!(
        done >= Duration::from_millis(300),
        "first token not before {done:?}"
    );
    assert!(text.contains("token0"));
    assert_eq!(mock.calls()[0].fault, ["latency", "slow_first_token"]);
}

#[tokio::test]
async fn error_rate_fraction_is_seeded_and_reproducible() {
    let run = || async {
        let mock = start(with_faults(FaultSet::error_rate(
            0.25,
            Fault::ServiceUnavailable { retry_after: None },
            9,
        )))
        .await;
        let mut statuses = Vec::new();
        for _ in 0..200 {
            statuses.push(post_chat(&mock).await.status().as_u16());
        }
        statuses
    };
    let a = run().await;
    let b = run().await;
    assert_eq!(a, b);
    let failures = a.iter().filter(|s| **s == 503).count();
    assert!((30..=70).contains(&failures), "failures {failures}");
    assert!(a.iter().all(|s| *s == 503 || *s == 200));
}

#[tokio::test]
async fn window_rule_applies_only_inside_its_window_and_filters_by_path() {
    let rule = FaultRule::always(rate_limited(Some(1))).when(Trigger {
        from: Some(Duration::ZERO),
        until: Some(Duration::from_millis(500)),
        paths: vec!["/v1/chat/completions".into()],
        ..Trigger::default()
    });
    let mut faults = FaultSet::rules([rule]);
    faults.origin = switchyard_mock::WindowOrigin::FirstRequest;
    let mock = start(with_faults(faults)).await;
    tokio::time::sleep(Duration::from_millis(600)).await; // idle time does not count
    assert_eq!(post_chat(&mock).await.status(), 429);
    assert_eq!(
        post_messages(&mock).await.status(),
        200,
        "other path unaffected"
    );
    tokio::time::sleep(Duration::from_millis(550)).await;
    assert_eq!(post_chat(&mock).await.status(), 200);
}

#[tokio::test]
async fn admin_api_replaces_faults_reports_stats_and_resets() {
    let mock = start(MockConfig::default()).await;
    let http = reqwest::Client::new();
    assert_eq!(post_chat(&mock).await.status(), 200);
    let set = json!({"fail_all": {"kind": "overloaded", "status": 529, "retry_after": 2}});
    let r = http
        .post(format!("{}/admin/faults", mock.base_url()))
        .json(&set)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let resp = post_messages(&mock).await;
    assert_eq!(resp.status(), 529);
    assert_eq!(resp.headers()["retry-after"], "2");
    let stats: Value = http
        .get(format!("{}/admin/stats", mock.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["calls"], 2);
    assert_eq!(stats["by_status"]["200"], 1);
    assert_eq!(stats["by_status"]["529"], 1);
    assert_eq!(stats["faults"]["fail_all"]["kind"], "overloaded");
    let calls: Value = http
        .get(format!("{}/admin/calls", mock.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(calls[1]["path"], "/v1/messages");
    let bad = http
        .post(format!("{}/admin/faults", mock.base_url()))
        .body("{\"rules\": 3}")
        .send();
    assert_eq!(bad.await.unwrap().status(), 400);
    let r = http
        .post(format!("{}/admin/reset", mock.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(mock.call_count(), 0);
    assert_eq!(
        post_chat(&mock).await.status(),
        200,
        "configured (empty) faults restored"
    );
    mock.set_faults(FaultSet::fail_all(Fault::PaymentRequired));
    assert_eq!(post_chat(&mock).await.status(), 402);
}

#[tokio::test]
async fn report_and_omit_usage_faults_change_reported_usage() {
    let mock = start(with_faults(FaultSet::rules([
        FaultRule::next(
            1,
            Fault::ReportUsage {
                input_tokens: 0,
                output_tokens: 0,
            },
        ),
        FaultRule::next(1, Fault::OmitUsage),
    ])))
    .await;
    let a: Value = post_chat(&mock).await.json().await.unwrap();
    assert_eq!(a["usage"]["prompt_tokens"], 0);
    assert_eq!(a["usage"]["completion_tokens"], 0);
    let b: Value = post_chat(&mock).await.json().await.unwrap();
    assert!(b.get("usage").is_none());
    assert_eq!(mock.calls()[1].usage, None);
}

#[tokio::test]
async fn api_keys_and_models_are_checked_when_configured() {
    let mock = start(MockConfig {
        api_keys: vec!["sk-good".into()],
        models: vec!["m".into()],
        ..MockConfig::default()
    })
    .await;
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", mock.openai_base_url());
    let no_key = http.post(&url).json(&chat_req()).send().await.unwrap();
    assert_eq!(no_key.status(), 401);
    let ok = http
        .post(&url)
        .bearer_auth("sk-good")
        .json(&chat_req())
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let other = json!({"model": "nope", "messages": []});
    let r = http
        .post(&url)
        .bearer_auth("sk-good")
        .json(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let models: Value = http
        .get(format!("{}/models", mock.openai_base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "m");
}

#[tokio::test]
async fn enforced_rate_limit_rejects_over_rpm_with_retry_after() {
    let mock = start(MockConfig {
        rate_limits: RateLimitConfig {
            requests_per_minute: 2,
            tokens_per_minute: 1_000,
            enforce: true,
        },
        ..MockConfig::default()
    })
    .await;
    let r1 = post_chat(&mock).await;
    assert_eq!(r1.headers()["x-ratelimit-remaining-requests"], "1");
    assert_eq!(post_chat(&mock).await.status(), 200);
    let r3 = post_chat(&mock).await;
    assert_eq!(r3.status(), 429);
    let ra: u64 = r3.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&ra));
}

#[tokio::test]
async fn shutdown_closes_the_listener() {
    let mock = start(MockConfig::default()).await;
    let url = format!("{}/healthz", mock.base_url());
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
    mock.shutdown().await;
    assert!(reqwest::get(&url).await.is_err());
}

#[test]
fn config_file_parses_single_and_multi_mock_yaml() {
    let multi = r#"
mocks:
  - name: p-a
    listen: 127.0.0.1:9101
    ttft_ms: 300
    cache_ttl: 1h
    faults:
      seed: 3
      rules:
        - kind: rate_limited
          retry_after: 20
          when: { from: 0s, until: 20s }
  - name: p-b
    listen: 127.0.0.1:9102
    usage_style: gemini
"#;
    let mocks = ConfigFile::from_yaml(multi).unwrap().into_mocks();
    assert_eq!(mocks.len(), 2);
    assert_eq!(mocks[0].cache_ttl, Duration::from_secs(3600));
    assert_eq!(
        mocks[0].faults.rules[0].when.until,
        Some(Duration::from_secs(20))
    );
    assert_eq!(mocks[1].usage_style, switchyard_mock::UsageStyle::Gemini);
    let list = "- name: a\n- name: b\n- name: c\n";
    assert_eq!(ConfigFile::from_yaml(list).unwrap().into_mocks().len(), 3);
    let one = ConfigFile::from_yaml("name: solo\noutput_tokens: 3\n")
        .unwrap()
        .into_mocks();
    assert_eq!(one[0].output_tokens, 3);
    assert!(ConfigFile::from_yaml("name: x\nbogus: 1\n").is_err());
}

#[test]
fn mock_args_override_file_values_and_reject_listen_for_many() {
    let dir = std::env::temp_dir().join(format!("switchyard-mock-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mocks.yaml");
    std::fs::write(&file, "- name: a\n  listen: 127.0.0.1:9201\n- name: b\n").unwrap();
    let args = MockArgs {
        config: Some(file.clone()),
        ttft_ms: Some(77),
        ..MockArgs::default()
    };
    let cfgs = args.configs().unwrap();
    assert!(cfgs.iter().all(|c| c.ttft_ms == 77));
    let bad = MockArgs {
        config: Some(file),
        listen: Some("127.0.0.1:1".parse().unwrap()),
        ..MockArgs::default()
    };
    assert!(bad.configs().is_err());
    let default = MockArgs::default().configs().unwrap();
    assert_eq!(default[0].listen, Some("127.0.0.1:9001".parse().unwrap()));
    let single = dir.join("single.yaml");
    std::fs::write(&single, "name: solo\n").unwrap();
    let one = MockArgs {
        config: Some(single),
        ..MockArgs::default()
    }
    .configs()
    .unwrap();
    assert_eq!(one[0].listen, Some("127.0.0.1:9001".parse().unwrap()));
}

#[test]
fn example_config_file_parses() {
    let text = include_str!("../mocks.example.yaml");
    let mocks = ConfigFile::from_yaml(text).unwrap().into_mocks();
    let names: Vec<&str> = mocks.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["p-anthropic", "p-openai", "p-gemini"]);
    assert_eq!(
        mocks[0].faults.origin,
        switchyard_mock::WindowOrigin::FirstRequest
    );
    assert_eq!(mocks[1].faults.error_rate.as_ref().unwrap().fraction, 0.02);
}

#[tokio::test]
async fn wait_for_sees_calls_and_times_out_otherwise() {
    let mock = start(MockConfig::default()).await;
    assert!(
        !mock
            .wait_for(Duration::from_millis(50), |c| !c.is_empty())
            .await
    );
    post_chat(&mock).await;
    assert!(
        mock.wait_for(Duration::from_millis(50), |c| c.len() == 1)
            .await
    );
}

#[tokio::test]
async fn cut_non_streaming_body_is_torn_json_then_transport_error() {
    let mock = start(with_faults(FaultSet::fail_all(Fault::CutMidStream {
        after_deltas: 0,
    })))
    .await;
    let resp = post_chat(&mock).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.is_err(), "body must fail");
    let emb = reqwest::Client::new()
        .post(format!("{}/embeddings", mock.openai_base_url()))
        .json(&json!({"model": "e", "input": "ünïcödé text"}))
        .send()
        .await
        .unwrap();
    assert!(emb.bytes().await.is_err());
    assert_eq!(mock.calls()[1].status, 200);
}

#[tokio::test]
async fn record_limit_keeps_newest_records_and_counts_all() {
    let mock = start(MockConfig {
        record_limit: 3,
        ..MockConfig::default()
    })
    .await;
    for _ in 0..5 {
        let resp = post_chat(&mock).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    assert_eq!(mock.call_count(), 5);
    let seqs: Vec<u64> = mock.calls().iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [2, 3, 4]);
    assert!(
        mock.calls()
            .iter()
            .all(|c| c.finished_at.is_some() && c.status == 200)
    );
    assert_eq!(mock.stats().calls, 5);
}
