//! The `helm` executable, driven with the user's kubeconfig and context.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Helm 3.14 brought `--reset-then-reuse-values`, which `rivora upgrade`
/// uses; Helm 4 has it too.
pub const MIN_VERSION: (u32, u32) = (3, 14);

#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    #[error(
        "rivora drives Helm, and there is no `helm` executable on PATH: install Helm {}.{} or newer (https://helm.sh/docs/intro/install/; `make chart-tools` puts one in target/tools/bin), or pass --helm PATH",
        MIN_VERSION.0, MIN_VERSION.1
    )]
    NotFound,
    #[error("{path}: not an executable helm ({source})")]
    Spawn {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is Helm {found}: rivora needs {}.{} or newer", MIN_VERSION.0, MIN_VERSION.1)]
    TooOld { path: String, found: String },
    #[error("helm {args} failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// Where helm is: `explicit` (--helm), else `$RIVORA_HELM`, else the first
/// `helm` on PATH.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, HelmError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("RIVORA_HELM").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("helm"))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or(HelmError::NotFound)
}

/// "v3.14.2", "v4.1.4+g05fa379" -> (major, minor).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let v = v.trim().strip_prefix('v').unwrap_or(v.trim());
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

pub struct Helm {
    pub bin: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
    pub version: String,
}

impl Helm {
    /// The helm at `bin`, checked to be new enough.
    pub fn new(
        bin: PathBuf,
        kubeconfig: Option<PathBuf>,
        context: Option<String>,
        namespace: String,
    ) -> Result<Self, HelmError> {
        let path = bin.display().to_string();
        let out = Command::new(&bin)
            .args(["version", "--template", "{{.Version}}"])
            .output()
            .map_err(|source| HelmError::Spawn {
                path: path.clone(),
                source,
            })?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        match parse_version(&version) {
            Some(v) if v >= MIN_VERSION => {}
            _ => {
                return Err(HelmError::TooOld {
                    path,
                    found: if version.is_empty() {
                        String::from_utf8_lossy(&out.stderr).trim().to_string()
                    } else {
                        version
                    },
                })
            }
        }
        Ok(Self {
            bin,
            kubeconfig,
            context,
            namespace,
            version,
        })
    }

    /// Run `helm ARGS --namespace NS [--kubeconfig F] [--kube-context C]`;
    /// stdout on success, helm's own message on failure.
    pub fn run(&self, args: &[OsString]) -> Result<String, HelmError> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).arg("--namespace").arg(&self.namespace);
        if let Some(k) = &self.kubeconfig {
            cmd.arg("--kubeconfig").arg(k);
        }
        if let Some(c) = &self.context {
            cmd.arg("--kube-context").arg(c);
        }
        let shown = args
            .iter()
            .take(2)
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let out = cmd.output().map_err(|source| HelmError::Spawn {
            path: self.bin.display().to_string(),
            source,
        })?;
        if !out.status.success() {
            // Helm 4 logs its notes (a symlink followed, ...) at INFO on
            // stderr: keep only what says why it failed.
            let stderr: Vec<&str> = std::str::from_utf8(&out.stderr)
                .unwrap_or("")
                .lines()
                .filter(|l| !l.starts_with("level=INFO"))
                .collect();
            return Err(HelmError::Failed {
                args: shown,
                stderr: stderr.join("\n").trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("v4.1.4"), Some((4, 1)));
        assert_eq!(parse_version("v3.14.2+g123"), Some((3, 14)));
        assert_eq!(parse_version("3.9.0"), Some((3, 9)));
        assert_eq!(parse_version(""), None);
        assert!(parse_version("v3.13.3").unwrap() < MIN_VERSION);
        assert!(parse_version("v4.0.0").unwrap() >= MIN_VERSION);
    }
}
