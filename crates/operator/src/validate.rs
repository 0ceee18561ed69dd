//! Validation of cluster objects: what makes an object `Ready=False` and why.
//!
//! Read → **validate** → compute → apply: this module is the validation step, and it is the
//! router's as well: the verdict lives in [`switchyard_api::verdict`] and both binaries call
//! it, so an object the router rejects (or a dependent it leaves out) is never `Ready=True`
//! in status (issue 12 item 9). Here it is wired to the adapters' settings check
//! ([`switchyard_providers::adapter::check_spec`]).

pub use switchyard_api::verdict::{
    Eligibility, Judge, Judgement, Problem, SchemaChecker, SecretAccess, SecretIndex, Verdicts,
    World,
};

/// The judge both the operator and the router use: the shared verdict with the adapters'
/// settings check.
pub fn judge() -> Judge {
    Judge::new(switchyard_providers::adapter::check_spec)
}

/// Judges `world` once, with no accepted versions remembered (tests and one-shot callers).
pub fn validate(world: &World) -> Verdicts {
    judge().judge(world).verdicts
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use switchyard_api::LLMProvider;
    use switchyard_api::common::{SecretKeyRef, reason};

    fn provider(value: serde_json::Value) -> Arc<LLMProvider> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn validate_schema_invalid_stored_object_is_invalid_spec() {
        // Stored under an older CRD: the endpoint pattern is not met.
        let bad = provider(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": "bad", "namespace": "ns", "generation": 2, "uid": "u",
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"api": "openai", "endpoint": "not a url", "models": [{"name": "m"}]},
            "status": {"availability": 0.5},
        }));
        let good = provider(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": "good", "namespace": "ns", "uid": "v"},
            "spec": {"api": "openai", "endpoint": "https://ok.example.com", "models": [{"name": "m"}]},
            "status": {"availability": 0.5},
        }));
        let world = World {
            providers: vec![bad, good],
            ..World::default()
        };
        let verdicts = validate(&world);
        let problems = verdicts.problems("LLMProvider", "ns", "bad");
        assert!(!problems.is_empty());
        assert!(problems.iter().all(|p| p.reason == reason::INVALID_SPEC));
        assert!(
            problems
                .iter()
                .any(|p| p.field.as_deref() == Some("spec.endpoint")),
            "{problems:?}"
        );
        assert!(verdicts.problems("LLMProvider", "ns", "good").is_empty());
    }

    #[test]
    fn secret_index_resolve_names_missing_secret_or_key() {
        let mut index = SecretIndex::default();
        assert!(index.set_access(SecretAccess::Synced));
        assert!(index.insert("ns", "s", [("k".to_owned(), true), ("e".to_owned(), false)]));
        assert!(
            !index.insert("ns", "s", [("k".to_owned(), true), ("e".to_owned(), false)]),
            "same keys: no change"
        );
        let r = |name: &str, key: &str| SecretKeyRef {
            name: name.into(),
            key: key.into(),
        };
        assert_eq!(index.resolve("ns", &r("s", "k")), Ok(()));
        assert_eq!(
            index.resolve("ns", &r("s", "x")).unwrap_err(),
            (
                reason::SECRET_NOT_FOUND,
                "Secret \"s\" in namespace \"ns\" has no key \"x\"".to_owned()
            )
        );
        assert_eq!(
            index.resolve("ns", &r("s", "e")).unwrap_err().1,
            "Secret \"s\" in namespace \"ns\": key \"e\" is empty"
        );
        assert_eq!(
            index.resolve("other", &r("s", "k")).unwrap_err().1,
            "Secret \"s\" not found in namespace \"other\""
        );
        assert!(index.remove("ns", "s"));
        assert!(index.is_empty());
    }
}
