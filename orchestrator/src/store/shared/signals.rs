//! Signals, written once for both databases: receiving one (first of a name wins), reading it
//! back for the saga's signal step, and making the saga due when one is waiting for it.

use serde_json::json;
use uuid::Uuid;

use super::events::insert_event;
use super::sql::{Arg, Reader, Tx};
use super::SqlBackend;
use crate::model::{Millis, SagaStatus};
use crate::store::rows::{parse_enum, parse_json, LogRow};
use crate::store::signals::{ReceivedSignal, SignalOutcome, SignalRequest};
use crate::store::{Result, StoreError};

/// Makes the saga due now if one of its steps waits for the signal `name` (and it is not due
/// already, nor paused: a paused saga keeps the signal and takes it once resumed); tells the
/// engines.
const DUE_IF_WAITING: &str = "UPDATE sagas SET next_run_at = $2, updated_at = $2 \
     WHERE id = $1 AND status <> 'PAUSED' AND (next_run_at IS NULL OR next_run_at > $2) AND EXISTS (SELECT 1 FROM \
     steps WHERE steps.saga_id = $1 AND steps.status = 'WAITING' AND steps.waiting_for = $3)";

/// Records a signal for a saga, under the saga's row lock: a signal step that starts waiting
/// at the same time either sees the signal or is made due by it.
pub(crate) async fn send<B: SqlBackend>(
    store: &B,
    req: SignalRequest<'_>,
) -> Result<SignalOutcome> {
    let id = req.saga;
    let mut tx = store.begin().await?;
    if !tx.lock_saga(id).await? {
        return Err(StoreError::NotFound(id));
    }
    let row = tx
        .opt("SELECT status FROM sagas WHERE id = $1", &[Arg::Id(id)])
        .await?
        .ok_or(StoreError::NotFound(id))?;
    let status: SagaStatus = parse_enum(&id.to_string(), &row.get::<String>("status")?)?;
    let before = tx
        .opt(
            "SELECT payload::text AS payload, idempotency_key FROM signals \
             WHERE saga_id = $1 AND name = $2",
            &[Arg::Id(id), Arg::Str(req.name)],
        )
        .await?;
    let outcome = if let Some(before) = before {
        let payload = parse_json(&id.to_string(), before.get("payload")?)?;
        let same = payload.as_ref() == Some(req.payload);
        let same_key = req.key.is_some()
            && before.get::<Option<String>>("idempotency_key")?.as_deref() == req.key;
        match (same, same_key) {
            (true, _) => SignalOutcome::AlreadyReceived,
            (false, true) => SignalOutcome::KeyReused,
            (false, false) => SignalOutcome::Conflict,
        }
    } else if status.is_terminal() || status == SagaStatus::Compensating {
        SignalOutcome::Refused(status)
    } else {
        record(&mut tx, req).await?;
        SignalOutcome::Received
    };
    store.commit(tx).await?;
    Ok(outcome)
}

/// Inserts the signal with its event, and makes the saga due if it waits for it.
async fn record(tx: &mut Tx, req: SignalRequest<'_>) -> Result<()> {
    let now = tx.now().await?;
    tx.exec(
        "INSERT INTO signals (saga_id, name, payload, idempotency_key, received_at) \
         VALUES ($1, $2, $3::jsonb, $4, $5)",
        &[
            Arg::Id(req.saga),
            Arg::Str(req.name),
            Arg::Json(req.payload),
            Arg::OptStr(req.key),
            Arg::Int(now),
        ],
    )
    .await?;
    let data = json!({"signal": req.name});
    insert_event(tx, req.saga, "signal.received", None, &data).await?;
    let due = tx
        .exec(
            DUE_IF_WAITING,
            &[Arg::Id(req.saga), Arg::Int(now), Arg::Str(req.name)],
        )
        .await?;
    if due > 0 {
        tx.announce_due().await?;
    }
    Ok(())
}

/// The signal `name` of a saga, if it has come.
pub(crate) async fn received(
    reader: Reader<'_>,
    saga: Uuid,
    name: &str,
) -> Result<Option<ReceivedSignal>> {
    let row = reader
        .opt(
            "SELECT payload::text AS payload, received_at FROM signals \
             WHERE saga_id = $1 AND name = $2",
            &[Arg::Id(saga), Arg::Str(name)],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let payload = parse_json(&saga.to_string(), row.get("payload")?)?.unwrap_or_default();
    Ok(Some(ReceivedSignal {
        payload,
        received_at: row.get("received_at")?,
    }))
}

/// Parks a saga given back while its step waits for the signal `name`: due now if the signal
/// has come, else at its deadline; only if nothing changed its row since (see
/// [`Store::park_signal_wait`](crate::store::EngineLog::park_signal_wait)).
pub(crate) async fn park<B: SqlBackend>(
    store: &B,
    saga: Uuid,
    name: &str,
    written: Millis,
    deadline: Option<Millis>,
) -> Result<bool> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let signalled = tx
        .opt(
            "SELECT 1 AS found FROM signals WHERE saga_id = $1 AND name = $2",
            &[Arg::Id(saga), Arg::Str(name)],
        )
        .await?
        .is_some();
    let due = if signalled { Some(now) } else { deadline };
    let changed = tx
        .exec(
            "UPDATE sagas SET next_run_at = $2 WHERE id = $1 AND next_run_at = $3 \
             AND lease_owner IS NULL",
            &[Arg::Id(saga), Arg::OptInt(due), Arg::Int(written)],
        )
        .await?;
    let woken = signalled && changed > 0;
    if woken {
        tx.announce_due().await?;
    }
    store.commit(tx).await?;
    Ok(woken)
}
