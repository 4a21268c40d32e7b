//! How many threads a context gets when the model sets no `gguf_n_threads`.
//!
//! [`available_cores`] is what this process may run on: the physical cores of its CPU
//! affinity mask (SMT siblings count once, as `llama-server` counts physical cores), capped
//! by the cgroup CPU quota ([`std::thread::available_parallelism`] reads both the mask and
//! the quota). [`CoreShare`] splits those cores between the contexts loaded at once: a
//! replica's share is the cores divided by the replicas of its own model plus the contexts of
//! the other models already loaded, at least one. llama.cpp fixes a context's thread count when
//! the context is created, so a model loaded alone keeps its share when another loads later;
//! the later one takes what is left.
//!
//! Why split at all: a context's threads synchronise at every graph node (OpenMP barriers that
//! spin), so two multi-threaded contexts on the same cores, or more threads than cores, make
//! each step wait for descheduled threads. On a 2-core machine llama.cpp's built-in default
//! of 4 threads made the tiny model 23× slower than one thread.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use hangar_config::ModelName;
use serde::Serialize;

/// Where a context's thread count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadsFrom {
    /// The model's `gguf_n_threads`.
    GgufNThreads,
    /// The replica's share of the cores ([`available_cores`] split between contexts).
    CoreShare,
}

/// A replica's threads: how many, why, and out of how many cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadPlan {
    pub(crate) threads: u32,
    pub(crate) from: ThreadsFrom,
    pub(crate) cores: u32,
}

/// The cores this process may use for computation: physical cores in its affinity mask,
/// capped by the CPU quota; at least 1.
pub fn available_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let physical = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| allowed_cpus(&status))
        .and_then(|cpus| {
            physical_cores(&cpus, |cpu, what| {
                std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
            })
        });
    physical.map_or(logical, |p| p.min(logical)).max(1)
}

/// The CPUs of `Cpus_allowed_list` in a `/proc/<pid>/status` text (`0-3,8,10-11`).
pub(crate) fn allowed_cpus(status: &str) -> Option<Vec<u32>> {
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?.trim();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<u32>().ok()?..=b.trim().parse().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Distinct physical cores among `cpus`, from each CPU's `physical_package_id` and
/// `core_id` as `topology` reads them; `None` when a CPU's topology is unknown.
pub(crate) fn physical_cores(
    cpus: &[u32],
    topology: impl Fn(u32, &str) -> Option<u32>,
) -> Option<usize> {
    let mut cores = BTreeSet::new();
    for &cpu in cpus {
        cores.insert((topology(cpu, "physical_package_id")?, topology(cpu, "core_id")?));
    }
    Some(cores.len())
}

/// The split of the process's cores between the llama.cpp contexts loaded at once. Cheap to
/// clone (clones share the count).
#[derive(Debug, Clone)]
pub(crate) struct CoreShare {
    cores: usize,
    /// Live contexts per model.
    live: Arc<Mutex<HashMap<ModelName, usize>>>,
}

/// One context's claim on its share; returning it (drop) frees the share for later loads.
#[derive(Debug)]
pub(crate) struct Claim {
    share: CoreShare,
    model: ModelName,
}

impl CoreShare {
    /// A split of `cores`.
    pub(crate) fn new(cores: usize) -> Self {
        Self { cores: cores.max(1), live: Arc::default() }
    }

    /// The cores being split.
    pub(crate) fn cores(&self) -> usize {
        self.cores
    }

    /// Claims a share for one of `replicas` contexts of `model`: the threads it should run.
    pub(crate) fn claim(&self, model: &ModelName, replicas: u32) -> (usize, Claim) {
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let others: usize = live.iter().filter(|(m, _)| *m != model).map(|(_, n)| n).sum();
        let sharing = others + (replicas as usize).max(1);
        *live.entry(model.clone()).or_default() += 1;
        let threads = (self.cores / sharing).max(1);
        (threads, Claim { share: self.clone(), model: model.clone() })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut live = self.share.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = live.get_mut(&self.model) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.model);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_affinity_list_is_parsed_with_ranges() {
        let status = "Name:\thangard\nCpus_allowed:\tff\nCpus_allowed_list:\t0-2,5,7-8\n";
        assert_eq!(allowed_cpus(status), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(allowed_cpus("Cpus_allowed_list:\t3\n"), Some(vec![3]));
        assert_eq!(allowed_cpus("Name: x\n"), None);
        assert_eq!(allowed_cpus("Cpus_allowed_list:\tx-2\n"), None);
    }

    #[test]
    fn smt_siblings_count_as_one_core() {
        // CPUs 0-3 on one package; 0/2 and 1/3 are SMT siblings of cores 0 and 1.
        let topology = |cpu: u32, what: &str| match what {
            "physical_package_id" => Some(0),
            _ => Some(cpu % 2),
        };
        assert_eq!(physical_cores(&[0, 1, 2, 3], topology), Some(2));
        assert_eq!(physical_cores(&[0, 2], topology), Some(1));
        assert_eq!(physical_cores(&[0], |_, _| None), None);
    }

    #[test]
    fn contexts_loaded_at_once_split_the_cores() {
        let share = CoreShare::new(8);
        let a = ModelName::new("a").unwrap();
        let b = ModelName::new("b").unwrap();
        // Two replicas of `a` take half each.
        let (t0, c0) = share.claim(&a, 2);
        let (t1, c1) = share.claim(&a, 2);
        assert_eq!((t0, t1), (4, 4));
        // `b` loads beside them: 8 / (2 + 1).
        let (tb, cb) = share.claim(&b, 1);
        assert_eq!(tb, 2);
        drop((c0, c1));
        // With `a` gone, `b`'s next replica shares with `b` alone.
        let (tb2, _cb2) = share.claim(&b, 2);
        assert_eq!(tb2, 4);
        drop(cb);
        // Never zero threads.
        let many = CoreShare::new(2);
        assert_eq!(many.claim(&a, 16).0, 1);
    }
}
