//! The [`Registry`]: the saga definitions a process knows, by name and version.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::flow::DeclaredLimit;
use crate::{DefinitionError, SagaDefinition};

/// The definitions a process can run. New sagas start on the latest version of a name; sagas
/// already in the log run on the exact version (and step-list hash) they were started with.
///
/// ```
/// use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};
/// async fn noop(_: StepContext) -> Result<(), StepError> { Ok(()) }
///
/// let mut registry = Registry::new();
/// registry.register(SagaDefinition::builder("s", 1).step(Step::pivot("a", noop)).build()?)?;
/// registry.register(SagaDefinition::builder("s", 2).step(Step::pivot("b", noop)).build()?)?;
/// assert_eq!(registry.latest("s").map(|d| d.version()), Some(2));
/// assert!(registry.get("s", 1).is_some());
/// # Ok::<(), saga_dsl::DefinitionError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Registry {
    defs: BTreeMap<(String, u32), Arc<SagaDefinition>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a definition; a second one with the same name and version is refused.
    pub fn register(&mut self, def: SagaDefinition) -> Result<&mut Self, DefinitionError> {
        let key = (def.name().to_owned(), def.version());
        if self.defs.contains_key(&key) {
            return Err(DefinitionError::AlreadyRegistered {
                name: key.0,
                version: key.1,
            });
        }
        self.defs.insert(key, Arc::new(def));
        Ok(self)
    }

    /// [`Registry::register`] by value, to build a registry in one expression:
    /// `Registry::new().with(checkout()?)?.with(refund()?)?`.
    pub fn with(mut self, def: SagaDefinition) -> Result<Self, DefinitionError> {
        self.register(def)?;
        Ok(self)
    }

    /// The definition with this name and version.
    pub fn get(&self, name: &str, version: u32) -> Option<&Arc<SagaDefinition>> {
        self.defs.get(&(name.to_owned(), version))
    }

    /// The highest version registered under `name`.
    pub fn latest(&self, name: &str) -> Option<&Arc<SagaDefinition>> {
        self.defs
            .range((name.to_owned(), 0)..=(name.to_owned(), u32::MAX))
            .next_back()
            .map(|(_, d)| d)
    }

    /// Every definition, ordered by name then version.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<SagaDefinition>> {
        self.defs.values()
    }

    /// Checks every child stage against the registry: the saga it starts must be registered,
    /// and a child stage before its saga's point of no return (which its compensation may have
    /// to undo) may start only a saga without one. The orchestrator checks this when it starts.
    pub fn check_children(&self) -> Result<(), DefinitionError> {
        for def in self.defs.values() {
            let point_of_no_return = def.point_of_no_return().unwrap_or(usize::MAX);
            for (index, child) in def.children() {
                let step = def.steps()[index].name().to_owned();
                let problem = match self.latest(child) {
                    None => format!("no saga {child:?} is registered"),
                    Some(c) if index < point_of_no_return && c.point_of_no_return().is_some() => {
                        format!(
                            "{child:?} has a point of no return, so compensating {:?} could \
                             not undo it; start it after {:?}'s own point of no return",
                            def.name(),
                            def.name()
                        )
                    }
                    Some(_) => continue,
                };
                return Err(DefinitionError::BadChild {
                    saga: def.name().to_owned(),
                    step,
                    problem,
                });
            }
        }
        Ok(())
    }

    /// Every limit and rate limiter the latest version of each definition declares, once
    /// each, ordered by name; a name two definitions declare differently is refused (a rate
    /// limiter may be shared when declared alike). The orchestrator checks this when it starts
    /// and writes the limits to its database.
    pub fn limits(&self) -> Result<Vec<DeclaredLimit>, DefinitionError> {
        let mut found: BTreeMap<String, (String, DeclaredLimit)> = BTreeMap::new();
        let latest = self
            .defs
            .values()
            .filter(|d| self.latest(d.name()).is_some_and(|l| Arc::ptr_eq(l, d)));
        for def in latest {
            let flow = def.flow();
            let saga = || def.name().to_owned();
            let declared = flow
                .max_running
                .iter()
                .map(|limit| DeclaredLimit::MaxRunning {
                    saga: saga(),
                    limit: limit.clone(),
                })
                .chain(flow.per_key.iter().map(|limit| DeclaredLimit::PerKey {
                    saga: saga(),
                    limit: limit.clone(),
                }))
                .chain(flow.rate_limiters.iter().cloned().map(DeclaredLimit::Rate));
            for limit in declared {
                match found.get(limit.name()) {
                    Some((_, same)) if *same == limit => {}
                    Some((first, _)) => {
                        return Err(DefinitionError::LimitConflict {
                            name: limit.name().to_owned(),
                            first: first.clone(),
                            second: def.name().to_owned(),
                        })
                    }
                    None => {
                        found.insert(limit.name().to_owned(), (def.name().to_owned(), limit));
                    }
                }
            }
        }
        Ok(found.into_values().map(|(_, limit)| limit).collect())
    }

    /// Whether no definition is registered.
    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }
}
