use super::*;
use serde_json::json;

fn spec(extra: Value) -> LLMProviderSpec {
    let mut v = json!({
        "api": "bedrock", "region": "us-east-1",
        "credentials": {"secretRef": {"name": "aws", "key": "secret"}, "accessKeyIdRef": {"name": "aws", "key": "id"}},
        "models": [{"name": "m"}]
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    serde_json::from_value(v).unwrap()
}

fn adapter(extra: Value) -> Bedrock {
    Bedrock::from_spec(
        &spec(extra),
        |r| {
            Ok(if r.key == "id" {
                "AKIDEXAMPLE".into()
            } else {
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into()
            })
        },
        reqwest::Client::new(),
    )
    .unwrap()
}

/// Re-signs what is sent (URL, headers without the signature, body) at the signing time
/// the request carries, as the service does, and compares the signatures.
fn resigned_matches(p: &Prepared) -> bool {
    let date = p.headers["x-amz-date"].to_str().unwrap();
    let time: SystemTime = chrono::NaiveDateTime::parse_from_str(date, "%Y%m%dT%H%M%SZ")
        .unwrap()
        .and_utc()
        .into();
    let mut headers = p.headers.clone();
    headers.remove(http::header::AUTHORIZATION);
    headers.remove("x-amz-date");
    let keys = credentials::Keys {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        session_token: None,
    };
    sign_request(&p.url, &mut headers, &p.body, &keys, "us-east-1", time).unwrap();
    headers[http::header::AUTHORIZATION] == p.headers[http::header::AUTHORIZATION]
}

async fn prepared(b: &Bedrock, model: &str, stream: bool) -> Prepared {
    let body = Bytes::from(
        json!({"model": model, "max_tokens": 8, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]})
        .to_string(),
    );
    b.prepare(Call {
        op: Operation::Messages,
        model,
        stream,
        body,
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn signed_and_sent_agree_for_every_model_id_form() {
    let b = adapter(json!({}));
    for (model, path) in [
        (
            "anthropic.claude-3-5-haiku-20241022-v1:0",
            "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke",
        ),
        (
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            "/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/invoke",
        ),
        (
            "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "/model/global.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke",
        ),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0",
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-7-sonnet-20250219-v1%3A0/invoke",
        ),
        (
            "meta.llama3-1-70b-instruct-v1:0",
            "/model/meta.llama3-1-70b-instruct-v1%3A0/converse",
        ),
    ] {
        let p = prepared(&b, model, false).await;
        assert_eq!(p.url.path(), path, "{model}");
        assert_eq!(
            p.url.host_str(),
            Some("bedrock-runtime.us-east-1.amazonaws.com")
        );
        // The one segment decodes back to the id.
        let seg = p.url.path_segments().unwrap().nth(1).unwrap();
        assert_eq!(
            percent_encoding::percent_decode_str(seg)
                .decode_utf8()
                .unwrap(),
            model
        );
        assert!(
            resigned_matches(&p),
            "{model}: signature over the sent request differs"
        );
        let auth = p.headers[http::header::AUTHORIZATION].to_str().unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
            "{auth}"
        );
        assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
        assert!(p.headers[http::header::AUTHORIZATION].is_sensitive());
    }
}

#[tokio::test]
async fn invoke_body_drops_model_and_stream_and_sets_version() {
    let b = adapter(json!({}));
    let p = prepared(&b, "anthropic.claude-3-5-haiku-20241022-v1:0", true).await;
    assert_eq!(
        p.url.path(),
        "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke-with-response-stream"
    );
    let v: Value = serde_json::from_slice(&p.body).unwrap();
    assert_eq!(v["anthropic_version"], BEDROCK_ANTHROPIC_VERSION);
    assert!(v.get("model").is_none() && v.get("stream").is_none());
    assert_eq!(p.headers[http::header::ACCEPT], eventstream::CONTENT_TYPE);
}

#[tokio::test]
async fn bedrock_api_setting_overrides_the_default() {
    let b = adapter(
        json!({"models": [{"name": "m", "upstreamName": "anthropic.claude-3-haiku-20240307-v1:0", "bedrockApi": "converse"}]}),
    );
    let p = prepared(&b, "anthropic.claude-3-haiku-20240307-v1:0", true).await;
    assert!(
        p.url.path().ends_with("/converse-stream"),
        "{}",
        p.url.path()
    );
    let v: Value = serde_json::from_slice(&p.body).unwrap();
    assert_eq!(v["inferenceConfig"]["maxTokens"], 8);
}

#[test]
fn default_api_follows_the_model_vendor() {
    assert_eq!(default_api("anthropic.claude-v2"), BedrockModelApi::Invoke);
    assert_eq!(
        default_api("eu.anthropic.claude-3-haiku-20240307-v1:0"),
        BedrockModelApi::Invoke
    );
    assert_eq!(
        default_api("arn:aws:bedrock:eu-west-1:1:inference-profile/eu.anthropic.claude-x"),
        BedrockModelApi::Invoke
    );
    assert_eq!(
        default_api("amazon.nova-pro-v1:0"),
        BedrockModelApi::Converse
    );
}

#[test]
fn region_and_irsa_errors_name_the_problem() {
    let e = Bedrock::from_spec(
        &spec(json!({"region": "us-east1"})),
        |_| Ok("x".into()),
        reqwest::Client::new(),
    )
    .unwrap_err();
    assert!(e.contains("\"us-east1\" is not an AWS region name"), "{e}");
    let mut s = spec(
        json!({"bedrock": {"roleArn": "arn:aws:iam::123456789012:role/r", "webIdentityTokenFile": "/nonexistent/token"}}),
    );
    s.credentials = None;
    let e = Bedrock::from_spec(&s, |_| Ok("x".into()), reqwest::Client::new()).unwrap_err();
    assert!(e.contains("/nonexistent/token does not exist"), "{e}");
}

#[test]
fn assume_role_answers_parse_and_errors_are_named() {
    let ok = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
      <AssumeRoleWithWebIdentityResult><Credentials>
        <SessionToken>tok</SessionToken><SecretAccessKey>sec</SecretAccessKey>
        <Expiration>2026-12-02T01:00:00Z</Expiration><AccessKeyId>ASIAX</AccessKeyId>
      </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"#;
    let (k, exp) = credentials::parse_assume_role(ok).unwrap();
    assert_eq!(
        (k.access_key_id.as_str(), k.session_token.as_deref()),
        ("ASIAX", Some("tok"))
    );
    assert_eq!(exp.to_rfc3339(), "2026-12-02T01:00:00+00:00");
    let err = r#"<ErrorResponse><Error><Type>Sender</Type><Code>ExpiredTokenException</Code><Message>Token expired</Message></Error></ErrorResponse>"#;
    assert_eq!(
        credentials::parse_assume_role(err).unwrap_err(),
        "ExpiredTokenException: Token expired"
    );
}

#[test]
fn invoke_stream_chunks_decode_to_anthropic_events() {
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue as H, Message};
    let inner = json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "x", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}});
    let payload =
        json!({"bytes": base64::engine::general_purpose::STANDARD.encode(inner.to_string())});
    let m = Message::new(Bytes::from(payload.to_string()))
        .add_header(Header::new(":message-type", H::String("event".into())))
        .add_header(Header::new(":event-type", H::String("chunk".into())));
    let mut raw = Vec::new();
    write_message_to(&m, &mut raw).unwrap();
    let b = adapter(json!({}));
    let mut d = b.stream_decoder(Operation::Messages, "anthropic.claude-v2");
    let items = d.push(&raw);
    let SseItem::Event(e) = &items[0] else {
        panic!("{items:?}")
    };
    assert_eq!(e.event.as_deref(), Some("message_start"));
    assert_eq!(serde_json::from_str::<Value>(&e.data).unwrap(), inner);
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    assert!(b.accepts_stream(&headers).is_err());
}

#[tokio::test]
async fn api_key_alone_is_a_bearer_token_without_signature() {
    let mut s = spec(json!({}));
    if let Some(c) = s.credentials.as_mut() {
        c.access_key_id_ref = None;
    }
    let b = Bedrock::from_spec(
        &s,
        |_| Ok("bedrock-api-key-123".into()),
        reqwest::Client::new(),
    )
    .unwrap();
    let p = prepared(&b, "anthropic.claude-3-5-haiku-20241022-v1:0", false).await;
    assert_eq!(
        p.headers[http::header::AUTHORIZATION],
        "Bearer bedrock-api-key-123"
    );
    assert!(p.headers[http::header::AUTHORIZATION].is_sensitive());
    assert!(p.headers.get("x-amz-date").is_none());
    assert!(!format!("{b:?}").contains("bedrock-api-key-123"));
}
