//! Search attributes, written once for both databases: a new saga's rows of `saga_attrs` for
//! the paths that create one with SQL of their own (a child, a fork), the list's condition on
//! them, and reading them back for shown sagas. The batch writers insert them with their
//! creates (`sqlite::writer_rows`, `postgres::writer`).

use std::collections::BTreeMap;

use uuid::Uuid;

use super::sql::{Arg, Dialect, Tx};
use crate::store::rows::LogRow;
use crate::store::Result;

/// Inserts `attrs` of the saga `id` inside `tx`; nothing for a saga without any.
pub(crate) async fn insert(tx: &mut Tx, id: Uuid, attrs: &[(String, String)]) -> Result<()> {
    for (name, value) in attrs {
        tx.exec(
            "INSERT INTO saga_attrs (saga_id, attr, value) VALUES ($1, $2, $3)",
            &[Arg::Id(id), Arg::Str(name), Arg::Str(value)],
        )
        .await?;
    }
    Ok(())
}

/// Appends to a statement over `sagas` ending in `WHERE …` one condition per attribute of
/// `attrs`, binding after the `args` already there: the saga's id is among those with that
/// value (a range of the `saga_attrs_value` index).
pub(crate) fn conditions<'a>(
    attrs: &'a [(String, String)],
    sql: &mut String,
    args: &mut Vec<Arg<'a>>,
) {
    for (name, value) in attrs {
        args.push(Arg::Str(name));
        args.push(Arg::Str(value));
        sql.push_str(&format!(
            " AND id IN (SELECT saga_id FROM saga_attrs WHERE attr = ${} AND value = ${})",
            args.len() - 1,
            args.len()
        ));
    }
}

/// The expression giving a listed saga's (`o`) attributes as a JSON object's text, `NULL` or
/// `{}` when it has none.
pub(crate) fn as_json(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => {
            "(SELECT json_group_object(a.attr, a.value) FROM saga_attrs a \
             WHERE a.saga_id = o.id) AS attrs"
        }
        Dialect::Postgres => {
            "(SELECT jsonb_object_agg(a.attr, a.value)::text FROM saga_attrs a \
             WHERE a.saga_id = o.id) AS attrs"
        }
    }
}

/// The attributes of the saga `id`, read inside `tx`.
pub(crate) async fn of_saga(tx: &mut Tx, id: Uuid) -> Result<BTreeMap<String, String>> {
    let rows = tx
        .all(
            "SELECT attr, value FROM saga_attrs WHERE saga_id = $1",
            &[Arg::Id(id)],
        )
        .await?;
    rows.iter()
        .map(|row| Ok((row.get("attr")?, row.get("value")?)))
        .collect()
}
