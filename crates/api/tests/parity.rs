//! Issue 12 items 10 and 7: the loader accepts and refuses what the API server
//! (apiextensions-apiserver 1.36) does, and the generated CRDs apply without warnings and read
//! well in `kubectl explain`; references, which only switchyard checks, say so; a duplicate
//! object's problems name the file that defined it first.

use std::path::Path;

use switchyard_api::loader::{LoadErrors, Manifests, load_texts};

fn tenant(amount: &str, labels: &str) -> String {
    format!(
        r#"
apiVersion: switchyard.dev/v1alpha1
kind: TenantQuota
metadata:
  name: t
  namespace: ns{labels}
spec:
  limits:
    - dimension: requests
      amount: {amount}
      period: 60s
"#
    )
}

fn load(text: &str) -> Result<Manifests, LoadErrors> {
    load_texts([(Path::new("t.yaml"), text)])
}

#[test]
fn amounts_above_int64_are_refused_as_the_api_server_does() {
    let errors = load(&tenant("9223372036854775808", "")).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].field.as_deref(), Some("spec.limits[0].amount"));
    assert!(errors[0].reason.contains("int64"), "{}", errors[0].reason);
    let m = load(&tenant("9223372036854775807", "")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        m.tenants[0].spec.limits[0].amount,
        9_223_372_036_854_775_807
    );
}

#[test]
fn integral_floats_are_accepted_as_the_api_server_does() {
    let m = load(&tenant("10.0", "")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.tenants[0].spec.limits[0].amount, 10);
    let errors = load(&tenant("10.5", "")).unwrap_err().0;
    assert_eq!(errors[0].field.as_deref(), Some("spec.limits[0].amount"));
}

#[test]
fn label_values_are_checked_client_side() {
    let bad = "\n  labels:\n    team: \"-not a value-\"";
    let errors = load(&tenant("5", bad)).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0].field.as_deref(),
        Some("metadata.labels[\"team\"]")
    );
    assert!(
        errors[0].reason.contains("not a valid label value"),
        "{}",
        errors[0].reason
    );
    let long = format!("\n  labels:\n    team: {}", "a".repeat(64));
    assert!(load(&tenant("5", &long)).is_err());
    let good = "\n  labels:\n    app.kubernetes.io/name: switchyard\n    empty: \"\"";
    load(&tenant("5", good)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn crds_carry_no_unknown_formats_and_one_line_paragraphs() {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(f) = map.get("format").and_then(|f| f.as_str())
                    && !["int32", "int64", "float", "double", "date-time", "byte"].contains(&f)
                {
                    out.push(format!("{path}: format {f}"));
                }
                if let Some(d) = map.get("description").and_then(|d| d.as_str()) {
                    for paragraph in d.split("\n\n") {
                        for line in paragraph.lines().skip(1) {
                            if !(line.starts_with("- ") || line.starts_with("* ")) {
                                out.push(format!("{path}: wrapped description line {line:?}"));
                            }
                        }
                    }
                }
                for (k, child) in map {
                    walk(child, &format!("{path}.{k}"), out);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut problems = Vec::new();
    for (file, crd) in switchyard_api::crd::all() {
        walk(&switchyard_api::crd::schema_json(&crd), file, &mut problems);
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(
        switchyard_api::crd::one_line_paragraphs("a wrapped\nsentence.\n\nNext:\n- one\n- two"),
        "a wrapped sentence.\n\nNext:\n- one\n- two"
    );
}

const POLICY: &str = r#"
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata:
  name: r
  namespace: ns
spec:
  model: m
  providers:
    - name: missing
"#;

#[test]
fn reference_problems_say_switchyard_checked_them() {
    let errors = load(POLICY).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .reason
            .ends_with("not found in namespace \"ns\" (checked by switchyard, not the API server)"),
        "{}",
        errors[0].reason
    );
}

/// Issue 12 item 7: two files define the same object. The duplicate is reported on the second
/// file; the first definition's own problems stay on the first file (they were attributed to
/// the second, and reported twice).
#[test]
fn duplicate_objects_keep_problems_on_the_file_that_defined_them() {
    let errors = load_texts([(Path::new("a.yaml"), POLICY), (Path::new("b.yaml"), POLICY)])
        .unwrap_err()
        .0;
    assert_eq!(errors.len(), 2, "{errors:#?}");
    let dup = errors
        .iter()
        .find(|e| e.reason.starts_with("duplicate object"))
        .unwrap_or_else(|| panic!("{errors:#?}"));
    assert_eq!(dup.source.file, Path::new("b.yaml"));
    assert!(
        dup.reason
            .contains("already defined in a.yaml (document 0)")
    );
    let reference = errors
        .iter()
        .find(|e| e.reason.contains("not found"))
        .unwrap_or_else(|| panic!("{errors:#?}"));
    assert_eq!(reference.source.file, Path::new("a.yaml"));
    assert_eq!(reference.field.as_deref(), Some("spec.providers[0].name"));
}
