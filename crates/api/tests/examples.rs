//! The shipped examples: every valid one loads, every invalid one fails with its stated error.

use std::path::{Path, PathBuf};

use switchyard_api::loader::{load_dir, load_texts};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/examples")
}

#[test]
fn examples_valid_folder_loads_every_object() {
    let loaded = load_dir(&examples()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.providers.len(), 6);
    assert_eq!(loaded.policies.len(), 2);
    assert_eq!(loaded.tenants.len(), 3);
    assert_eq!(
        loaded.warnings.len(),
        1,
        "the ConfigMap is skipped with a warning"
    );
    assert!(loaded.warnings[0].contains("skipped ConfigMap"));
    let agents = loaded
        .tenants
        .iter()
        .find(|t| t.metadata.name.as_deref() == Some("acme-agents"));
    assert_eq!(agents.and_then(|t| t.spec.parent.as_deref()), Some("acme"));
    assert!(
        loaded
            .providers
            .iter()
            .all(|p| p.metadata.namespace.as_deref() == Some("ai-platform"))
    );
}

#[test]
fn examples_invalid_each_rejected_with_expected_error() {
    let dir = examples().join("invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("invalid examples folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 25,
        "one invalid example per rule, found {}",
        files.len()
    );
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        let header = |key: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("# {key}: "))
                        .or_else(|| (l == format!("# {key}:")).then_some(""))
                })
                .unwrap_or_else(|| panic!("{} lacks a `# {key}:` line", file.display()))
                .to_owned()
        };
        let (field, expect) = (header("expect-field"), header("expect"));
        let errors = match load_texts([(file.as_path(), text.as_str())]) {
            Ok(_) => panic!("{} loaded but should fail with {expect:?}", file.display()),
            Err(e) => e.0,
        };
        assert_eq!(
            errors.len(),
            1,
            "{}: expected one error, got {errors:#?}",
            file.display()
        );
        let error = &errors[0];
        assert_eq!(
            error.field.as_deref().unwrap_or(""),
            field,
            "{}: field of {error}",
            file.display()
        );
        assert!(
            error.reason.contains(&expect),
            "{}: {error} lacks {expect:?}",
            file.display()
        );
        assert_eq!(error.source.file, file, "the error names its file");
    }
}

#[test]
fn loader_several_problems_all_reported_in_one_load() {
    let text = r#"
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata: {name: p-a}
spec:
  api: azure
  endpoint: https://x.example.com
  models: [{name: m}]
  limits:
    - {dimension: requests, amount: 0, period: 60s}
---
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata: {name: r}
spec:
  model: m
  providers: [{name: nowhere}]
---
apiVersion: switchyard.dev/v1alpha1
kind: TenantQuota
metadata: {name: t}
spec:
  parent: ghost
"#;
    let errors = load_texts([(Path::new("mixed.yaml"), text)])
        .expect_err("three broken objects")
        .0;
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 4, "{rendered:#?}");
    assert!(rendered[0].starts_with("mixed.yaml (document 0): LLMProvider default/p-a: spec.api:"));
    assert!(rendered[1].contains("spec.limits[0].amount"));
    assert!(
        rendered
            .iter()
            .any(|r| r.contains("(document 1): RoutingPolicy default/r: spec.providers[0].name"))
    );
    assert!(
        rendered
            .iter()
            .any(|r| r.contains("(document 2): TenantQuota default/t: spec.parent"))
    );
}

#[test]
fn loader_defaults_applied_before_cel_like_the_api_server() {
    // `serviceType` defaults to chat, so stickyChain without it is valid.
    let text = r#"
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata: {name: p}
spec: {api: openai, endpoint: "http://127.0.0.1:9", models: [{name: m}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata: {name: r}
spec: {model: m, strategy: stickyChain, providers: [{name: p}]}
"#;
    let loaded = load_texts([(Path::new("ok.yaml"), text)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.policies.len(), 1);
}

/// Issue 12 item 8: a limit with a zero period (any spelling) is refused by the schema's
/// pattern, like the API server does with the generated CRD; a period beyond the duration
/// range passes the pattern and is refused by the bucket verdict the router shares.
#[test]
fn loader_refuses_limits_that_cannot_be_built() {
    let tenant = |period: &str| {
        format!(
            "apiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: t}}\n\
             spec:\n  limits:\n    - {{dimension: requests, amount: 5, period: {period}}}\n"
        )
    };
    for zero in ["0s", "0m0s", "00h", "0ms"] {
        let errors = load_texts([(Path::new("t.yaml"), tenant(zero).as_str())])
            .expect_err(zero)
            .0;
        let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 1, "{zero}: {rendered:#?}");
        assert!(
            rendered[0].contains("spec.limits[0].period"),
            "{zero}: {rendered:#?}"
        );
    }
    // A reset time on a window that is not whole days passes the schema and CEL; the bucket
    // verdict refuses it.
    let text = "apiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: t}\n\
                spec:\n  limits:\n    - {dimension: requests, amount: 5, rule: fixedWindow, \
                period: 90m, resetAt: \"00:00\"}\n";
    let errors = load_texts([(Path::new("t.yaml"), text)])
        .expect_err("90m window with resetAt")
        .0;
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{rendered:#?}");
    assert_eq!(errors[0].field.as_deref(), Some("spec.limits[0].resetAt"));
    assert!(rendered[0].contains("whole days"), "{rendered:#?}");
    for ok in ["1ms", "60s", "0m10s", "1h0m", "10s"] {
        let loaded = load_texts([(Path::new("t.yaml"), tenant(ok).as_str())]);
        assert!(loaded.is_ok(), "{ok}: {:?}", loaded.err());
    }
}
