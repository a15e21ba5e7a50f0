//! Where the server of a database listens, for the commands that talk to it.
//!
//! A server on an SQLite database writes the address it listens on next to the database
//! (`saga.db` → `saga.db.address`, one line, `http://127.0.0.1:8080`) once it serves, and
//! removes the file when it stops. A command given the same `--database-url` (or run in the
//! same directory, with the default one) reads it, so `saga signal` finds a server on port
//! 18083 as surely as one on 8080. Only SQLite: a file has one engine at a time, so the file
//! names the one server; a PostgreSQL log may have many, and no file beside it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

/// The file a server on the SQLite database `database_url` writes its address in, or `None`
/// for a database that is not an SQLite file.
pub fn address_file(database_url: &str) -> Option<PathBuf> {
    let db = sqlite_path(database_url)?;
    let mut name = db.file_name()?.to_os_string();
    name.push(".address");
    Some(db.with_file_name(name))
}

/// The file of an SQLite database URL.
#[cfg(feature = "sqlite")]
fn sqlite_path(database_url: &str) -> Option<PathBuf> {
    crate::store::sqlite_file(database_url)
}

/// A build without the SQLite store opens no database that is a file, so no server of it
/// writes an address beside one.
#[cfg(not(feature = "sqlite"))]
fn sqlite_path(_database_url: &str) -> Option<PathBuf> {
    None
}

/// The base URL written in the address file of `database_url`, with the file it came from, if
/// there is one (a server runs there, or ran and was killed: a caller that cannot reach it
/// says where the address came from).
pub fn read_address(database_url: &str) -> Option<(String, PathBuf)> {
    let file = address_file(database_url)?;
    let text = std::fs::read_to_string(&file).ok()?;
    let url = text.lines().next()?.trim().to_owned();
    (url.starts_with("http://") || url.starts_with("https://")).then_some((url, file))
}

/// The base URL a client on this machine reaches a listener on `addr` at: a wildcard address
/// (`0.0.0.0`, `[::]`) is reached on loopback.
pub fn client_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The address file of a running server: written when made, removed when dropped (when the
/// server has stopped), unless another server has written its own address there since.
#[cfg(feature = "server")]
#[derive(Debug)]
pub(crate) struct AddressFile {
    path: PathBuf,
    url: String,
}

#[cfg(feature = "server")]
impl AddressFile {
    /// Writes the address of a server listening on `addr` next to the SQLite database
    /// `database_url`. `None` for another database, or when the file cannot be written (then
    /// commands find the server only through `--server`, which the log says).
    pub(crate) fn write(database_url: &str, addr: SocketAddr) -> Option<Self> {
        let path = address_file(database_url)?;
        let url = client_url(addr);
        match std::fs::write(&path, format!("{url}\n")) {
            Ok(()) => Some(Self { path, url }),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e,
                    "cannot write the server's address beside the database: commands will need \
                     --server or SAGA_SERVER to find it");
                None
            }
        }
    }

    /// The file's path.
    #[cfg(all(test, feature = "sqlite"))]
    fn path(&self) -> &std::path::Path {
        &self.path
    }
}

#[cfg(feature = "server")]
impl Drop for AddressFile {
    fn drop(&mut self) {
        if still_ours(&self.path, &self.url) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(feature = "server")]
fn still_ours(path: &std::path::Path, url: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.trim() == url)
}

#[cfg(all(test, feature = "server", feature = "sqlite"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_address_is_written_beside_the_database_and_removed_after() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("saga.db").display());
        assert_eq!(
            address_file(&url).unwrap(),
            dir.path().join("saga.db.address")
        );
        assert!(read_address(&url).is_none());
        let file = AddressFile::write(&url, "0.0.0.0:18083".parse().unwrap()).unwrap();
        assert_eq!(
            read_address(&url).unwrap(),
            ("http://127.0.0.1:18083".to_owned(), file.path().to_owned())
        );
        drop(file);
        assert!(read_address(&url).is_none());
        assert!(address_file("postgres://db/saga").is_none());
        assert_eq!(client_url("[::]:80".parse().unwrap()), "http://[::1]:80");
        assert_eq!(
            client_url("10.0.0.5:8080".parse().unwrap()),
            "http://10.0.0.5:8080"
        );
    }
}
