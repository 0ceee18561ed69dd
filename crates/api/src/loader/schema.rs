//! Schema, unknown-field and CEL validation of one object, as the API server performs it.
//!
//! The OpenAPI v3 schema comes from the generated CRD, so the loader and the cluster can never
//! disagree about types, bounds, enums or patterns. OpenAPI's `nullable` is rewritten into JSON
//! Schema's `type: [T, "null"]` before compiling with the `jsonschema` crate (draft 4, the
//! dialect OpenAPI 3.0 schemas follow). CEL rules run through `kube-cel`, which implements the
//! Kubernetes CEL library client-side.

use kube::core::cel::{CompiledSchema, Validator, compile_schema};
use serde_json::Value;

use super::Kind;
use crate::common::NAME_PATTERN;

/// One problem in one object.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) field: Option<String>,
    pub(crate) reason: String,
}

struct KindValidator {
    openapi: Value,
    json: Option<jsonschema::Validator>,
    cel: CompiledSchema,
}

/// Compiled validators for the three kinds; build once per load.
pub(crate) struct Validators {
    provider: KindValidator,
    policy: KindValidator,
    tenant: KindValidator,
    cel: Validator,
}

impl Validators {
    pub(crate) fn new() -> Self {
        let build = |crd| {
            let openapi = crate::crd::schema_json(&crd);
            let json = jsonschema::draft4::new(&nullable_to_union(&openapi)).ok();
            let cel = compile_schema(&openapi);
            KindValidator { openapi, json, cel }
        };
        use kube::CustomResourceExt;
        Validators {
            provider: build(crate::crd::finish(crate::LLMProvider::crd())),
            policy: build(crate::crd::finish(crate::RoutingPolicy::crd())),
            tenant: build(crate::crd::finish(crate::TenantQuota::crd())),
            cel: Validator::new(),
        }
    }

    /// All schema, unknown-field and CEL problems of `value` as a `kind`.
    pub(crate) fn check(&self, kind: Kind, value: &Value) -> Vec<Problem> {
        let v = match kind {
            Kind::Provider => &self.provider,
            Kind::Policy => &self.policy,
            Kind::Tenant => &self.tenant,
        };
        let mut problems = Vec::new();
        unknown_fields(&v.openapi, value, &mut String::new(), &mut problems);
        int64_range(value, &mut String::new(), &mut problems);
        match &v.json {
            Some(json) => {
                for error in json.iter_errors(value) {
                    problems.push(Problem {
                        field: Some(pointer_to_path(error.instance_path().as_str()))
                            .filter(|p| !p.is_empty()),
                        reason: error.to_string(),
                    });
                }
            }
            None => problems.push(Problem {
                field: None,
                reason: "internal: the CRD schema did not compile".to_owned(),
            }),
        }
        // CEL rules assume a schema-valid object (the API server evaluates them only then).
        if problems.is_empty()
            && let Err(errors) = self.cel.validate_compiled(&v.cel, value, None)
        {
            {
                for error in errors.into_vec() {
                    problems.push(Problem {
                        field: Some(error.field_path.clone()).filter(|p| !p.is_empty()),
                        reason: error.message.clone(),
                    });
                }
            }
        }
        problems
    }
}

/// 2^63 as a float: int64 holds −2^63 up to (not including) 2^63.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Integral floats (`10.0`, `1e3`) become integers, as the API server's JSON decoding does
/// before validating (an `integer` field given `10.0` is accepted and stored as `10`);
/// floats with a fraction stay and fail an `integer` schema as they do there.
pub(crate) fn normalize_numbers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && (-TWO_POW_63..TWO_POW_63).contains(&f)
            {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        Value::Object(map) => map.values_mut().for_each(normalize_numbers),
        _ => {}
    }
}

/// Integers outside int64, which the API server refuses (it stores every integer as int64)
/// although the Rust type (`u64`) and JSON Schema would take them.
fn int64_range(value: &Value, path: &mut String, out: &mut Vec<Problem>) {
    match value {
        Value::Number(n) => {
            let too_big = n.as_u64().is_some_and(|u| i64::try_from(u).is_err())
                || n.as_f64().is_some_and(|f| {
                    n.is_f64() && f.fract() == 0.0 && !(-TWO_POW_63..TWO_POW_63).contains(&f)
                });
            if too_big {
                out.push(Problem {
                    field: Some(path.clone()).filter(|p| !p.is_empty()),
                    reason: format!(
                        "{n} is out of range: integers must fit in int64 (at most \
                         9223372036854775807), as the API server stores them"
                    ),
                });
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                int64_range(item, path, out);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, child) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                int64_range(child, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Why `value` is not a valid label value, if it is not: at most 63 characters, empty or
/// alphanumerics with `-`, `_` and `.` inside (Kubernetes `IsValidLabelValue`).
fn label_value_problem(value: &str) -> Option<String> {
    let b = value.as_bytes();
    let ok = b.len() <= 63
        && (b.is_empty()
            || (b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))));
    (!ok).then(|| {
        format!(
            "{value:?} is not a valid label value: at most 63 characters, empty or \
             alphanumerics with '-', '_' or '.' inside, starting and ending with an alphanumeric"
        )
    })
}

/// Why `key` is not a valid label key, if it is not: an optional DNS-subdomain prefix (at
/// most 253 characters) and `/`, then a name as for values but non-empty.
fn label_key_problem(key: &str, subdomain: &impl Fn(&str) -> bool) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && subdomain(p));
    let name_ok = !name.is_empty() && label_value_problem(name).is_none();
    (!(prefix_ok && name_ok)).then(|| {
        format!(
            "{key:?} is not a valid label key: an optional DNS subdomain prefix and '/', then \
             a name of at most 63 alphanumerics with '-', '_' or '.' inside"
        )
    })
}

/// Checks `metadata.name`, `metadata.namespace` and `metadata.labels` as the API server does.
pub(crate) fn check_metadata(value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let name_re = regex_lite_name();
    match value.pointer("/metadata/name").and_then(Value::as_str) {
        None => problems.push(Problem {
            field: Some("metadata.name".to_owned()),
            reason: "name is required".to_owned(),
        }),
        Some(name) if name.len() > 253 || !name_re(name) => problems.push(Problem {
            field: Some("metadata.name".to_owned()),
            reason: format!(
                "{name:?} is not a valid name: lower-case alphanumerics, '-' and '.', \
                 starting and ending with an alphanumeric, at most 253 characters"
            ),
        }),
        Some(_) => {}
    }
    if let Some(ns) = value.pointer("/metadata/namespace") {
        let ok = ns
            .as_str()
            .is_some_and(|ns| ns.len() <= 63 && name_re(ns) && !ns.contains('.'));
        if !ok {
            problems.push(Problem {
                field: Some("metadata.namespace".to_owned()),
                reason: format!("{ns} is not a valid namespace name"),
            });
        }
    }
    if let Some(labels) = value.pointer("/metadata/labels") {
        match labels.as_object() {
            None => problems.push(Problem {
                field: Some("metadata.labels".to_owned()),
                reason: "labels must be a map of strings".to_owned(),
            }),
            Some(map) => {
                for (key, v) in map {
                    let field = Some(format!("metadata.labels[{key:?}]"));
                    if let Some(reason) = label_key_problem(key, &name_re) {
                        problems.push(Problem {
                            field: field.clone(),
                            reason,
                        });
                    }
                    let reason = match v.as_str() {
                        Some(text) => label_value_problem(text),
                        None => Some(format!("{v} is not a string")),
                    };
                    if let Some(reason) = reason {
                        problems.push(Problem { field, reason });
                    }
                }
            }
        }
    }
    problems
}

/// RFC 1123 subdomain check without a regex engine dependency in this crate.
fn regex_lite_name() -> impl Fn(&str) -> bool {
    // NAME_PATTERN documents the rule; this is its direct implementation.
    let _ = NAME_PATTERN;
    |name: &str| {
        !name.is_empty()
            && name.split('.').all(|label| {
                let bytes = label.as_bytes();
                !bytes.is_empty()
                    && bytes
                        .iter()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                    && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
                    && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
            })
    }
}

/// Reports object keys the schema does not declare, like strict field validation does.
///
/// A schema node with `properties` and without `additionalProperties` or
/// `x-kubernetes-preserve-unknown-fields` admits only its declared keys. `metadata` is the API
/// server's own and is not walked, except for its top-level keys.
fn unknown_fields(schema: &Value, value: &Value, path: &mut String, out: &mut Vec<Problem>) {
    match value {
        Value::Object(map) => {
            if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
                return;
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (key, child) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                if path == "apiVersion" || path == "kind" {
                    // Type metadata is checked before the schema (see `load_document`).
                } else if path == "metadata" {
                    check_metadata_keys(child, out);
                } else if let Some(child_schema) = props.and_then(|p| p.get(key)) {
                    unknown_fields(child_schema, child, path, out);
                } else if let Some(add) = additional.filter(|a| a.is_object()) {
                    unknown_fields(add, child, path, out);
                } else if props.is_some() && additional.is_none() {
                    let (parent, field) = match path.rsplit_once('.') {
                        Some((parent, field)) => (Some(parent.to_owned()), field.to_owned()),
                        None => (None, path.clone()),
                    };
                    out.push(Problem {
                        field: parent,
                        reason: format!("unknown field {field:?}"),
                    });
                }
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    unknown_fields(item_schema, item, path, out);
                    path.truncate(len);
                }
            }
        }
        _ => {}
    }
}

fn check_metadata_keys(meta: &Value, out: &mut Vec<Problem>) {
    const KNOWN: &[&str] = &[
        "name",
        "namespace",
        "labels",
        "annotations",
        "generateName",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "finalizers",
        "ownerReferences",
        "managedFields",
        "selfLink",
    ];
    if let Some(map) = meta.as_object() {
        for key in map.keys().filter(|k| !KNOWN.contains(&k.as_str())) {
            out.push(Problem {
                field: Some("metadata".to_owned()),
                reason: format!("unknown field {key:?}"),
            });
        }
    }
}

/// `/spec/limits/0/period` → `spec.limits[0].period`.
pub(crate) fn pointer_to_path(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    out
}

/// Rewrites OpenAPI 3.0 `nullable: true` into a JSON Schema type union, recursively.
fn nullable_to_union(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = serde_json::Map::with_capacity(map.len());
            for (key, value) in map {
                if key.starts_with("x-kubernetes-") || key == "nullable" {
                    continue;
                }
                out.insert(key.clone(), nullable_to_union(value));
            }
            if map.get("nullable") == Some(&Value::Bool(true))
                && let Some(Value::String(ty)) = map.get("type")
            {
                out.insert("type".to_owned(), serde_json::json!([ty, "null"]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(nullable_to_union).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_follow_the_api_server() {
        assert_eq!(label_value_problem(""), None);
        assert_eq!(label_value_problem("team-a_b.c"), None);
        assert_eq!(label_value_problem(&"a".repeat(63)), None);
        assert!(label_value_problem(&"a".repeat(64)).is_some());
        assert!(label_value_problem("-a").is_some());
        assert!(label_value_problem("a-").is_some());
        assert!(label_value_problem("a b").is_some());
        assert!(label_value_problem("a/b").is_some());
        let sub = regex_lite_name();
        assert_eq!(label_key_problem("app.kubernetes.io/name", &sub), None);
        assert_eq!(label_key_problem("tier", &sub), None);
        assert!(label_key_problem("Bad_Prefix/x", &sub).is_some());
        assert!(label_key_problem("example.com/", &sub).is_some());
    }

    #[test]
    fn integral_floats_become_integers_and_int64_bounds_hold() {
        let mut v = serde_json::json!({"a": 10.0, "b": [2.5, 1e3], "c": -4.0,
            "edge": 9_223_372_036_854_775_808.0});
        normalize_numbers(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": 10, "b": [2.5, 1000], "c": -4,
                "edge": 9_223_372_036_854_775_808.0})
        );
        assert!(v["a"].is_i64());
        let mut out = Vec::new();
        let v = serde_json::json!({"spec": {"limits": [{"amount": 9223372036854775808u64}],
            "ok": 9223372036854775807i64, "big": 1e20}});
        int64_range(&v, &mut String::new(), &mut out);
        let fields: Vec<_> = out.iter().map(|p| p.field.clone().unwrap()).collect();
        assert_eq!(fields, ["spec.big", "spec.limits[0].amount"]);
        assert!(out[1].reason.contains("int64"), "{}", out[1].reason);
    }

    #[test]
    fn pointer_to_path_indices_become_brackets() {
        assert_eq!(
            pointer_to_path("/spec/limits/0/period"),
            "spec.limits[0].period"
        );
        assert_eq!(pointer_to_path(""), "");
        assert_eq!(pointer_to_path("/spec"), "spec");
    }
}
