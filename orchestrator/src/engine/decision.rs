//! What a stage's turn comes to, as values: the facts a stage's rules ask the store for before
//! they decide ([`Need`], answered by [`Facts`]), and what they decide ([`Decision`]). The
//! rules ([`super::stages`]) only return these; the driver's effect runner
//! ([`super::effects`]) reads the facts, applies the decision to the saga's record, queues its
//! events and writes, and tells the driver's loop how to go on ([`Turned`]).

use saga_dsl::StepKind;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::model::task::TaskRef;
use crate::model::{Millis, Saga, SagaStatus};
use crate::store::{NewEvent, NewSaga, TaskOutcome};

/// A fact a stage's rules need from the store before they can decide: named by the rules,
/// read by the runner. A plain call needs none, so the hot path reads nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Need {
    /// Nothing: the saga's record is enough.
    Nothing,
    /// The payload of this signal, if the saga received it.
    Signal(String),
    /// The record of this child saga, if it exists.
    Child(Uuid),
    /// Only the status of this child saga, if it exists.
    ChildStatus(Uuid),
    /// What the participant of a call waiting for its callback reported, if it has.
    Task(TaskRef),
}

/// The store's answer to a [`Need`], in the same variant.
#[derive(Debug, Clone)]
pub(super) enum Facts {
    /// Nothing was asked.
    Nothing,
    /// The payload of the signal asked for, or `None` if it has not come.
    Signal(Option<Value>),
    /// The child saga asked for, or `None` if it was never created.
    Child(Option<Box<Saga>>),
    /// The child's status, or `None` if it was never created.
    ChildStatus(Option<SagaStatus>),
    /// The participant's report, if it came.
    Task(Option<TaskOutcome>),
}

/// What a stage's turn comes to: the one value its kind's rules return.
#[derive(Debug)]
pub(super) enum Decision {
    /// The stage calls its action (or its compensation): the runner writes it ahead and calls.
    Call,
    /// Nothing changes on this turn.
    Unchanged,
    /// The stage's action ends without a call.
    Settle(Settle),
    /// The stage starts waiting (`WAITING`), written with whatever comes next; a sleep's wake
    /// time becomes the saga's due time.
    Wait(Wait),
    /// The stage waits for a signal: the saga is given back until it comes (or the timeout).
    AwaitSignal {
        /// The signal.
        signal: String,
        /// The wait that starts on this turn, if it was not waiting already.
        starts: Option<Wait>,
    },
    /// A parallel group starts: its branches' rows are added (unless a refused write left them
    /// already), it runs, and an empty one succeeds at once.
    StartGroup(Vec<BranchStart>),
    /// A child stage creates its child saga under the saga's lease, then gives the saga back
    /// until the child ends.
    StartChild {
        /// The child saga to create (its trace context is the runner's to add).
        child: Box<NewSaga>,
        /// The wait that starts on this turn, committed before the child may exist; `None`
        /// when the stage's wait was committed but its child not.
        starts: Option<Wait>,
    },
    /// A child stage waits for its child saga, last seen in `seen`, to end: the saga is given
    /// back until it does.
    AwaitChild {
        /// The child.
        child: Uuid,
        /// Its status when last read.
        seen: SagaStatus,
    },
    /// Going back, a child stage undoes its child.
    UndoChild {
        /// The child.
        child: Uuid,
        /// How.
        undo: ChildUndo,
    },
    /// The call waiting for its callback ended, as reported or by its deadline: its attempt
    /// is recorded as a call's result would be.
    TaskEnded {
        /// The attempt.
        attempt: u32,
        /// How.
        end: TaskEnd,
    },
    /// The call waits on for its callback: the saga is given back until the report or the
    /// deadline.
    AwaitTask {
        /// The attempt waited for.
        task: TaskRef,
        /// The wait's deadline.
        deadline: Millis,
    },
}

impl Decision {
    /// The stage succeeds with `output`; its `step.succeeded` event carries `data`.
    pub(super) fn succeed(stage: &str, output: Value, data: Value) -> Self {
        Self::Settle(Settle {
            end: End::Succeeded(output),
            event: NewEvent::step("step.succeeded", stage, data),
            taken: None,
        })
    }

    /// The stage is skipped: its condition is false.
    pub(super) fn skip(stage: &str) -> Self {
        Self::Settle(Settle {
            end: End::Skipped,
            event: NewEvent::step("step.skipped", stage, json!({})),
            taken: None,
        })
    }

    /// The stage fails permanently without a call, with `error`.
    pub(super) fn refuse(stage: &str, error: impl Into<String>) -> Self {
        let error = error.into();
        let data = json!({"attempt": 0, "error": error, "outcome": "failed"});
        Self::Settle(Settle {
            event: NewEvent::step("step.failed", stage, data),
            end: End::Failed(error),
            taken: None,
        })
    }
}

/// A stage's action ended without a call.
/// How a wait for a callback ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum TaskEnd {
    /// The participant reported.
    Reported(TaskOutcome),
    /// The deadline passed first: the outcome is unknown.
    TimedOut,
}

#[derive(Debug)]
pub(super) struct Settle {
    /// How it ended.
    pub(super) end: End,
    /// The event that says so.
    pub(super) event: NewEvent,
    /// A signal taken on the turn its wait began: the row records it as waited for, begun now.
    pub(super) taken: Option<String>,
}

impl Settle {
    /// The same, for a signal `signal` taken on the turn its wait began.
    pub(super) fn taken(mut self, signal: String) -> Self {
        self.taken = Some(signal);
        self
    }
}

/// How an action that was not called ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum End {
    /// `SUCCEEDED`, with this output.
    Succeeded(Value),
    /// `SKIPPED`: its condition is false.
    Skipped,
    /// `FAILED` for good, with this error.
    Failed(String),
}

/// A wait that starts: the step becomes `WAITING` with what it waits for.
#[derive(Debug)]
pub(super) struct Wait {
    /// What it waits for.
    pub(super) until: Until,
    /// The `step.waiting` event.
    pub(super) event: NewEvent,
}

/// What a waiting step waits for, as its row records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Until {
    /// A time: a sleep's wake time.
    Time(Millis),
    /// A signal, until its timeout if it has one.
    Signal {
        /// The signal's name.
        name: String,
        /// When the wait ends without it.
        timeout_at: Option<Millis>,
    },
    /// A child saga's end.
    Child,
}

/// A branch of a group that starts: its name, kind and element (a mapped group's).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct BranchStart {
    /// The branch's name (its row is `group/branch`).
    pub(super) name: String,
    /// The kind of its call.
    pub(super) kind: StepKind,
    /// Its element of the list, for a mapped group.
    pub(super) element: Option<Value>,
}

/// How a child stage undoes its child as its parent goes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ChildUndo {
    /// Nothing to undo (the child never existed, or it is compensated): the stage's
    /// compensation succeeds.
    Nothing,
    /// The child completed: turn it to compensating, then wait for it.
    Compensate,
    /// The child runs (in `status`): ask it to cancel, then wait for it.
    Cancel(SagaStatus),
    /// Wait for the child as it is (in `seen`); a `problem` flags the parent for a person.
    Wait {
        /// The child's status.
        seen: SagaStatus,
        /// Why it cannot go back by itself, if it cannot.
        problem: Option<String>,
    },
}

/// How the driver's loop goes on after a stage's turn was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turned {
    /// Write the stage's call ahead and make it.
    Call,
    /// Decided without a call: plan again (written with whatever comes next).
    Continue,
    /// The saga was given back to wait: this driver is done with it.
    Parked,
}
