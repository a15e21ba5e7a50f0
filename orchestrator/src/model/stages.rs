//! The stages of a saga as people and clients read them (SPEC §7): one entry per stage of the
//! definition, with its kind, its status and what it waits for, a group's branches inside it.
//! Computed from the step log's rows, which hold a group's branches as rows of their own.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::StepStatus;
use super::{opt_time, Millis, PhaseRecord, Saga, StepKind, StepRecord};

/// What a stage is: the definition's own name ([`saga_dsl::StageKind`]).
pub use saga_dsl::StageKind;

/// One stage of a saga.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct StageRecord {
    /// Position in the definition, from 0 (also the index of its row in `steps`).
    pub index: u32,
    /// Name.
    pub name: String,
    /// What the stage is.
    pub kind: StageKind,
    /// For a `step` stage, its role: `compensatable`, `pivot` or `retriable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_kind: Option<StepKind>,
    /// The stage's forward progress: its action's, a wait's (`WAITING`) or, for a group,
    /// the group's as a whole.
    #[serde(flatten)]
    pub action: PhaseRecord,
    /// Its output, once it succeeded (a group's is an object keyed by branch name).
    pub output: Option<Value>,
    /// A sleep's wake time.
    #[serde(with = "opt_time", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub wake_at: Option<Millis>,
    /// The signal a signal stage waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// When a signal wait gives up.
    #[serde(with = "opt_time", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub timeout_at: Option<Millis>,
    /// The child saga of a child stage, once the stage started (`GET /v1/sagas/{child_id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_id: Option<Uuid>,
    /// Its compensation (`NOT_NEEDED` where there is nothing to undo).
    pub compensation: PhaseRecord,
    /// A group's branches, each like a step object, in the order they were started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches: Option<Vec<StepRecord>>,
}

/// How many sagas wait without a worker, by what they wait for (the `saga_waiting` gauge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitingCounts {
    /// Stages sleeping until their wake time.
    pub sleep: u64,
    /// Stages waiting for a signal.
    pub signal: u64,
    /// Stages waiting for their child saga (starting, running or compensating).
    pub child: u64,
    /// Calls waiting for their participant's callback (a task token).
    pub task: u64,
    /// Sagas started with a start time still ahead.
    pub scheduled: u64,
    /// Sagas waiting for room in a concurrency limit to start.
    pub limit: u64,
    /// Steps waiting for a rate limiter's token.
    pub rate: u64,
}

impl Saga {
    /// The saga with [`Saga::stages`] computed from its rows.
    pub fn with_stages(mut self) -> Self {
        self.stages = stages_of(self.id, &self.steps);
        self
    }
}

/// The stages of saga `id` with rows `steps`: every row that is not a branch, in order, each
/// group holding the rows of its branches (those that point at its row).
pub fn stages_of(id: Uuid, steps: &[StepRecord]) -> Vec<StageRecord> {
    steps
        .iter()
        .filter(|s| s.stage_index.is_none())
        .map(|s| {
            let kind = s.kind.stage();
            let branches = (kind == StageKind::Parallel).then(|| {
                steps
                    .iter()
                    .filter(|b| b.stage_index == Some(s.index))
                    .cloned()
                    .collect()
            });
            let started = !matches!(s.action.status, StepStatus::Pending | StepStatus::Skipped);
            let child_id =
                (kind == StageKind::Child && started).then(|| saga_dsl::child_saga_id(id, &s.name));
            StageRecord {
                index: s.index,
                name: s.name.clone(),
                kind,
                step_kind: (kind == StageKind::Step).then_some(s.kind),
                action: s.action.clone(),
                output: s.output.clone(),
                wake_at: s.wake_at,
                waiting_for: s.waiting_for.clone(),
                timeout_at: s.timeout_at,
                child_id,
                compensation: s.compensation.clone(),
                branches,
            }
        })
        .collect()
}
