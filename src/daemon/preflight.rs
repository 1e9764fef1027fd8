//! What start-up checks before it touches a map or a link: every
//! interface the file names exists, the API token file is one rivorad
//! will accept, and every listener can be bound. A start that would fail
//! on any of these fails here, with the datapath as it was (a missing
//! token file once exited only after a new VIP was in the pinned maps and
//! the programs attached).

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use tokio::net::{TcpListener, TcpSocket};

use super::{net, DaemonError};
use crate::api::{BearerToken, ServeError};
use crate::config::NodeRuntime;

/// The TCP listeners, bound and listening, held from the check until the
/// API server binds its own (see [`Reserved::release`]): meanwhile no
/// other process can take the addresses.
#[derive(Debug)]
pub struct Reserved {
    listeners: Vec<TcpListener>,
}

impl Reserved {
    /// Close the reserved listeners, for the server to bind the same
    /// addresses at once.
    pub fn release(self) {
        drop(self.listeners);
    }
}

/// Check `node`'s interfaces, token file and listeners. Needs a tokio
/// runtime context (the listeners are tokio's, bound as the server binds
/// them: with SO_REUSEADDR, so a restart is not refused for the previous
/// run's connections in TIME_WAIT).
pub fn check(node: &NodeRuntime) -> Result<Reserved, DaemonError> {
    for ifc in &node.interfaces {
        net::interface(&ifc.name)?;
    }
    if let (Some(_), Some(token_file)) = (node.api.listen, &node.api.token_file) {
        // The loader the server uses: the same refusals (missing, empty,
        // readable by group or others), before anything is changed.
        BearerToken::from_file(token_file)?;
    }
    unix_socket_free(&node.api.socket)?;
    let mut listeners = Vec::new();
    for addr in node.api.listen.into_iter().chain(node.metrics.listen) {
        listeners.push(listen(addr)?);
    }
    Ok(Reserved { listeners })
}

fn listen(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let err = |source| ServeError::BindTcp { addr, source };
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(1024).map_err(err)
}

/// The Unix socket's path is free to bind: nothing there, or a socket
/// nobody answers on (left by a crash; the server replaces it).
fn unix_socket_free(path: &Path) -> Result<(), ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::SocketInUse {
                    path: path.to_path_buf(),
                });
            }
            Ok(())
        }
        Ok(_) => Err(ServeError::NotASocket {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ServeError::BindUnix {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::{ApiConf, MetricsConf};

    fn node(dir: &Path, listen: Option<SocketAddr>, metrics: Option<SocketAddr>) -> NodeRuntime {
        NodeRuntime {
            interfaces: vec![],
            api: ApiConf {
                socket: dir.join("rivorad.sock"),
                listen,
                token_file: listen.map(|_| dir.join("token")),
            },
            metrics: MetricsConf { listen: metrics },
            announce: Default::default(),
            l2: Default::default(),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_listener_in_use_is_refused_naming_its_address() {
        let rt = runtime();
        let _in = rt.enter();
        let dir = tempfile::tempdir().expect("tempdir");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr");
        let err = check(&node(dir.path(), None, Some(addr))).expect_err("in use");
        assert!(
            matches!(&err, DaemonError::Listener(ServeError::BindTcp { addr: a, .. }) if *a == addr),
            "{err:?}"
        );
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
        drop(taken);
        // Free now, and held: a second check meets the first's listener.
        let held = check(&node(dir.path(), None, Some(addr))).expect("free");
        assert!(check(&node(dir.path(), None, Some(addr))).is_err());
        held.release();
        check(&node(dir.path(), None, Some(addr)))
            .expect("free again")
            .release();
    }

    /// A token file rivorad accepts: its owner's alone.
    fn write_token(path: &std::path::Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, "t").expect("token");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }

    #[test]
    fn the_api_and_metrics_on_one_address_are_refused() {
        let rt = runtime();
        let _in = rt.enter();
        let dir = tempfile::tempdir().expect("tempdir");
        write_token(&dir.path().join("token"));
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let err = check(&node(dir.path(), Some(free), Some(free))).expect_err("twice");
        assert!(
            matches!(err, DaemonError::Listener(ServeError::BindTcp { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn a_missing_token_file_is_refused() {
        let rt = runtime();
        let _in = rt.enter();
        let dir = tempfile::tempdir().expect("tempdir");
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let err = check(&node(dir.path(), Some(free), None)).expect_err("no token");
        let text = err.to_string();
        let token: PathBuf = dir.path().join("token");
        assert!(text.contains(&token.display().to_string()), "{text}");
    }

    #[test]
    fn a_socket_in_use_or_a_file_in_its_place_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rivorad.sock");
        unix_socket_free(&path).expect("nothing there");
        let serving = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        assert!(matches!(
            unix_socket_free(&path),
            Err(ServeError::SocketInUse { .. })
        ));
        drop(serving);
        unix_socket_free(&path).expect("a stale socket is replaced");
        std::fs::remove_file(&path).expect("rm");
        std::fs::write(&path, "").expect("a file");
        assert!(matches!(
            unix_socket_free(&path),
            Err(ServeError::NotASocket { .. })
        ));
    }

    #[test]
    fn a_missing_interface_is_refused_by_name() {
        let rt = runtime();
        let _in = rt.enter();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut n = node(dir.path(), None, None);
        n.interfaces.push(crate::config::InterfaceConf {
            name: "rv-nosuch0".into(),
            xdp_mode: crate::model::XdpMode::Auto,
        });
        let err = check(&n).expect_err("no such interface");
        assert_eq!(err.to_string(), "interface rv-nosuch0: no such interface");
    }
}
