//! Where `secretRef`s resolve: Secrets held in memory (Kubernetes mode, from a reflector or
//! the operator's cache), then environment variables, then files (standalone mode).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use switchyard_api::common::SecretKeyRef;

/// Where `secretRef`s are resolved: Secrets held in memory (Kubernetes mode, from the
/// reflector), then environment variables, then files (standalone mode).
#[derive(Debug, Clone, Default)]
pub struct SecretSource {
    /// Folder holding `<secret-name>/<key>` files; environment variables are tried first.
    pub dir: Option<PathBuf>,
    /// Secrets read from the cluster, consulted first when present.
    pub memory: Option<Arc<InMemorySecrets>>,
}

/// Secret values held in memory, keyed by namespace and Secret name, then by data key.
/// `Debug` prints names only, never values.
#[derive(Clone, Default)]
pub struct InMemorySecrets(pub BTreeMap<(String, String), BTreeMap<String, String>>);

impl std::fmt::Debug for InMemorySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.0.keys().map(|(ns, name)| format!("{ns}/{name}")))
            .finish()
    }
}

impl SecretSource {
    /// Environment variable consulted for a reference: `SWITCHYARD_SECRET_<NAME>_<KEY>`,
    /// upper-cased, with `-` and `.` turned into `_`.
    pub fn env_name(r: &SecretKeyRef) -> String {
        let clean = |s: &str| s.to_ascii_uppercase().replace(['-', '.'], "_");
        format!("SWITCHYARD_SECRET_{}_{}", clean(&r.name), clean(&r.key))
    }

    /// [`Self::resolve`] for a reference made from `namespace`: the in-memory Secrets first
    /// (a Secret that exists there but lacks the key is an error, not a fall-through).
    pub fn resolve_in(&self, namespace: &str, r: &SecretKeyRef) -> Result<String, String> {
        if let Some(memory) = &self.memory
            && let Some(data) = memory.0.get(&(namespace.to_owned(), r.name.clone()))
        {
            return data
                .get(&r.key)
                .map(|v| v.trim().to_owned())
                .ok_or_else(|| format!("secret {namespace}/{} has no key {:?}", r.name, r.key));
        }
        self.resolve(r)
    }

    /// The secret's value, trimmed of surrounding whitespace, or a message saying where it
    /// was looked for.
    pub fn resolve(&self, r: &SecretKeyRef) -> Result<String, String> {
        let env = Self::env_name(r);
        if let Ok(value) = std::env::var(&env) {
            return Ok(value.trim().to_owned());
        }
        if let Some(dir) = &self.dir {
            let path = dir.join(&r.name).join(&r.key);
            if let Ok(value) = std::fs::read_to_string(&path) {
                return Ok(value.trim().to_owned());
            }
            return Err(format!(
                "secret {}/{} not found in ${env} nor in {}",
                r.name,
                r.key,
                path.display()
            ));
        }
        Err(format!("secret {}/{} not found in ${env}", r.name, r.key))
    }
}
