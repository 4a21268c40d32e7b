//! [`VramBudget`]: how much of each GPU's memory Hangar may fill with models (`vram_budget`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

/// One GPU's budget as written: MiB, or a percentage of the GPU's total memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum BudgetAmount {
    /// This many MiB.
    Mib(u64),
    /// This percentage (in `(0, 100]`) of the GPU's total memory.
    #[serde(serialize_with = "percent")]
    Percent(f64),
}

fn percent<S: serde::Serializer>(p: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{p}%"))
}

impl BudgetAmount {
    /// The budget in MiB of a GPU with `total_mib` of memory (never above the total).
    pub fn resolve(self, total_mib: u64) -> u64 {
        match self {
            Self::Mib(mib) => mib.min(total_mib),
            // Percentages are at most 100, so the product stays within the total.
            Self::Percent(p) => ((total_mib as f64) * p / 100.0).floor() as u64,
        }
    }

    pub(crate) fn parse(value: &Value) -> Result<Self, String> {
        match value {
            Value::Number(n) => match n.as_u64() {
                Some(mib) if mib > 0 => Ok(Self::Mib(mib)),
                _ => Err(format!("a MiB budget must be a whole number >= 1, got {n}")),
            },
            Value::String(s) => {
                let p = s.trim().strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok());
                match p {
                    Some(p) if p > 0.0 && p <= 100.0 => Ok(Self::Percent(p)),
                    _ => Err(format!(
                        "a percentage must look like \"90%\" and lie in (0, 100], got {s:?}"
                    )),
                }
            }
            other => Err(format!(
                "expected MiB (a number) or a percentage (\"90%\"), got {}",
                crate::json_kind(other)
            )),
        }
    }
}

/// `vram_budget`: the GPU memory models may fill, for every GPU or per GPU index. A GPU
/// without a budget may be filled to its total.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct VramBudget {
    /// The budget of GPUs not listed in `per_gpu`.
    pub all: Option<BudgetAmount>,
    /// Budgets by GPU index (NVML's, as `nvidia-smi` shows it).
    pub per_gpu: BTreeMap<u32, BudgetAmount>,
}

impl VramBudget {
    /// Parses `20000`, `"90%"`, or `{"0": "90%", "1": 20000}`.
    ///
    /// # Errors
    /// `(path below vram_budget, message)` for the first problem.
    pub(crate) fn parse(value: &Value) -> Result<Self, (String, String)> {
        match value {
            Value::Object(map) => {
                let mut per_gpu = BTreeMap::new();
                for (key, amount) in map {
                    let index = key.parse::<u32>().map_err(|_| {
                        (key.clone(), "keys are GPU indices (\"0\", \"1\", …)".to_owned())
                    })?;
                    per_gpu
                        .insert(index, BudgetAmount::parse(amount).map_err(|m| (key.clone(), m))?);
                }
                Ok(Self { all: None, per_gpu })
            }
            amount => Ok(Self {
                all: Some(BudgetAmount::parse(amount).map_err(|m| (String::new(), m))?),
                per_gpu: BTreeMap::new(),
            }),
        }
    }

    /// The budget as it is written in config: one amount, or amounts by GPU index.
    pub fn to_json(&self) -> Value {
        match &self.all {
            Some(all) if self.per_gpu.is_empty() => serde_json::json!(all),
            _ => serde_json::json!(self.per_gpu),
        }
    }

    /// The budget in MiB of GPU `index`, whose memory is `total_mib`.
    pub fn mib_for(&self, index: u32, total_mib: u64) -> u64 {
        self.per_gpu
            .get(&index)
            .or(self.all.as_ref())
            .map_or(total_mib, |amount| amount.resolve(total_mib))
    }
}

/// The JSON Schema of `vram_budget` as written.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum VramBudgetSchema {
    /// The same budget for every GPU.
    All(AmountSchema),
    /// Budgets by GPU index (`"0"`, `"1"`); GPUs not listed have none.
    PerGpu(BTreeMap<String, AmountSchema>),
}

/// One budget as written.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum AmountSchema {
    /// MiB.
    Mib(u64),
    /// A percentage of the GPU's total memory, such as `"90%"`.
    Percent(String),
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_each_form_and_resolves_against_the_total() {
        let one = VramBudget::parse(&json!("90%")).unwrap();
        assert_eq!((one.mib_for(0, 10_000), one.mib_for(3, 81_559)), (9_000, 73_403));
        let mib = VramBudget::parse(&json!(20_000)).unwrap();
        assert_eq!((mib.mib_for(0, 81_559), mib.mib_for(1, 16_000)), (20_000, 16_000));
        let each = VramBudget::parse(&json!({ "1": "50%", "0": 1000 })).unwrap();
        assert_eq!(
            (each.mib_for(0, 8000), each.mib_for(1, 8000), each.mib_for(2, 8000)),
            (1000, 4000, 8000)
        );
        assert_eq!(serde_json::to_value(&each.per_gpu).unwrap(), json!({"0": 1000, "1": "50%"}));
    }

    #[test]
    fn refuses_what_is_not_a_budget() {
        let err = |v: Value| VramBudget::parse(&v).unwrap_err();
        assert!(err(json!("0%")).1.contains("(0, 100]"));
        assert!(err(json!("101%")).1.contains("(0, 100]"));
        assert!(err(json!("90")).1.contains("\"90%\""));
        assert!(err(json!(0)).1.contains(">= 1"));
        assert!(err(json!(1.5)).1.contains("whole number"));
        assert!(err(json!(true)).1.ends_with("got a boolean"));
        assert_eq!(err(json!({ "gpu0": 10 })).0, "gpu0");
        assert_eq!(err(json!({ "0": "x" })).0, "0");
    }
}
