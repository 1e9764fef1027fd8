//! Where the daemon side plugs its configuration validator into
//! `rivoractl config validate`.
//!
//! `rivoractl` must validate offline with exactly rivorad's validator, but
//! the config module lives with the daemon work. Until it lands, the
//! validator is registered at run time: `rivoractl`'s `main` calls
//! [`register_validator`] with a function that wraps
//! `rivora::config::validate_file` and renders its summary.

use std::path::Path;
use std::sync::OnceLock;

use thiserror::Error;

/// Validates a configuration file offline; `Ok` carries a human summary.
pub type ValidateFn = fn(&Path) -> anyhow::Result<String>;

static VALIDATOR: OnceLock<ValidateFn> = OnceLock::new();

#[derive(Debug, Error)]
pub enum ValidateError {
    #[error(
        "no configuration validator is built into this rivoractl \
         (rivora::api::cli_hooks::register_validator was never called)"
    )]
    NotRegistered,
    #[error("a configuration validator is already registered")]
    AlreadyRegistered,
    #[error("{path}: {source:#}")]
    Invalid { path: String, source: anyhow::Error },
}

/// Installs the validator; once per process.
pub fn register_validator(f: ValidateFn) -> Result<(), ValidateError> {
    VALIDATOR
        .set(f)
        .map_err(|_| ValidateError::AlreadyRegistered)
}

pub fn validator() -> Option<ValidateFn> {
    VALIDATOR.get().copied()
}

/// Runs the registered validator on `path`.
pub fn validate_config(path: &Path) -> Result<String, ValidateError> {
    let f = validator().ok_or(ValidateError::NotRegistered)?;
    f(path).map_err(|source| ValidateError::Invalid {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test owns the process-wide registration, so ordering between
    // tests cannot matter.
    #[test]
    fn unregistered_then_registered() {
        let p = Path::new("/nonexistent/rivora.yaml");
        assert!(matches!(
            validate_config(p),
            Err(ValidateError::NotRegistered)
        ));

        fn fake(path: &Path) -> anyhow::Result<String> {
            if path.ends_with("good.yaml") {
                Ok("2 VIPs, 6 backends".into())
            } else {
                anyhow::bail!("vips[0].port: must be 1-65535")
            }
        }
        register_validator(fake).unwrap();
        assert!(matches!(
            register_validator(fake),
            Err(ValidateError::AlreadyRegistered)
        ));
        assert_eq!(
            validate_config(Path::new("good.yaml")).unwrap(),
            "2 VIPs, 6 backends"
        );
        let err = validate_config(Path::new("bad.yaml"))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "bad.yaml: vips[0].port: must be 1-65535");
    }
}
