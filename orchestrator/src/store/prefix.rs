//! What the start of a saga id names in the log: one saga, none, or several. The HTTP API and
//! the CLI on the database both resolve prefixes here, so they name the same candidates.

use uuid::Uuid;

use super::{LogReads, Result};
use crate::model::IdPrefix;

/// How many candidates an ambiguous prefix names.
pub const CANDIDATES_SHOWN: usize = 5;

/// What a saga id prefix matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixMatch {
    /// No saga's id starts with it.
    None,
    /// Exactly one saga's does.
    One(Uuid),
    /// Several do: the first [`CANDIDATES_SHOWN`] of them, and whether there are more.
    Many {
        /// The first candidates, in id order.
        shown: Vec<Uuid>,
        /// Whether more sagas match than are shown.
        more: bool,
    },
}

impl PrefixMatch {
    /// The candidates of an ambiguous prefix as people read them (`a, b, …`); empty otherwise.
    pub fn candidates(&self) -> String {
        match self {
            Self::Many { shown, more } => {
                let mut names: Vec<String> = shown.iter().map(Uuid::to_string).collect();
                if *more {
                    names.push("…".to_owned());
                }
                names.join(", ")
            }
            _ => String::new(),
        }
    }
}

/// The sagas whose id starts with `prefix`: one range scan of the primary key.
pub async fn match_prefix<S: LogReads + ?Sized>(
    store: &S,
    prefix: &IdPrefix,
) -> Result<PrefixMatch> {
    let mut ids = store
        .saga_ids_with_prefix(prefix, CANDIDATES_SHOWN as u32 + 1)
        .await?;
    Ok(match ids.as_slice() {
        [] => PrefixMatch::None,
        [id] => PrefixMatch::One(*id),
        _ => {
            let more = ids.len() > CANDIDATES_SHOWN;
            ids.truncate(CANDIDATES_SHOWN);
            PrefixMatch::Many { shown: ids, more }
        }
    })
}
