//! Appending to a saga's history, which is also the outbox: the one insert every command
//! written once for both databases shares.

use uuid::Uuid;

use super::sql::{Arg, Tx};
use crate::store::Result;

/// Appends an event to a saga's history (and so to the outbox), at the transaction's time.
pub(crate) async fn insert_event(
    tx: &mut Tx,
    saga: Uuid,
    kind: &str,
    step: Option<&str>,
    data: &serde_json::Value,
) -> Result<()> {
    let now = tx.now().await?;
    tx.exec(
        "INSERT INTO events (saga_id, at, type, step, data) VALUES ($1, $2, $3, $4, $5::jsonb)",
        &[
            Arg::Id(saga),
            Arg::Int(now),
            Arg::Str(kind),
            Arg::OptStr(step),
            Arg::Json(data),
        ],
    )
    .await?;
    Ok(())
}
