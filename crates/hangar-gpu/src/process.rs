//! A process tree's GPU memory: [`process_tree`] finds a child engine and its descendants
//! (vLLM's engine core, a Python worker's own subprocesses), [`tree_memory`] adds up what
//! the GPUs say those processes hold.

use std::collections::{BTreeMap, BTreeSet};

use crate::GpuReading;

/// `root` and every live descendant of it, `root` first then ascending. Read from Linux's
/// `/proc/<pid>/stat` (each process's parent); just `[root]` elsewhere, or when `/proc`
/// cannot be read.
pub fn process_tree(root: u32) -> Vec<u32> {
    let parents = parents();
    let mut tree = vec![root];
    let mut found = BTreeSet::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in &parents {
            if ppid == parent && pid != root && found.insert(pid) {
                frontier.push(pid);
            }
        }
    }
    tree.extend(found);
    tree
}

/// `(pid, parent pid)` of every process `/proc` lists.
fn parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// GPU memory held by some processes, as the GPUs report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeMemory {
    /// Memory the processes hold on every GPU together, in MiB.
    pub mib: u64,
    /// The processes the GPUs list, ascending.
    pub pids: Vec<u32>,
    /// The GPUs they hold memory on, ascending.
    pub gpus: Vec<u32>,
    /// What they hold on each of those GPUs, in MiB, by GPU ascending: a placement's
    /// figure per GPU.
    pub per_gpu: Vec<(u32, u64)>,
}

/// What the processes `pids` hold on the GPUs of `readings`; `None` when no GPU lists any
/// of them with a figure (nothing on the GPUs yet, or a driver that does not say).
pub fn tree_memory(readings: &[GpuReading], pids: &[u32]) -> Option<TreeMemory> {
    let (mut mib, mut seen, mut per_gpu) = (0, BTreeSet::new(), BTreeMap::new());
    for gpu in readings {
        for process in gpu.processes.iter().filter(|p| pids.contains(&p.pid)) {
            if let Some(used) = process.used_mib {
                mib += used;
                seen.insert(process.pid);
                *per_gpu.entry(gpu.index).or_insert(0) += used;
            }
        }
    }
    (!seen.is_empty()).then(|| TreeMemory {
        mib,
        pids: seen.into_iter().collect(),
        gpus: per_gpu.keys().copied().collect(),
        per_gpu: per_gpu.into_iter().collect(),
    })
}

/// How much each GPU's used memory grew from `before` to `after`, in MiB, for the GPUs
/// whose use grew (by GPU ascending): a load's figure per GPU when nothing else loaded or
/// unloaded on those GPUs meanwhile. A GPU in only one of the readings counts nothing.
pub fn used_growth(before: &[GpuReading], after: &[GpuReading]) -> Vec<(u32, u64)> {
    let mut growth: Vec<(u32, u64)> = after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.index == a.index)?;
            let grew = a.used_mib.saturating_sub(b.used_mib);
            (grew > 0).then_some((a.index, grew))
        })
        .collect();
    growth.sort_unstable();
    growth
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuProcess;

    #[test]
    fn a_process_tree_holds_its_children_and_grandchildren_and_nothing_else() {
        // sh → sh → sleep, and a sleep outside the tree.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 30; true' & sleep 30; true"])
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let root = child.id();
        let mut tree = process_tree(root);
        for _ in 0..200 {
            if tree.len() >= 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            tree = process_tree(root);
        }
        let _ = (child.kill(), other.kill(), child.wait(), other.wait());
        assert_eq!(tree[0], root);
        assert_eq!(tree.len(), 4, "sh, sh, sleep, sleep: {tree:?}");
        assert!(!tree.contains(&other.id()) && !tree.contains(&std::process::id()));
    }

    #[test]
    fn tree_memory_adds_the_trees_processes_over_every_gpu() {
        let p = |pid, used_mib| GpuProcess { pid, used_mib };
        let gpu = |index, processes| GpuReading {
            index,
            name: "g".into(),
            used_mib: 0,
            total_mib: 1,
            processes,
        };
        let readings = [
            gpu(0, vec![p(10, Some(100)), p(11, Some(2000)), p(99, Some(7))]),
            gpu(1, vec![p(11, Some(300)), p(12, None)]),
            gpu(2, vec![p(98, Some(5))]),
        ];
        let tree = tree_memory(&readings, &[10, 11, 12]).unwrap();
        let per_gpu = vec![(0, 2100), (1, 300)];
        assert_eq!(tree, TreeMemory { mib: 2400, pids: vec![10, 11], gpus: vec![0, 1], per_gpu });
        assert_eq!(tree_memory(&readings, &[12, 13]), None);
    }

    #[test]
    fn used_growth_is_per_gpu_and_ignores_shrinking_or_unmatched_gpus() {
        let gpu = |index, used_mib| GpuReading {
            index,
            name: "g".into(),
            used_mib,
            total_mib: 16_000,
            processes: Vec::new(),
        };
        let before = [gpu(0, 1000), gpu(1, 5000), gpu(2, 300)];
        let after = [gpu(2, 900), gpu(1, 4000), gpu(0, 1000), gpu(3, 800)];
        assert_eq!(used_growth(&before, &after), [(2, 600)]);
        assert_eq!(used_growth(&after, &before), [(1, 1000)]);
        assert_eq!(used_growth(&[], &after), []);
    }
}
