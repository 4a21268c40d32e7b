//! What start-up does with the enabled models: the stated order, and the models it leaves
//! unloaded because their type has fewer slots (`max_loaded_models`) than enabled models.
//!
//! The rule: enabled models load in config order; of each type, the first
//! `max_loaded_models` load and the rest are left unloaded (loaded on demand later), so
//! start-up never evicts one enabled model for another. (At run time the slot of a model
//! whose load fails goes to the next in order.) `hangard config check` warns of
//! the models left out ([`Config::slot_warnings`]).

use std::fmt;

use crate::{Config, ModelName, ModelType};

/// What start-up does with one enabled model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartUpChoice {
    /// Load it.
    Load,
    /// Leave it unloaded: its type's slots go to enabled models earlier in config order.
    NoSlot,
}

/// More models of one type are enabled than it has slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotWarning {
    /// The type.
    pub model_type: ModelType,
    /// Its `max_loaded_models`.
    pub slots: u32,
    /// The enabled models start-up loads, in config order.
    pub loaded: Vec<ModelName>,
    /// The enabled models start-up leaves unloaded, in config order.
    pub left: Vec<ModelName>,
}

impl fmt::Display for SlotWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names =
            |list: &[ModelName]| list.iter().map(ModelName::as_str).collect::<Vec<_>>().join(", ");
        let (ty, slots) = (self.model_type, self.slots);
        write!(
            f,
            "{} {ty} models are enabled but max_loaded_models.{ty} is {slots}: start-up loads {} \
             and leaves {} unloaded (loaded on demand, evicting another)",
            self.loaded.len() + self.left.len(),
            names(&self.loaded),
            names(&self.left),
        )
    }
}

impl Config {
    /// The enabled models in the order start-up takes them (config order), each with
    /// what start-up does with it.
    pub fn start_up_plan(&self) -> Vec<(ModelName, StartUpChoice)> {
        let mut taken = [0u32; ModelType::ALL.len()];
        self.models
            .iter()
            .filter(|m| m.enabled)
            .map(|m| {
                let used = &mut taken[m.model_type as usize];
                let choice = if *used < self.max_loaded_models.get(m.model_type).get() {
                    *used += 1;
                    StartUpChoice::Load
                } else {
                    StartUpChoice::NoSlot
                };
                (m.name.clone(), choice)
            })
            .collect()
    }

    /// One warning per model type with more enabled models than slots.
    pub fn slot_warnings(&self) -> Vec<SlotWarning> {
        let plan = self.start_up_plan();
        ModelType::ALL
            .into_iter()
            .filter_map(|ty| {
                let of_type = |choice: StartUpChoice| -> Vec<ModelName> {
                    plan.iter()
                        .filter(|(name, c)| {
                            *c == choice
                                && self.model(name.as_str()).is_some_and(|m| m.model_type == ty)
                        })
                        .map(|(name, _)| name.clone())
                        .collect()
                };
                let left = of_type(StartUpChoice::NoSlot);
                (!left.is_empty()).then(|| SlotWarning {
                    model_type: ty,
                    slots: self.max_loaded_models.get(ty).get(),
                    loaded: of_type(StartUpChoice::Load),
                    left,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config(value: serde_json::Value) -> Config {
        Config::from_value(&value).unwrap()
    }

    fn names(plan: &[(ModelName, StartUpChoice)], choice: StartUpChoice) -> Vec<&str> {
        plan.iter().filter(|(_, c)| *c == choice).map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn start_up_takes_enabled_models_in_config_order_up_to_each_types_slots() {
        // (llm slots, embedding slots, expected loaded, expected left)
        let table: [(u32, u32, &[&str], &[&str]); 4] = [
            (1, 1, &["a", "e1"], &["b", "c", "e2"]),
            (2, 1, &["a", "b", "e1"], &["c", "e2"]),
            (3, 2, &["a", "b", "c", "e1", "e2"], &[]),
            (9, 9, &["a", "b", "c", "e1", "e2"], &[]),
        ];
        for (llm, embedding, loaded, left) in table {
            let c = config(json!({
                "max_loaded_models": { "llm": llm, "embedding": embedding },
                "models": {
                    "a": { "backend": "stub", "enabled": true },
                    "off": { "backend": "stub" },
                    "e1": { "backend": "stub", "enabled": true, "labels": ["embedding"] },
                    "b": { "backend": "stub", "enabled": true },
                    "e2": { "backend": "stub", "enabled": true, "labels": ["embedding"] },
                    "c": { "backend": "stub", "enabled": true }
                }
            }));
            let plan = c.start_up_plan();
            let order: Vec<&str> = plan.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(order, ["a", "e1", "b", "e2", "c"], "config order, enabled only");
            let mut got = names(&plan, StartUpChoice::Load);
            got.sort_unstable();
            let mut want = loaded.to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "loaded with slots ({llm}, {embedding})");
            let mut got = names(&plan, StartUpChoice::NoSlot);
            got.sort_unstable();
            let mut want = left.to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "left with slots ({llm}, {embedding})");
            assert_eq!(c.slot_warnings().is_empty(), left.is_empty());
        }
    }

    #[test]
    fn a_warning_names_the_type_the_slots_and_every_model() {
        let c = config(json!({
            "models": {
                "chat": { "backend": "stub", "enabled": true },
                "chat-2": { "backend": "stub", "enabled": true },
                "bge": { "backend": "stub", "enabled": true, "labels": ["embedding"] }
            }
        }));
        let warnings = c.slot_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let w = &warnings[0];
        assert_eq!((w.model_type, w.slots), (ModelType::Llm, 1));
        assert_eq!(w.loaded, [ModelName::new("chat").unwrap()]);
        assert_eq!(w.left, [ModelName::new("chat-2").unwrap()]);
        let text = w.to_string();
        assert!(text.contains("2 llm models are enabled but max_loaded_models.llm is 1"), "{text}");
        assert!(text.contains("loads chat and leaves chat-2 unloaded"), "{text}");
    }
}
