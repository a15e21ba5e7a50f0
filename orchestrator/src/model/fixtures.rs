//! Hand-built saga records for the model's and the planner's unit tests: no store, no engine,
//! no clock but [`NOW`].

use serde_json::json;

use super::{Millis, PhaseRecord, Saga, SagaStatus, StepKind, StepRecord, StepStatus};

/// The time the records are built at.
pub(crate) const NOW: Millis = 1_000_000;

/// A step whose action is in `action` (with one attempt made unless pending) and whose
/// compensation has not run.
pub(crate) fn step(index: u32, name: &str, kind: StepKind, action: StepStatus) -> StepRecord {
    let mut record = PhaseRecord::with_status(action);
    if action != StepStatus::Pending {
        record.attempts = 1;
        record.started_at = Some(NOW - 100);
    }
    if matches!(action, StepStatus::Failed | StepStatus::Unknown) {
        record.last_error = Some("boom".to_owned());
    }
    record.outcome_unknown = matches!(action, StepStatus::Unknown | StepStatus::Running);
    StepRecord {
        index,
        name: name.to_owned(),
        stage_index: None,
        branch: None,
        kind,
        action: record,
        output: (action == StepStatus::Succeeded).then(|| json!({ "from": name })),
        wake_at: None,
        waiting_for: None,
        timeout_at: None,
        retry_at: None,
        compensation: PhaseRecord::with_status(if kind == StepKind::Compensatable {
            StepStatus::Pending
        } else {
            StepStatus::NotNeeded
        }),
        budget_attempts: 0,
        budget_started_at: None,
        keys_saga_id: None,
    }
}

/// A saga in `status` with the given steps, due since just now.
pub(crate) fn saga(status: SagaStatus, steps: Vec<StepRecord>) -> Saga {
    Saga {
        id: uuid::Uuid::nil(),
        name: "s".to_owned(),
        version: 1,
        definition_hash: "h".to_owned(),
        status,
        needs_attention: false,
        blocked: false,
        cancel_requested: false,
        pause_requested: false,
        paused_from: None,
        pivot_started: false,
        pivot_reached: false,
        waiting_for: None,
        priority: 5,
        waiting_limit: None,
        wake_at: None,
        attrs: std::collections::BTreeMap::new(),
        input: json!({}),
        output: None,
        error: None,
        next_run_at: Some(NOW - 10),
        lease_owner: Some("w".to_owned()),
        lease_epoch: 1,
        lease_expires_at: None,
        created_at: NOW - 1_000,
        updated_at: NOW - 10,
        parent_id: None,
        parent_stage: None,
        forked_from: None,
        superseded_by: None,
        scheduled_at: None,
        traceparent: None,
        steps,
        stages: Vec::new(),
    }
}
