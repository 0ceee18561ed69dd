//! The committed CRDs (`crds/` and the Helm chart's copy) are the generated ones, and they are
//! structural schemas.

use std::path::Path;

use serde_json::Value;

const REGENERATE: &str = "cargo run -p switchyard -- crdgen";

#[test]
fn crds_committed_match_generated() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    for (file, crd) in switchyard_api::crd::all() {
        let generated = switchyard_api::crd::to_yaml(&crd).expect("render");
        let path = dir.join(file);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} is stale or missing; regenerate it with `{REGENERATE}` and commit the result",
            path.display()
        );
    }
}

/// The chart ships the CRDs as templates (so `helm upgrade` updates them); see
/// `crates/switchyard/src/crdgen.rs`.
const CHART_CRDS: &str = "../../charts/switchyard/templates/crds";
const CHART_GUARD: &str = "{{- if .Values.crds.install }}";
const CHART_END: &str = "{{- end }}";
/// What crdgen adds to the chart's copy and nothing else: the keep annotation and two labels.
const CHART_ANNOTATION: (&str, &str) = ("helm.sh/resource-policy", "keep");
const CHART_LABELS: [&str; 2] = ["app.kubernetes.io/name", "app.kubernetes.io/part-of"];

/// Removes `key` from the map at `metadata.<field>`, and the map itself once empty.
fn take_meta(doc: &mut Value, field: &str, key: &str) -> Option<Value> {
    let meta = doc.get_mut("metadata")?.as_object_mut()?;
    let map = meta.get_mut(field)?.as_object_mut()?;
    let taken = map.remove(key);
    if map.is_empty() {
        meta.remove(field);
    }
    taken
}

#[test]
fn crds_chart_copy_matches_generated() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRDS);
    for (file, crd) in switchyard_api::crd::all() {
        let path = dir.join(file);
        let stale = format!(
            "{} is stale or missing; regenerate it with `{REGENERATE}` and commit the result",
            path.display()
        );
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // Between the guard and the last `{{- end }}` the template is plain YAML.
        let body = text
            .split_once(CHART_GUARD)
            .and_then(|(_, rest)| rest.rsplit_once(CHART_END))
            .map(|(body, _)| body);
        let Some(body) = body else {
            panic!("{stale} (no `{CHART_GUARD}` ... `{CHART_END}` around the CRD)");
        };
        assert!(
            !body.contains("{{"),
            "{stale} (template syntax inside the CRD)"
        );
        let mut shipped: Value = serde_yaml::from_str(body).expect("chart CRD is YAML");
        assert_eq!(
            take_meta(&mut shipped, "annotations", CHART_ANNOTATION.0),
            Some(Value::from(CHART_ANNOTATION.1)),
            "{stale} (the chart's CRD must carry {}: {}, so `helm uninstall` keeps it)",
            CHART_ANNOTATION.0,
            CHART_ANNOTATION.1
        );
        for label in CHART_LABELS {
            take_meta(&mut shipped, "labels", label);
        }
        let generated = switchyard_api::crd::to_json(&crd);
        assert!(shipped == generated, "{stale}");
    }
}

/// Walks a schema node as the API server's structural-schema check does.
fn check_structural(node: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        problems.push(format!("{path}: schema node is not an object"));
        return;
    };
    let typed = map.contains_key("type")
        || map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !typed {
        problems.push(format!("{path}: no type"));
    }
    for forbidden in [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
    ] {
        if map.contains_key(forbidden) && !path.is_empty() {
            problems.push(format!(
                "{path}: uses {forbidden}, which structural schemas forbid here"
            ));
        }
    }
    if map.contains_key("properties") && map.contains_key("additionalProperties") {
        problems.push(format!(
            "{path}: properties together with additionalProperties"
        ));
    }
    if let Some(props) = map.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            check_structural(child, &format!("{path}.{name}"), problems);
        }
    }
    if let Some(add) = map.get("additionalProperties").filter(|a| a.is_object()) {
        check_structural(add, &format!("{path}.*"), problems);
    }
    if let Some(items) = map.get("items") {
        check_structural(items, &format!("{path}[]"), problems);
        if map.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
            let keys = map
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array);
            let required: Vec<&str> = items
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match keys {
                None => problems.push(format!("{path}: list-type map without list-map-keys")),
                Some(keys) => {
                    for key in keys.iter().filter_map(Value::as_str) {
                        if !required.contains(&key) {
                            problems.push(format!("{path}: list-map key {key:?} is not required"));
                        }
                    }
                }
            }
        }
    } else if map.get("type").and_then(Value::as_str) == Some("array") {
        problems.push(format!("{path}: array without items"));
    }
}

#[test]
fn crds_are_structural_v1_schemas() {
    for (file, crd) in switchyard_api::crd::all() {
        let value = serde_json::to_value(&crd).expect("json");
        assert_eq!(value["apiVersion"], "apiextensions.k8s.io/v1", "{file}");
        let versions = value["spec"]["versions"].as_array().expect("versions");
        assert_eq!(versions.len(), 1);
        let version = &versions[0];
        assert_eq!(
            version["subresources"]["status"],
            serde_json::json!({}),
            "{file}: status subresource"
        );
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .expect("printer columns")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        for wanted in ["Ready", "Status", "Age"] {
            assert!(columns.contains(&wanted), "{file}: printer column {wanted}");
        }
        assert_eq!(
            value["spec"]["names"]["categories"],
            serde_json::json!(["switchyard"])
        );
        assert!(
            value["spec"]["names"]["shortNames"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
        );
        let schema = &version["schema"]["openAPIV3Schema"];
        let mut problems = Vec::new();
        check_structural(schema, "", &mut problems);
        assert!(problems.is_empty(), "{file}: {problems:#?}");
        let conditions = &schema["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{file}");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"]),
            "{file}"
        );
        // Every spec field carries a description, so `kubectl explain` reads well.
        let mut undocumented = Vec::new();
        find_undocumented(&schema["properties"]["spec"], "spec", &mut undocumented);
        assert!(
            undocumented.is_empty(),
            "{file}: fields without description: {undocumented:?}"
        );
    }
}

fn find_undocumented(node: &Value, path: &str, out: &mut Vec<String>) {
    if node
        .get("description")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        out.push(path.to_owned());
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            find_undocumented(child, &format!("{path}.{name}"), out);
        }
    }
    if let Some(props) = node
        .get("items")
        .and_then(|items| items.get("properties"))
        .and_then(Value::as_object)
    {
        for (name, child) in props {
            find_undocumented(child, &format!("{path}[].{name}"), out);
        }
    }
}
