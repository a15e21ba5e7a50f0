//! Which server a command talks to, found the same way by every command: `--server`, then
//! `SAGA_SERVER` (clap reads both into the same argument), then the address the server running
//! on `--database-url` wrote beside the database ([`crate::discovery`]), then
//! [`DEFAULT_SERVER`]. When the server cannot be reached, the error says where its address
//! came from, so that a stale address file or a forgotten flag is plain to see.

use std::path::PathBuf;

use super::args::DEFAULT_SERVER;
use super::error::{client_error, CliError};
use crate::client::{ClientError, SagaClient};

/// A server to talk to, and where its address came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Its base URL.
    pub(crate) url: String,
    found: Found,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// `--server` or `SAGA_SERVER`.
    Given,
    /// The address file of the database's server.
    File(PathBuf),
    /// Nothing named one.
    Default,
}

impl Target {
    /// The server of a command given `given` (its `--server` or `SAGA_SERVER`) on the database
    /// `database_url`, if the command has one.
    pub(crate) fn find(given: Option<&str>, database_url: Option<&str>) -> Self {
        if let Some(url) = given.map(str::trim).filter(|u| !u.is_empty()) {
            return Self {
                url: url.to_owned(),
                found: Found::Given,
            };
        }
        if let Some((url, file)) = database_url.and_then(crate::discovery::read_address) {
            return Self {
                url,
                found: Found::File(file),
            };
        }
        Self {
            url: DEFAULT_SERVER.to_owned(),
            found: Found::Default,
        }
    }

    /// A client of the server, with `token`.
    pub(crate) fn client(&self, token: Option<String>) -> Result<SagaClient, CliError> {
        SagaClient::new(&self.url, token).map_err(|e| self.error(e))
    }

    /// A failure of a call to the server as a command error; one that did not reach it says
    /// where its address came from and how to give another.
    pub(crate) fn error(&self, e: ClientError) -> CliError {
        let unreachable = matches!(e, ClientError::Transport { .. });
        match (&self.found, unreachable) {
            (Found::File(file), true) => CliError::BadArgument(format!(
                "{e} (the address the server of this database wrote in {}: is that server \
                 still running? start it, or give --server URL or SAGA_SERVER)",
                file.display()
            )),
            (Found::Default, true) => CliError::BadArgument(format!(
                "{e} (the default server: no --server or SAGA_SERVER was given and no server \
                 runs on this --database-url; start one, or give --server URL or SAGA_SERVER)"
            )),
            _ => client_error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_given_server_wins_then_the_address_file_then_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("saga.db").display());
        assert_eq!(Target::find(None, Some(&db)).url, DEFAULT_SERVER);
        assert_eq!(Target::find(None, None).url, DEFAULT_SERVER);
        let file = crate::discovery::address_file(&db).unwrap();
        std::fs::write(&file, "http://127.0.0.1:18083\n").unwrap();
        assert_eq!(
            Target::find(None, Some(&db)),
            Target {
                url: "http://127.0.0.1:18083".to_owned(),
                found: Found::File(file),
            }
        );
        assert_eq!(
            Target::find(Some("http://10.0.0.5:9000"), Some(&db)).url,
            "http://10.0.0.5:9000"
        );
    }

    #[test]
    fn an_unreachable_server_says_where_its_address_came_from() {
        let refused = || ClientError::Transport {
            url: "http://127.0.0.1:8080/v1/definitions".to_owned(),
            attempts: 1,
            detail: "connection refused".to_owned(),
        };
        let default = Target::find(None, None).error(refused()).to_string();
        assert!(default.contains("connection refused"), "{default}");
        assert!(
            default.contains("the default server") && default.contains("--server URL"),
            "{default}"
        );
        let file = Target {
            url: "http://127.0.0.1:18083".to_owned(),
            found: Found::File(PathBuf::from("/srv/shop/saga.db.address")),
        };
        let said = file.error(refused()).to_string();
        assert!(
            said.contains("/srv/shop/saga.db.address") && said.contains("still running"),
            "{said}"
        );
        // Given explicitly, the address needs no story; an answer of the server is its own.
        let given = Target::find(Some("http://10.0.0.5:9000"), None);
        assert!(!given.error(refused()).to_string().contains("default"));
        let answered = ClientError::Api {
            status: 404,
            code: "not_found".to_owned(),
            message: "no saga has an id starting with dddddddd".to_owned(),
        };
        assert!(!file.error(answered).to_string().contains("still running"));
    }
}
