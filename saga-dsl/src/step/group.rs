//! A parallel group: branches that are calls, listed in the definition or mapped over a list.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::{Call, Rule, Step, StepKind};
use crate::{StepContext, StepError};

/// The most branches one parallel group may have: a mapped list longer than this fails the
/// group with a clear error rather than flooding the participants and the log.
pub const MAX_BRANCHES: usize = 1000;

/// How many branches of a mapped group run at once unless [`Step::max_concurrency`] says.
pub const DEFAULT_MAP_CONCURRENCY: usize = 16;

/// A branch of a parallel group as one saga has it: its name, and its element of the list for
/// a mapped group.
pub type BranchOf = (String, Option<Value>);

/// Names a mapped branch after its element.
pub(super) type BranchName = Arc<dyn Fn(&Value) -> Result<String, StepError> + Send + Sync>;

/// Where a parallel group's branches come from.
#[derive(Clone)]
enum Branches {
    /// Listed in the definition.
    Listed(Vec<Step<Call>>),
    /// One per element of a list computed when the saga reaches the group, each running the
    /// same call.
    Mapped {
        list: Rule<Vec<Value>>,
        name: BranchName,
        template: Box<Step<Call>>,
    },
}

/// A parallel group: [`Step::parallel`], [`Step::map`].
#[derive(Clone)]
pub struct Group {
    branches: Arc<Branches>,
    max_concurrency: usize,
}

impl Group {
    pub(super) fn listed(branches: Vec<Step<Call>>) -> Self {
        let max_concurrency = branches.len().max(1);
        Self {
            branches: Arc::new(Branches::Listed(branches)),
            max_concurrency,
        }
    }

    pub(super) fn mapped(list: Rule<Vec<Value>>, name: BranchName, template: Step<Call>) -> Self {
        Self {
            branches: Arc::new(Branches::Mapped {
                list,
                name,
                template: Box::new(template),
            }),
            max_concurrency: DEFAULT_MAP_CONCURRENCY,
        }
    }

    /// How many of its branches run at once (at least 1).
    pub fn max_concurrency(&self) -> usize {
        self.max_concurrency
    }

    /// Whether its branches are mapped from a list (rather than listed).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.branches, Branches::Mapped { .. })
    }

    /// The calls its branches make: each listed branch, or the one call of every mapped
    /// branch.
    pub fn calls(&self) -> Vec<&Step<Call>> {
        match &*self.branches {
            Branches::Listed(steps) => steps.iter().collect(),
            Branches::Mapped { template, .. } => vec![template],
        }
    }

    /// The kind the group ranks as: its first branch's.
    pub fn branch_kind(&self) -> Option<StepKind> {
        self.calls().first().map(|s| s.kind())
    }

    /// The call the branch `branch` makes (for a mapped group, the same for every branch);
    /// `None` for an unknown branch.
    pub fn branch(&self, branch: &str) -> Option<&Step<Call>> {
        match &*self.branches {
            Branches::Listed(steps) => steps.iter().find(|s| s.name() == branch),
            Branches::Mapped { template, .. } => Some(template),
        }
    }

    /// Its branches' names in order (with each one's element, for a mapped group), as they
    /// are for the saga `ctx` describes; `group` names the group in errors.
    pub fn branches(&self, group: &str, ctx: &StepContext) -> Result<Vec<BranchOf>, StepError> {
        match &*self.branches {
            Branches::Listed(steps) => Ok(steps.iter().map(|s| (s.name().to_owned(), None)).collect()),
            Branches::Mapped { list, name, .. } => list(ctx).and_then(|elements| {
                if elements.len() > MAX_BRANCHES {
                    return Err(StepError::permanent(format!(
                        "{group} maps over {} elements; a group has at most {MAX_BRANCHES} branches",
                        elements.len()
                    )));
                }
                let mut seen = HashSet::new();
                elements
                    .into_iter()
                    .map(|element| {
                        let branch = name(&element)?;
                        if !crate::definition::valid_ident(&branch) {
                            return Err(StepError::permanent(format!(
                                "{group}: the branch name {branch:?} of element {element} is not a \
                                 plain name (ASCII letters, digits, '_', '-', '.')"
                            )));
                        }
                        if !seen.insert(branch.clone()) {
                            return Err(StepError::permanent(format!(
                                "{group}: two elements are both named {branch:?}"
                            )));
                        }
                        Ok((branch, Some(element)))
                    })
                    .collect()
            }),
        }
    }
}

impl Step<Group> {
    /// How many of its branches run at once (at least 1).
    pub fn max_concurrency(self, n: usize) -> Self {
        self.map_body(|group| group.max_concurrency = n.max(1))
    }
}
