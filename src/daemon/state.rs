//! The daemon's own state that the maps cannot hold unambiguously:
//! operator drains. A drain for one VIP is a weight of 0 in that VIP's
//! Maglev slice (indistinguishable from a configured weight of 0), and a
//! backend that is both drained and down reads back as down alone, so
//! drains are kept in a small JSON file, rewritten atomically (temporary
//! file, fsync, rename, fsync of the directory) on every change and read
//! at start.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{BackendTarget, VipKey};

/// Where rivorad keeps its state by default.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/rivora";

/// The file's format version: a reader that does not know it refuses it
/// rather than guessing.
const FORMAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a rivorad drain file ({source}); move it away to start without drains")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: format {found}, this binary reads format {FORMAT}")]
    Format { path: PathBuf, found: u32 },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct DrainFile {
    format: u32,
    drains: Vec<DrainEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct DrainEntry {
    /// None: drained for every VIP.
    vip: Option<VipKey>,
    backend: BackendTarget,
}

pub type Drains = BTreeSet<(Option<VipKey>, BackendTarget)>;

/// The drain file under a state directory.
#[derive(Debug, Clone)]
pub struct DrainStore {
    path: PathBuf,
}

impl DrainStore {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join("drains.json"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The persisted drains; None if there is no file yet (a first start,
    /// or an upgrade from a binary that did not keep one).
    pub fn load(&self) -> Result<Option<Drains>, StateError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Read {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let f: DrainFile = serde_json::from_str(&text).map_err(|source| StateError::Parse {
            path: self.path.clone(),
            source,
        })?;
        if f.format != FORMAT {
            return Err(StateError::Format {
                path: self.path.clone(),
                found: f.format,
            });
        }
        Ok(Some(
            f.drains.into_iter().map(|d| (d.vip, d.backend)).collect(),
        ))
    }

    /// Replace the file with `drains`. A crash leaves the old file or the
    /// new one, never a torn one.
    pub fn save(&self, drains: &Drains) -> Result<(), StateError> {
        let err = |source| StateError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(err)?;
        let f = DrainFile {
            format: FORMAT,
            drains: drains
                .iter()
                .map(|(vip, backend)| DrainEntry {
                    vip: *vip,
                    backend: *backend,
                })
                .collect(),
        };
        let json = serde_json::to_vec_pretty(&f).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = self.path.with_extension("json.tmp");
        {
            let mut file = fs::File::create(&tmp).map_err(err)?;
            file.write_all(&json).map_err(err)?;
            file.write_all(b"\n").map_err(err)?;
            file.sync_all().map_err(err)?;
        }
        fs::rename(&tmp, &self.path).map_err(err)?;
        // The rename is durable only once the directory is.
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Ports, Protocol};

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "rivora-state-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn round_trip_and_missing_file() {
        let d = dir();
        let s = DrainStore::new(&d.join("sub"));
        assert!(s.load().expect("no file is not an error").is_none());
        let mut drains = Drains::new();
        let b = BackendTarget {
            addr: "10.0.0.1".parse().expect("addr"),
            port: 8080,
        };
        let v = VipKey {
            addr: "10.0.0.100".parse().expect("addr"),
            ports: Ports::One(80),
            proto: Protocol::Tcp,
        };
        drains.insert((None, b));
        drains.insert((Some(v), b));
        s.save(&drains).expect("save");
        assert_eq!(s.load().expect("load"), Some(drains.clone()));
        // Saving an empty set leaves an empty set, not "no file".
        s.save(&Drains::new()).expect("save empty");
        assert_eq!(s.load().expect("load"), Some(Drains::new()));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn refuses_garbage_and_unknown_format() {
        let d = dir();
        let s = DrainStore::new(&d);
        fs::write(s.path(), "not json").expect("write");
        assert!(matches!(s.load(), Err(StateError::Parse { .. })));
        fs::write(s.path(), r#"{"format": 2, "drains": []}"#).expect("write");
        assert!(matches!(s.load(), Err(StateError::Format { found: 2, .. })));
        let _ = fs::remove_dir_all(&d);
    }
}
