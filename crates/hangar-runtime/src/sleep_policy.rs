//! Which level a sleep uses, and what a sleeping model still holds.
//!
//! - **Level.** The lightest level every runtime of the model lists (the quickest wake),
//!   unless that level keeps the weights in host memory and the host has no room for them:
//!   then the next level that does not (vLLM's level 2, weights discarded and read again on
//!   waking). Room is the machine's available memory (`MemAvailable`) and, under a
//!   `ram_budget`, the budget less what loaded models hold there. The weights' size is the
//!   model files' size; where Hangar cannot see the files (a `vllm_model` hub id), the
//!   lightest level is used, as vLLM's own default is level 1.
//! - **Holdings.** A sleeping row says what the sleep gave back on the GPUs (measured: the
//!   GPUs' used memory across it), what the model still holds there as admission counts it,
//!   and on the host: a child's process tree is measured again after each sleep and wake
//!   (vLLM's level 1 moves the weights into it); an in-process model on the CPU asleep at
//!   `context` holds its weights without the KV cache.

use hangar_backend::SleepLevel;

use crate::entry::{ModelEntry, Slot};
use crate::manager::Manager;

/// Where a loaded model's runtimes reside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Serving, or ready to.
    Awake,
    /// Asleep: a request wakes them first.
    Asleep {
        /// How deeply.
        level: SleepLevel,
        /// Since when, Unix milliseconds.
        since_unix_ms: u64,
        /// GPU memory the sleep gave back, in MiB, measured (0 without GPU telemetry).
        gpu_freed_mib: u64,
        /// GPU memory it still holds, as admission counts it, in MiB.
        gpu_held_mib: u64,
    },
}

/// The level a sleep uses: the first of `levels` (every runtime's, lightest first) that
/// does not move `weights_mib` into host memory with less than that much `host_room_mib`;
/// `None` when none is left. Unknown weights or room do not rule a level out.
pub(crate) fn pick_level(
    levels: &[SleepLevel],
    weights_mib: Option<u64>,
    host_room_mib: Option<u64>,
) -> Option<SleepLevel> {
    levels.iter().copied().find(|&level| {
        let to_host = level == SleepLevel::WeightsToHost;
        !(to_host && matches!((weights_mib, host_room_mib), (Some(w), Some(room)) if w > room))
    })
}

/// Where `entry`'s runtimes in service reside; `None` unless some serve (loaded, or
/// unloading).
pub(crate) fn residency(entry: &ModelEntry, slot: &Slot) -> Option<Residency> {
    let serving = slot.phase.serving()?;
    Some(match &serving.asleep {
        None => Residency::Awake,
        Some(asleep) => Residency::Asleep {
            level: asleep.level,
            since_unix_ms: asleep.since_unix_ms,
            gpu_freed_mib: asleep.freed_mib,
            gpu_held_mib: crate::gpu::vram_held(entry, slot),
        },
    })
}

/// What a sleep of `entry`'s model would give back on its GPUs, in MiB, as best known (what
/// a demotion counts on): what its last sleep gave back, else by its engine's lightest
/// level: all it holds for vLLM's levels, its KV cache (the GGUF estimate) for `context`
/// (llama.cpp keeps the weights). 0 when it cannot sleep, sleeps already, or is not on a
/// GPU.
pub(crate) fn sleep_frees(entry: &ModelEntry, slot: &Slot) -> u64 {
    let awake = slot.phase.serving().is_some_and(|s| s.asleep.is_none());
    let level = slot.capabilities.sleep_levels.first().copied();
    let (true, Some(level)) = (awake, level) else { return 0 };
    let held = crate::gpu::vram_held(entry, slot);
    if let Some(freed) = slot.sleep_freed_mib {
        return freed.min(held);
    }
    match level {
        SleepLevel::Context => {
            let replicas = slot.phase.loaded_replicas().max(1);
            let estimate =
                crate::estimate::gguf_estimate(&entry.artifacts, &slot.effective, replicas);
            estimate.map_or(0, |e| e.kv_cache_mib * u64::from(replicas)).min(held)
        }
        SleepLevel::WeightsToHost | SleepLevel::WeightsDiscarded => held,
    }
}

/// The machine's available memory in MiB (`MemAvailable`), when `/proc/meminfo` tells.
fn available_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    crate::host::kib_field(&text, "MemAvailable:").map(|kib| kib / 1024)
}

impl Manager {
    /// The level `entry` sleeps at, of `levels` (its runtimes' common levels).
    pub(crate) fn sleep_level(
        &self,
        entry: &ModelEntry,
        levels: &[SleepLevel],
    ) -> Option<SleepLevel> {
        let (model, replicas, load_override) = {
            let slot = entry.lock();
            let replicas = slot.phase.loaded_replicas().max(1);
            (std::sync::Arc::clone(&slot.effective), replicas, slot.load_override.clone())
        };
        let weights = entry.artifacts.mib.map(|mib| mib * u64::from(replicas));
        // `host_places` counts the other loaded models; the model's own holding goes too.
        let budget_room = self.host_places(entry, &model, replicas, &load_override).map(|p| {
            let free = p.gpus.first().map_or(0, |g| g.free_mib);
            let slot = entry.lock();
            let own = crate::host::figure(entry, &slot, &model, replicas, &load_override);
            u64::try_from(free).unwrap_or(0).saturating_sub(own.map_or(0, |f| f.mib))
        });
        let room = match (budget_room, available_mib()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        pick_level(levels, weights, room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SleepLevel::{Context, WeightsDiscarded, WeightsToHost};

    #[test]
    fn the_lightest_level_unless_the_host_has_no_room_for_the_weights() {
        let vllm = [WeightsToHost, WeightsDiscarded];
        /// Levels, weights, host room, the level expected.
        type Row<'a> = (&'a [SleepLevel], Option<u64>, Option<u64>, Option<SleepLevel>);
        let rows: &[Row<'_>] = &[
            // Room enough: level 1, the quicker wake.
            (&vllm, Some(16_000), Some(64_000), Some(WeightsToHost)),
            (&vllm, Some(16_000), Some(16_000), Some(WeightsToHost)),
            // The host is short: level 2 discards the weights instead.
            (&vllm, Some(16_000), Some(15_999), Some(WeightsDiscarded)),
            (&vllm, Some(16_000), Some(0), Some(WeightsDiscarded)),
            // Unknown weights or room: vLLM's default, level 1.
            (&vllm, None, Some(0), Some(WeightsToHost)),
            (&vllm, Some(16_000), None, Some(WeightsToHost)),
            // A level that keeps the weights where they are needs no host room.
            (&[Context], Some(16_000), Some(0), Some(Context)),
            // Only level 1, and no room: no level.
            (&[WeightsToHost], Some(16_000), Some(100), None),
            (&[], Some(1), Some(100), None),
        ];
        for (i, &(levels, weights, room, expected)) in rows.iter().enumerate() {
            assert_eq!(pick_level(levels, weights, room), expected, "row {i}");
        }
    }
}
