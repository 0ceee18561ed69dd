//! `switchyard crdgen`: writes `crds/*.yaml` from the Rust types.

use std::path::Path;

/// Writes every CRD into `out_dir`, one file per kind.
pub(crate) fn write(out_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out_dir)?;
    for (file, crd) in switchyard_api::crd::all() {
        let path = out_dir.join(file);
        std::fs::write(&path, switchyard_api::crd::to_yaml(&crd)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
