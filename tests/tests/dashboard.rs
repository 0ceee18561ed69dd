//! The Grafana dashboard (issue 17 item 2) against what the router really exposes.
//!
//! Every PromQL expression of `charts/switchyard/dashboards/switchyard.json` (the single
//! source; `docs/grafana/switchyard-dashboard.json` must be the same bytes) is parsed with the
//! `promql-parser` crate (the Rust port of Prometheus' own grammar). The metric names, label
//! matchers and `by`/`without`/`on`/`ignoring` labels it names are checked against a real
//! standalone router's `/metrics`, scraped after traffic that makes every family used by the
//! dashboard carry a series (a failing provider, a fallback, a queued request, a stream, priced
//! models), parsed with the `prometheus-parse` crate. A histogram `X` exposes `X_bucket` (with
//! `le`), `X_sum` and `X_count`; a counter only `X_total` (OpenMetrics). Grafana's
//! `label_values(metric, label)` variable queries are checked the same way.
//!
//! The dashboard uses router metrics only; the operator's (`switchyard_operator_*`) are not
//! on it, so the operator's registry is not scraped here.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{Policy, Provider, Setup, Stack, chat_body, send, serial};
use promql_parser::parser::{self, Expr, LabelModifier, VectorSelector};
use serde_json::Value;
use switchyard_mock::{Fault, FaultRule, FaultSet};

const MODEL: &str = "e2e-chat";

fn repo_file(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `expr` of every panel target (rows' nested panels included), with its panel title.
fn expressions(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("").to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_owned()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Grafana's interval variables as Prometheus durations, so the expression is plain PromQL.
/// Other variables (`$route`, ...) only appear inside regex matcher strings.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
}

/// What one expression names.
#[derive(Default, Debug)]
struct Names {
    /// Metric name → label names its selectors match on.
    selectors: BTreeMap<String, BTreeSet<String>>,
    /// Grouping labels (`by`, `without`, `on`, `ignoring`) with the metrics of the
    /// sub-expression they group.
    grouping: Vec<(String, BTreeSet<String>)>,
}

fn selector(vs: &VectorSelector, names: &mut Names, metrics: &mut BTreeSet<String>) {
    let name = vs
        .name
        .clone()
        .or_else(|| {
            vs.matchers
                .matchers
                .iter()
                .find(|m| m.name == "__name__")
                .map(|m| m.value.clone())
        })
        .expect("every selector names its metric");
    let labels = names.selectors.entry(name.clone()).or_default();
    for m in vs
        .matchers
        .matchers
        .iter()
        .chain(vs.matchers.or_matchers.iter().flatten())
    {
        if m.name != "__name__" {
            labels.insert(m.name.clone());
        }
    }
    metrics.insert(name);
}

fn modifier(m: &LabelModifier) -> &Vec<String> {
    match m {
        LabelModifier::Include(l) | LabelModifier::Exclude(l) => &l.labels,
    }
}

/// Walks `e`, recording selectors and grouping labels; returns the metrics under `e`.
fn visit(e: &Expr, names: &mut Names) -> BTreeSet<String> {
    let mut metrics = BTreeSet::new();
    match e {
        Expr::VectorSelector(vs) => selector(vs, names, &mut metrics),
        Expr::MatrixSelector(ms) => selector(&ms.vs, names, &mut metrics),
        Expr::Aggregate(a) => {
            metrics = visit(&a.expr, names);
            if let Some(p) = &a.param {
                metrics.extend(visit(p, names));
            }
            if let Some(m) = &a.modifier {
                for l in modifier(m) {
                    names.grouping.push((l.clone(), metrics.clone()));
                }
            }
        }
        Expr::Binary(b) => {
            metrics = visit(&b.lhs, names);
            metrics.extend(visit(&b.rhs, names));
            if let Some(m) = b.modifier.as_ref().and_then(|m| m.matching.as_ref()) {
                for l in modifier(m) {
                    names.grouping.push((l.clone(), metrics.clone()));
                }
            }
        }
        Expr::Unary(u) => metrics = visit(&u.expr, names),
        Expr::Paren(p) => metrics = visit(&p.expr, names),
        Expr::Subquery(s) => metrics = visit(&s.expr, names),
        Expr::Call(c) => {
            for a in &c.args.args {
                metrics.extend(visit(a, names));
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
    metrics
}

/// Sample names in the exposition → label names seen on them.
fn exposed(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("the exposition parses");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &scrape.samples {
        let labels: BTreeSet<String> = s.labels.keys().cloned().collect();
        match &s.value {
            // prometheus-parse folds `X_bucket` lines into one sample named `X`; `X_sum` and
            // `X_count` stay samples of their own.
            prometheus_parse::Value::Histogram(_) => {
                let mut with_le = labels.clone();
                with_le.insert("le".to_owned());
                out.entry(format!("{}_bucket", s.metric))
                    .or_default()
                    .extend(with_le);
            }
            _ => out.entry(s.metric.clone()).or_default().extend(labels),
        }
    }
    out
}

/// The label names `label_values(metric, label)` uses, from a Grafana variable query.
fn label_values(query: &str) -> Option<(String, String)> {
    let inner = query.strip_prefix("label_values(")?.strip_suffix(')')?;
    let (metric, label) = inner.split_once(',')?;
    Some((metric.trim().to_owned(), label.trim().to_owned()))
}

/// Traffic that gives every family the dashboard uses at least one series.
async fn drive(stack: &Stack) {
    // p1 fails its first two attempts (500): retries, a fallback to p2, error-class outcomes.
    for i in 0..4 {
        let r = stack.chat(MODEL, Some("proj-dashboard")).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
    }
    // A stream: time to first token.
    let s = stack
        .stream(
            "/v1/chat/completions",
            Some("proj-stream"),
            chat_body(MODEL, "stream please", true),
        )
        .await;
    assert_eq!(s.status, 200);
    // Two at once against a concurrency limit of 1: one waits in the tenant's queue.
    let a = send(
        stack
            .post("/v1/chat/completions")
            .json(&chat_body(MODEL, "first", false)),
    );
    let b = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send(
            stack
                .post("/v1/chat/completions")
                .json(&chat_body(MODEL, "second", false)),
        )
        .await
    };
    let (a, b) = tokio::join!(a, b);
    assert_eq!((a.status, b.status), (200, 200), "{} / {}", a.body, b.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_expressions_parse_and_name_only_exposed_metrics_and_labels() {
    let source = repo_file("charts/switchyard/dashboards/switchyard.json");
    assert_eq!(
        source,
        repo_file("docs/grafana/switchyard-dashboard.json"),
        "docs/grafana/switchyard-dashboard.json must be a copy of the chart's dashboards/switchyard.json"
    );
    let dashboard: Value = serde_json::from_str(&source).expect("dashboard JSON");

    let mut names = Names::default();
    let exprs = expressions(&dashboard);
    assert!(exprs.len() >= 20, "only {} expressions", exprs.len());
    let mut errors = Vec::new();
    for (title, expr) in &exprs {
        match parser::parse(&substitute(expr)) {
            Ok(ast) => {
                visit(&ast, &mut names);
            }
            Err(e) => errors.push(format!("panel {title:?}: {expr}: {e}")),
        }
    }
    assert!(
        errors.is_empty(),
        "expressions that do not parse:\n{}",
        errors.join("\n")
    );

    let mut variables = Vec::new();
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap();
            variables.push((
                v["name"].as_str().unwrap().to_owned(),
                label_values(q).unwrap_or_else(|| panic!("variable query {q}")),
            ));
        }
    }
    let kinds: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for needed in ["datasource", "route", "provider"] {
        assert!(
            kinds.contains(needed),
            "variable {needed} missing: {kinds:?}"
        );
    }

    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p1").pricing("1.00", "2.00").mock(|m| {
                // Slow enough that the second of two concurrent requests waits in the queue.
                m.latency_ms = 300;
                m.faults = FaultSet::rules([FaultRule::next(2, Fault::ServerError { status: 500 })])
            }))
            .provider(
                Provider::openai("p2")
                    .pricing("3.00", "4.00")
                    .mock(|m| m.latency_ms = 300),
            )
            .policy(Policy::chat(MODEL, &["p1", "p2"]))
            .tenant("limits: [{name: one, dimension: concurrency, amount: 1, rule: concurrency}]")
            .tenant("queue: {maxDepth: 5, deadline: 10s}"),
    )
    .await;
    drive(&stack).await;
    let text = stack.metrics().await;
    let exposed = exposed(&text);

    let mut unknown = Vec::new();
    for (metric, labels) in &names.selectors {
        match exposed.get(metric) {
            None => unknown.push(format!("metric {metric} is not exposed")),
            Some(have) => {
                for l in labels.difference(have) {
                    unknown.push(format!("{metric} has no label {l} (has {have:?})"));
                }
            }
        }
    }
    for (label, metrics) in &names.grouping {
        let under: BTreeSet<&String> = metrics
            .iter()
            .filter_map(|m| exposed.get(m))
            .flatten()
            .collect();
        if !under.contains(label) {
            unknown.push(format!("grouping label {label} is on none of {metrics:?}"));
        }
    }
    for (var, (metric, label)) in &variables {
        if !exposed.get(metric).is_some_and(|l| l.contains(label)) {
            unknown.push(format!(
                "variable {var}: label_values({metric}, {label}) is empty"
            ));
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard names what /metrics does not expose:\n{}\n\n/metrics:\n{text}",
        unknown.join("\n")
    );
    // The check is not vacuous: the dashboard covers the families the issue lists.
    for family in [
        "switchyard_requests_total",
        "switchyard_attempts_total",
        "switchyard_provider_availability",
        "switchyard_route_weight",
        "switchyard_affinity_breaks_total",
        "switchyard_ttft_seconds_bucket",
        "switchyard_upstream_latency_seconds_bucket",
        "switchyard_tenant_charged_total",
        "switchyard_quota_reservations_in_flight",
        "switchyard_queue_depth",
        "switchyard_quota_decisions_total",
        "switchyard_circuit_open",
        "switchyard_config_stale_seconds",
    ] {
        assert!(
            names.selectors.contains_key(family),
            "the dashboard does not use {family}"
        );
    }
}

#[test]
fn the_checker_refuses_unknown_metrics_labels_and_suffixes() {
    // The same walk as above on hand-written expressions and exposition, so a checker that
    // accepted anything would fail here.
    let text = "# TYPE switchyard_x counter\nswitchyard_x_total{provider=\"a\"} 1\n\
                # TYPE switchyard_h histogram\nswitchyard_h_bucket{provider=\"a\",le=\"1\"} 1\n\
                switchyard_h_bucket{provider=\"a\",le=\"+Inf\"} 1\nswitchyard_h_sum{provider=\"a\"} 1\n\
                switchyard_h_count{provider=\"a\"} 1\n# EOF\n";
    let exposed = exposed(text);
    let check = |expr: &str| -> Vec<String> {
        let mut names = Names::default();
        visit(&parser::parse(expr).unwrap(), &mut names);
        let mut bad = Vec::new();
        for (m, labels) in &names.selectors {
            match exposed.get(m) {
                None => bad.push(m.clone()),
                Some(have) => bad.extend(labels.difference(have).cloned()),
            }
        }
        for (l, ms) in &names.grouping {
            if !ms
                .iter()
                .filter_map(|m| exposed.get(m))
                .flatten()
                .any(|x| x == l)
            {
                bad.push(l.clone());
            }
        }
        bad
    };
    assert!(check("sum by (provider) (rate(switchyard_x_total[5m]))").is_empty());
    assert!(
        check("histogram_quantile(0.9, sum by (le, provider) (rate(switchyard_h_bucket[5m])))")
            .is_empty()
    );
    assert!(check("switchyard_h_count / switchyard_h_sum").is_empty());
    assert_eq!(
        check("rate(switchyard_x[5m])"),
        ["switchyard_x"],
        "counters end in _total"
    );
    assert_eq!(
        check("switchyard_h"),
        ["switchyard_h"],
        "a histogram has no bare series"
    );
    assert_eq!(check("switchyard_x_total{route=\"r\"}"), ["route"]);
    assert_eq!(check("sum by (tenant) (switchyard_x_total)"), ["tenant"]);
    assert_eq!(
        check("sum by (le) (switchyard_x_total)"),
        ["le"],
        "le only on buckets"
    );
    assert!(parser::parse("sum by (provider (rate(switchyard_x_total[5m]))").is_err());
}
